"""Downloading a model: against a local imitation of the hub (tests/hub_server.py), never the network.

A tiny random Llama (2 layers, hidden 64, the embedded model's tokenizer) is served as "tiny/llama";
the tests pull it with progress, cancel and resume it, catch a damaged and a cut-off file, and then
load it through the normal loader and ask it a question from the command line. The demo hub
(`python tests/hub_server.py`) serves real weights: the list's SmolLM2-135M, downloaded from it,
answers token for token as the embedded model does.
"""

from __future__ import annotations

import re

import threading

import pytest

from engine.cli import main
from engine.errors import Cancelled, ModelError
from engine.models.download import COMPLETE_MARKER, PART_SUFFIX, downloaded_folder, model_folder, partial_bytes, pull
from engine.settings import CachePolicy, EngineSettings, load_settings
from hub_server import COMMIT, SMOLLM2_REPO, TINY_REPO, hub, serve_demo, tiny_llama  # noqa: F401 - fixtures

REPO = TINY_REPO
WEIGHTS = "model.safetensors"


def test_pull_reports_progress_and_verifies_every_file(hub, tiny_llama):
    events = []
    folder = pull(REPO, progress=events.append)
    assert folder == model_folder(REPO) == downloaded_folder(REPO)
    for source in tiny_llama.iterdir():
        assert (folder / source.name).read_bytes() == source.read_bytes()
    total = sum(p.stat().st_size for p in tiny_llama.iterdir())
    assert events[-1].done_bytes == events[-1].total_bytes == total
    assert all(a.done_bytes <= b.done_bytes for a, b in zip(events, events[1:]))
    assert {e.file for e in events} >= {WEIGHTS}
    # each file is announced as being verified once it has all its bytes, before the next begins
    checked = [e for e in events if e.verifying]
    assert {e.file for e in checked} == {p.name for p in tiny_llama.iterdir()}
    assert events[-1].verifying is False and "verifying" in checked[0].summary()
    assert (folder / COMPLETE_MARKER).is_file() and not list(folder.glob("*" + PART_SUFFIX))
    # every file came from the commit the model info named
    assert all(COMMIT in path for method, path, _ in hub.log if method == "GET" and "/resolve/" in path)


def test_cancel_keeps_the_partial_and_the_next_pull_asks_only_for_the_rest(hub, tiny_llama):
    hub.chunk_delay_s = 0.002  # 64 KiB chunks over ~12 MiB: time to cancel mid-file
    cancel = threading.Event()
    seen = []

    # 2 MB into the weights (done_bytes counts every file: the smaller ones come first, and a report
    # as the weights begin already holds them)
    before_weights = sum(p.stat().st_size for p in tiny_llama.iterdir() if p.name != WEIGHTS)

    def progress(event):
        seen.append(event)
        if event.file == WEIGHTS and event.done_bytes > before_weights + 2_000_000:
            cancel.set()

    with pytest.raises(Cancelled):
        pull(REPO, progress=progress, cancel=cancel)
    part = model_folder(REPO) / (WEIGHTS + PART_SUFFIX)
    have = part.stat().st_size
    assert 0 < have < (tiny_llama / WEIGHTS).stat().st_size
    assert downloaded_folder(REPO) is None and partial_bytes(REPO) >= have
    assert any(e.speed_bytes_per_s > 0 and e.eta_s is not None for e in seen)

    hub.chunk_delay_s = 0.0
    folder = pull(REPO)
    assert (folder / WEIGHTS).read_bytes() == (tiny_llama / WEIGHTS).read_bytes()
    ranges = [rng for method, path, rng in hub.log if method == "GET" and path.endswith(WEIGHTS)]
    assert ranges == [None, f"bytes={have}-"]


def test_a_damaged_file_is_detected_deleted_and_fetched_afresh(hub, tiny_llama):
    good = (tiny_llama / WEIGHTS).read_bytes()
    hub.damaged[WEIGHTS] = good[:1000] + bytes([good[1000] ^ 0xFF]) + good[1001:]  # same size, one byte flipped
    with pytest.raises(ModelError, match="damaged"):
        pull(REPO)
    folder = model_folder(REPO)
    assert not (folder / WEIGHTS).exists() and not (folder / (WEIGHTS + PART_SUFFIX)).exists()
    assert downloaded_folder(REPO) is None
    hub.damaged.clear()
    assert (pull(REPO) / WEIGHTS).read_bytes() == good


def test_a_cut_connection_keeps_what_arrived_and_resumes(hub, tiny_llama):
    hub.cut_after[WEIGHTS] = 1_000_000
    with pytest.raises(ModelError, match="pull again to resume"):
        pull(REPO)
    assert (model_folder(REPO) / (WEIGHTS + PART_SUFFIX)).stat().st_size == 1_000_000
    hub.cut_after.clear()
    assert (pull(REPO) / WEIGHTS).read_bytes() == (tiny_llama / WEIGHTS).read_bytes()
    assert [rng for m, p, rng in hub.log if m == "GET" and p.endswith(WEIGHTS)][-1] == "bytes=1000000-"


def test_gated_unknown_and_offline_say_what_to_do(hub, monkeypatch):
    import huggingface_hub.constants

    with pytest.raises(ModelError, match="accept its licence.*hf auth login"):
        pull("gated/model")
    # the local hub is named, so an HF_ENDPOINT left set is not taken for a missing model or network
    with pytest.raises(ModelError, match=rf"not found on the hub at {re.escape(hub.url)} \(HF_ENDPOINT\)"):
        pull("nobody/nothing")
    with pytest.raises(ModelError, match=r"could not reach the hub at http://127\.0\.0\.1:9 \(HF_ENDPOINT\)"):
        pull("nobody/nothing", endpoint="http://127.0.0.1:9")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError, match="HF_HUB_OFFLINE"):
        pull(REPO)


def test_the_fake_hub_answers_huggingface_hubs_own_download(hub, tiny_llama):
    """The imitation is faithful enough for huggingface_hub itself (HEAD metadata, then GET)."""
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(REPO, WEIGHTS, endpoint=hub.url, cache_dir=str(hub_cache := (tiny_llama.parent / "hfc")))
    assert open(path, "rb").read() == (tiny_llama / WEIGHTS).read_bytes()
    assert any(method == "HEAD" for method, _, _ in hub.log) and hub_cache.is_dir()


def test_cli_pulls_uses_and_answers_with_the_downloaded_model(hub, tmp_path, capsys, monkeypatch):
    assert main(["models", "pull", REPO]) == 0
    out = capsys.readouterr()
    assert f"{REPO} is in {model_folder(REPO)}" in out.out and "of" in out.err and "100%" in out.err

    assert main(["models", "use", REPO]) == 0
    assert load_settings().model == REPO

    # the hub is gone: the model loads from the downloaded folder through the normal loader
    hub.close()
    document = tmp_path / "note.txt"
    document.write_text("The meeting is on Tuesday at the harbour office. Bring the signed forms.\n" * 4)
    code = main(["ask", str(document), "When is the meeting?", "--device", "cpu", "--max-new-tokens", "4",
                 "--no-prefix-cache", "--budget", "256", "--window", "64", "--residual", "32"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert f"Model: {REPO} on cpu" in out.err and "decode" in out.out


def test_cli_lists_the_models_with_what_fits(hub, capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for model_id in ("smollm2-360m", "qwen2.5-1.5b", "llama-3.2-3b", "qwen3-4b"):
        assert model_id in out
    assert "needs" in out and (" yes " in out or " no " in out)
    # each row says whether it has the bfloat16 reading copy: only small models on a CPU with AVX-512 BF16
    from engine.models.catalog import detect_memory
    rows = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in ("smollm2-135m", "qwen2.5-1.5b")}
    assert "+ reading copy" not in rows["qwen2.5-1.5b"]
    assert ("+ reading copy" in rows["smollm2-135m"]) == detect_memory("cpu").bf16_matmuls
    assert main(["models", "pull", "no-such-model"]) == 1
    assert "pick one of" in capsys.readouterr().err


def test_the_demo_hubs_smollm2_downloads_loads_and_answers_as_the_embedded_model(smol, tmp_path, monkeypatch):
    """The list's smollm2-135m from the demo hub, started as `python tests/hub_server.py` starts it
    (here on a free port): every file verified, loaded by the loader from the download folder, and
    the same greedy answer as the embedded model's. The hub serves the embedded GGUF as the
    loader converts it, so the weights are the same float32 numbers: identical tokens, not close."""
    import huggingface_hub.constants

    from engine.cli_models import repo_for
    from engine.models.loader import load_model
    from engine.session import DocumentSession

    demo = serve_demo(0, workdir=tmp_path / "demo")  # converts with the session's HALAMAN_HOME (done once)
    try:
        monkeypatch.setenv("HF_ENDPOINT", demo.url)
        monkeypatch.setenv("HALAMAN_HOME", str(tmp_path / "home"))  # the download goes here
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # 127.0.0.1 only
        repo = repo_for("smollm2-135m")
        assert repo == SMOLLM2_REPO
        events = []
        folder = pull(repo, progress=events.append)
    finally:
        demo.close()
    served = demo.repos[SMOLLM2_REPO]
    assert folder == downloaded_folder(repo) and folder.is_relative_to(tmp_path / "home")
    assert {p.name: p.stat().st_size for p in folder.iterdir() if not p.name.startswith(".")} == \
        {name: file.size for name, file in served.items()}
    assert set(served) >= {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert events[-1].done_bytes == events[-1].total_bytes == sum(f.size for f in served.values())
    assert all(method in ("GET", "HEAD") and (path.startswith("/api/") or COMMIT in path) for method, path, _ in demo.log)

    downloaded = load_model(repo, device="cpu", weights="full")  # the hub is gone: resolves to the download folder; smol's weights
    assert downloaded.label == repo and downloaded.profile == smol.profile and downloaded.weights == smol.weights
    document = tmp_path / "note.txt"
    document.write_text("The meeting is on Tuesday at 10 in room 4 of the harbour office. Bring the signed forms.\n" * 3)
    settings = EngineSettings(cache=CachePolicy(budget_tokens=256, window_tokens=64, residual_tokens=32, chunk_tokens=128),
                              max_new_tokens=12)
    answers = []
    for model in (smol, downloaded):
        session = DocumentSession(model, settings)
        session.open(str(document))
        answers.append(session.ask("Where is the meeting?").token_ids)
    assert len(answers[0]) >= 4 and answers[0] == answers[1]


# ------------------------------------------------------------ issue 45.2: what a hub cannot vouch for
def test_a_zero_filled_weights_file_without_hashes_is_refused_not_marked_complete(hub, tiny_llama, capsys):
    """The hub gives sizes but no hashes: a zero-filled model.safetensors of the right size was
    marked complete, and every `ask --model` then ended in a SafetensorError traceback."""
    hub.info_without = "hashes"
    hub.damaged[WEIGHTS] = bytes((tiny_llama / WEIGHTS).stat().st_size)
    with pytest.raises(ModelError, match=r"model\.safetensors is not a safetensors file.*zero-filled.*deleted"):
        pull(REPO)
    folder = model_folder(REPO)
    assert downloaded_folder(REPO) is None and not (folder / WEIGHTS).exists()
    assert not (folder / (WEIGHTS + PART_SUFFIX)).exists()  # deleted: the next pull starts afresh
    assert main(["models", "pull", REPO]) == 1
    err = capsys.readouterr().err
    assert "not a safetensors file" in err and "Traceback" not in err and "SafetensorError" not in err
    hub.damaged.clear()
    assert (pull(REPO) / WEIGHTS).read_bytes() == (tiny_llama / WEIGHTS).read_bytes()


def test_a_truncated_tensor_section_is_refused_even_when_its_size_is_the_hubs(hub, tiny_llama):
    """Right size, valid header, but the header promises more tensor bytes than the file has."""
    import json
    import struct

    good = (tiny_llama / WEIGHTS).read_bytes()
    n = struct.unpack("<Q", good[:8])[0]
    header = json.loads(good[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = [d * 2 for d in header[name]["shape"]]  # twice the elements, same offsets
    raw = json.dumps(header, separators=(",", ":")).encode()
    assert len(raw) <= n  # fits the header's room (padding with spaces, as the spec allows)
    bad = good[:8] + raw.ljust(n) + good[8 + n:]
    hub.info_without = "hashes"
    hub.damaged[WEIGHTS] = bad
    with pytest.raises(ModelError, match="does not match its bytes"):
        pull(REPO)
    assert downloaded_folder(REPO) is None


def test_a_mirror_without_sizes_downloads_and_verifies(hub, tiny_llama, capsys):
    """The model info has no sizes (some mirrors): every pull ended in a FileNotFoundError
    traceback (`_verify` of a part never fetched)."""
    hub.info_without = "sizes"
    folder = pull(REPO)
    assert folder == downloaded_folder(REPO)
    for source in tiny_llama.iterdir():
        assert (folder / source.name).read_bytes() == source.read_bytes()
    # and a cut connection is still caught with the size the server announced
    hub2_weights = folder / WEIGHTS
    hub2_weights.unlink()
    (folder / COMPLETE_MARKER).unlink()
    hub.cut_after[WEIGHTS] = 1_000_000
    assert main(["models", "pull", REPO]) == 1
    err = capsys.readouterr().err
    assert "pull again to resume" in err and "Traceback" not in err
    hub.cut_after.clear()
    assert (pull(REPO) / WEIGHTS).read_bytes() == (tiny_llama / WEIGHTS).read_bytes()


@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", "application/octet-stream"])
def test_a_login_page_in_place_of_the_weights_is_called_a_web_page(hub, tiny_llama, capsys, content_type):
    """A captive portal answers 200 OK with its login page: it was taken for a dropped connection
    ("pull again to resume", forever). Whether or not it says text/html, nothing of it is kept."""
    hub.web_page[WEIGHTS] = b"<!DOCTYPE html><html><head><title>Sign in to Hotel Wi-Fi</title></head><body>...</body></html>"
    hub.web_page_type = content_type
    assert main(["models", "pull", REPO]) == 1
    err = capsys.readouterr().err
    assert "the server sent a web page instead of the model file model.safetensors: are you behind a login page" in err
    assert "resume" not in err and "Traceback" not in err
    folder = model_folder(REPO)
    assert not (folder / WEIGHTS).exists() and not (folder / (WEIGHTS + PART_SUFFIX)).exists()
    hub.web_page.clear()
    assert (pull(REPO) / WEIGHTS).read_bytes() == (tiny_llama / WEIGHTS).read_bytes()


def test_weights_that_disagree_with_config_json_are_not_marked_complete(hub, tiny_llama):
    """Checked against config.json where cheap: the embedding's [vocab_size, hidden_size]."""
    config = (tiny_llama / "config.json").read_bytes()
    vocab = re.search(rb'"vocab_size": (\d+)', config).group(1)
    other = str(int(vocab) + 1).encode()
    assert len(other) == len(vocab)
    hub.info_without = "hashes"
    hub.damaged["config.json"] = config.replace(b'"vocab_size": ' + vocab, b'"vocab_size": ' + other)
    with pytest.raises(ModelError, match=r"embedding is \[\d+, 64\] but config.json says"):
        pull(REPO)
    assert downloaded_folder(REPO) is None


def test_a_folder_marked_complete_by_an_older_halaman_with_bad_weights_fails_in_one_line(hub, tiny_llama, tmp_path, capsys):
    folder = pull(REPO)
    size = (folder / WEIGHTS).stat().st_size
    (folder / WEIGHTS).write_bytes(bytes(size))
    document = tmp_path / "note.txt"
    document.write_text("The meeting is on Tuesday.\n")
    hub.close()
    assert main(["ask", str(document), "When?", "--model", REPO, "--device", "cpu", "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert "model.safetensors" in err and "not a safetensors file" in err
    assert "Traceback" not in err and "SafetensorError" not in err


def test_a_missing_layer_is_caught_against_config_json(hub, tiny_llama):
    """config.json names three layers; the weights hold two (a shard left out)."""
    config = (tiny_llama / "config.json").read_bytes()
    assert b'"num_hidden_layers": 2' in config
    hub.info_without = "hashes"
    hub.damaged["config.json"] = config.replace(b'"num_hidden_layers": 2', b'"num_hidden_layers": 3')
    with pytest.raises(ModelError, match=r"the weights hold 2 of the 3 layers config.json names"):
        pull(REPO)
    assert downloaded_folder(REPO) is None


def test_a_broken_safetensors_start_is_named_for_what_it_looks_like(tmp_path):
    """The header-length check guessed "an empty or zero-filled file?" for every file it refused,
    random bytes and a file cut short included."""
    import os
    import struct

    from engine.models.verify import safetensors_shapes

    cases = {"zeros": bytes(4096), "random": os.urandom(4096),
             "cut short": struct.pack("<Q", 3000) + b"{" + b" " * 1000}
    guesses = {"zeros": "zero-filled", "random": "another format, or random bytes", "cut short": "a file cut short"}
    for case, data in cases.items():
        path = tmp_path / f"{case}.safetensors"
        path.write_bytes(data)
        with pytest.raises(ModelError) as caught:
            safetensors_shapes(path, path.name)
        assert guesses[case] in str(caught.value), (case, str(caught.value))
        assert all(other not in str(caught.value) for key, other in guesses.items() if key != case)
