"""engine.threads: the thread count follows the idle cores, never more than the usable ones."""

import threading
import time

import pytest
import torch

from engine.threads import apply_threads, choose_threads, idle_cores, usable_cores


def test_requested_count_is_capped_at_the_usable_cores():
    assert choose_threads(1) == 1
    assert choose_threads(10_000) == usable_cores()


def test_a_core_held_by_other_work_is_not_counted_as_idle():
    """Spin one busy thread in another process-level core: the measured idle count drops below usable."""
    if usable_cores() < 2:
        pytest.skip("one usable core: idle_cores() is 1 whatever the load")
    stop = threading.Event()

    def spin():  # pure-Python loop: holds one core (the GIL keeps it to one)
        while not stop.is_set():
            pass

    busy = threading.Thread(target=spin)
    busy.start()
    try:
        time.sleep(0.1)
        assert idle_cores(0.5) <= usable_cores() - 1
    finally:
        stop.set()
        busy.join()


def test_apply_sets_torch_threads():
    before = torch.get_num_threads()
    try:
        assert apply_threads(1) == 1 and torch.get_num_threads() == 1
        count = apply_threads(0)
        assert 1 <= count <= usable_cores() and torch.get_num_threads() == count
    finally:
        torch.set_num_threads(before)


def spinner():
    """Another process that keeps one core busy until it is killed."""
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def quiet_machine_or_skip():
    from engine.threads import MIN_SAMPLE_S, TAKE_BACK_SHARE, ThreadGovernor

    if usable_cores() < 2:
        pytest.skip("one usable core: there is no thread to give up or take back")
    probe = ThreadGovernor(1)
    time.sleep(MIN_SAMPLE_S + 0.1)
    others = probe.others_cores()
    if others is None or others >= TAKE_BACK_SHARE:
        pytest.skip(f"other work uses {others} cores here: a freed core cannot be shown")


def test_the_governor_gives_a_core_up_to_a_busy_process_and_takes_it_back_when_it_ends():
    from engine.threads import MIN_SAMPLE_S, ThreadGovernor

    quiet_machine_or_skip()
    before = torch.get_num_threads()
    torch.set_num_threads(usable_cores())
    try:
        governor = ThreadGovernor()
        busy = spinner()
        try:
            time.sleep(MIN_SAMPLE_S + 0.3)
            assert governor.step() == usable_cores() - 1 and torch.get_num_threads() == usable_cores() - 1
        finally:
            busy.kill()
            busy.wait()
        time.sleep(MIN_SAMPLE_S + 0.3)
        assert governor.step() == usable_cores() and torch.get_num_threads() == usable_cores()
        assert governor.changes == 2
        pinned = ThreadGovernor(1)
        time.sleep(MIN_SAMPLE_S + 0.1)
        assert pinned.step() == torch.get_num_threads()  # a count from the settings is never re-decided
    finally:
        torch.set_num_threads(before)


def test_a_read_that_starts_beside_a_busy_process_uses_both_cores_after_it_ends(smol):
    """A real prefill, one thread while another process spins, both within a few chunks of its end."""
    from engine.settings import CachePolicy
    from engine.threads import ThreadGovernor

    quiet_machine_or_skip()
    before = torch.get_num_threads()
    busy = spinner()
    try:
        time.sleep(0.5)
        torch.set_num_threads(apply_threads(0))  # what the session does when a read starts
        assert torch.get_num_threads() == usable_cores() - 1
        governor = ThreadGovernor()
        per_chunk, began = [], time.monotonic()

        def progress(done, total, elapsed):
            per_chunk.append((time.monotonic() - began, torch.get_num_threads()))
            if busy.poll() is None and time.monotonic() - began > 2.0:
                busy.kill()
                busy.wait()

        policy = CachePolicy(budget_tokens=256, window_tokens=64, residual_tokens=32, chunk_tokens=64)
        ids = torch.randint(100, 20_000, (64 * 120,), generator=torch.Generator().manual_seed(0))
        cache = smol.decoder.new_cache(policy, "compact")
        smol.decoder.prefill(ids, cache, progress=progress, governor=governor)
    finally:
        if busy.poll() is None:
            busy.kill()
            busy.wait()
        torch.set_num_threads(before)
    assert per_chunk[0][1] == usable_cores() - 1
    ended = next(i for i, (t, _) in enumerate(per_chunk) if t > 2.0)
    assert per_chunk[-1][1] == usable_cores(), per_chunk
    back = next(i for i, (_, n) in enumerate(per_chunk) if n == usable_cores())
    assert back > ended and per_chunk[back][0] - per_chunk[ended][0] < 3.0, per_chunk  # within a few chunks


def test_an_answer_that_starts_beside_a_busy_process_uses_both_cores_after_it_ends(smol, tmp_path):
    """A real answer: decoding starts on the cores left free, and takes the freed one back within a
    second or so of the other process ending (the governor is stepped between answer tokens)."""
    from engine.session import DocumentSession
    from engine.settings import CachePolicy, EngineSettings
    from engine.threads import TAKE_BACK_SHARE, ThreadGovernor

    quiet_machine_or_skip()
    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\n\n" + "The budget review meeting is on Tuesday at 10 in room 4. " * 20 + "\n")
    settings = EngineSettings(cache=CachePolicy(budget_tokens=512, window_tokens=128), prefix_cache=False,
                              max_new_tokens=400, draft_tokens=0)
    session = DocumentSession(smol, settings)
    session.open(str(doc))
    before = torch.get_num_threads()
    busy = spinner()
    pieces, began, since_end = [], time.monotonic(), []

    def on_text(piece):
        pieces.append((time.monotonic() - began, torch.get_num_threads()))
        if busy.poll() is None and time.monotonic() - began > 2.0:
            busy.kill()
            busy.wait()
            since_end.append(ThreadGovernor(1))  # measures what other processes use from here on

    try:
        time.sleep(0.5)
        torch.set_num_threads(apply_threads(0))  # what a read or a model load beside the busy process sets
        assert torch.get_num_threads() == usable_cores() - 1
        began = time.monotonic()
        answer = session.ask("Write a long story about the meeting, with every detail you can think of.",
                             on_text=on_text, max_new_tokens=400)
    finally:
        if busy.poll() is None:
            busy.kill()
            busy.wait()
        torch.set_num_threads(before)
        session.close()
    assert len(answer.token_ids) > 50, answer.text
    assert pieces[0][1] == usable_cores() - 1
    if pieces[-1][0] < 4.0:
        pytest.skip(f"the answer ended {pieces[-1][0]:.1f} s in: too soon to see the core taken back")
    others = since_end[0].others_cores()
    if others is None or others >= TAKE_BACK_SHARE:
        pytest.skip(f"other work used {others} cores after the busy process ended: no core was free to take back")
    assert pieces[-1][1] == usable_cores(), pieces
    back = next(t for t, n in pieces if n == usable_cores())
    assert 2.0 < back < 4.0, pieces  # within about a second of the busy process's end
