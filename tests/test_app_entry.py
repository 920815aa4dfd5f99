"""`halaman` with no arguments opens the window and loads the real default model (the real load path,
not the test fixture's), in a separate process on the offscreen platform."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("PySide6")

REPO = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication
    import app.main
    from app.entry import main

    application = app.main.create_app()
    began = time.monotonic()

    def check():
        windows = [w for w in QApplication.topLevelWidgets() if type(w).__name__ == "MainWindow"]
        if windows and windows[0].client.model is not None and not windows[0].client.busy:
            w = windows[0]
            print("WINDOW", w.isVisible(), w.windowTitle(), flush=True)
            print("MODEL", w.client.model.label, w.client.model.device, w.client.model.weight_bytes, flush=True)
            print("STATUS", w.model_status.text(), flush=True)
            print("GAUGE", w.gauge.report is not None and w.gauge.report.weights_bytes == w.client.model.weight_bytes, flush=True)
            w.close()
        elif time.monotonic() - began > 240:
            print("TIMEOUT", flush=True)
            application.exit(3)
        else:
            QTimer.singleShot(200, check)

    QTimer.singleShot(200, check)
    sys.exit(main([]))
    """
)


def test_halaman_without_arguments_opens_the_window_on_the_default_model(tmp_path):
    shared_cache = Path(os.environ["HALAMAN_HOME"]) / "cache"
    home = tmp_path / "home"
    (home / "cache").mkdir(parents=True)
    if (shared_cache / "models").is_dir():  # reuse the one-time GGUF conversion (~20 s) of this machine
        (home / "cache" / "models").symlink_to(shared_cache / "models", target_is_directory=True)
        if (shared_cache / "file-hashes.json").exists():
            shutil.copy(shared_cache / "file-hashes.json", home / "cache" / "file-hashes.json")
    env = {**os.environ, "HALAMAN_HOME": str(home), "QT_QPA_PLATFORM": "offscreen", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    lines = {line.split(" ", 1)[0]: line for line in out.stdout.splitlines() if line.split(" ", 1)[0].isupper()}
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert lines["WINDOW"].startswith("WINDOW True Halaman"), out.stdout
    assert "SmolLM2" in lines["MODEL"] and " cpu " in lines["MODEL"], out.stdout
    assert "loaded in" in lines["STATUS"] and lines["GAUGE"] == "GAUGE True"
    assert "Traceback" not in out.stderr
    assert (home / "data" / "library.sqlite").exists()  # the library was created in the data dir


def test_entry_point_hands_no_arguments_to_the_app_and_the_rest_to_the_cli(monkeypatch, capsys):
    import app.main
    from app.entry import main

    calls = []
    monkeypatch.setattr(app.main, "run", lambda: calls.append("run") or 7)
    assert main([]) == 7 and calls == ["run"]
    assert main(["estimate", "--model", "smollm2-135m", "--tokens", "1000"]) == 0
    assert "full FP16 cache" in capsys.readouterr().out and calls == ["run"]


def test_one_existing_path_opens_the_window_on_it_and_commands_stay_commands(monkeypatch, tmp_path):
    """`halaman PATH` is what "Open with Halaman" runs (the desktop entry's `Exec=halaman %f`)."""
    import app.main
    from app.entry import document_argument, main

    calls = []
    monkeypatch.setattr(app.main, "run", lambda paths=None: calls.append(paths) or 0)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "book.pdf").write_bytes(b"%PDF-1.7\n")
    (tmp_path / "cache").mkdir()  # a folder named like a CLI command
    assert main(["book.pdf"]) == 0 and calls == [["book.pdf"]]
    assert document_argument([str(tmp_path)]) == str(tmp_path)  # a folder: read as a repository
    assert document_argument(["cache"]) is None and document_argument(["missing.pdf"]) is None
    assert document_argument(["book.pdf", "book.pdf"]) is None and document_argument(["--self-test"]) is None


def test_a_mistyped_document_says_no_such_file_and_a_mistyped_command_stays_the_clis(monkeypatch, tmp_path, capsys):
    import app.main
    from app.entry import main

    monkeypatch.setattr(app.main, "run", lambda paths=None: pytest.fail("no window for a missing file"))
    monkeypatch.chdir(tmp_path)
    for name in ("boook.pdf", "papers/missing", str(tmp_path / "gone.docx")):
        assert main([name]) == 1
        assert capsys.readouterr().err.strip() == f"halaman: {name}: no such file or folder; check the path"
    with pytest.raises(SystemExit):  # a word without a suffix is a command, mistyped: argparse lists them
        main(["aks"])
    assert "invalid choice: 'aks'" in capsys.readouterr().err


OPEN_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication
    import app.main
    from app.entry import main

    application = app.main.create_app()

    def check():
        window = next(w for w in QApplication.topLevelWidgets() if type(w).__name__ == "MainWindow")
        print("TITLE", window.windowTitle(), flush=True)
        print("OPENING", window.state.opening, flush=True)
        window.close()

    QTimer.singleShot(500, check)
    sys.exit(main([sys.argv[1]]))
    """
)


def test_halaman_with_a_document_opens_the_window_reading_it(tmp_path):
    """The real window, started as the desktop starts it: the document is being read at once (it
    queues behind the model load, which this test does not wait for)."""
    document = REPO / "resources" / "samples" / "kv-cache-primer.md"
    env = {**os.environ, "HALAMAN_HOME": str(tmp_path / "home"), "QT_QPA_PLATFORM": "offscreen", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", OPEN_SCRIPT, str(document)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "TITLE Halaman — kv-cache-primer.md" in out.stdout
    assert f"OPENING {document.resolve()}" in out.stdout
    assert "window open on" in (tmp_path / "home" / "data" / "logs" / "halaman.log").read_text()


def test_without_a_display_it_says_what_to_do_instead_of_crashing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env["HALAMAN_HOME"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", "import sys; from app.entry import main; sys.exit(main([]))"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "no display" in out.stderr and "halaman ask" in out.stderr and "Traceback" not in out.stderr
