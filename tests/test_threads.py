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
