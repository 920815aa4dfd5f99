"""Take the README's screenshots: the main window, the first start, Settings › Model and Settings'
Advanced part (a developer tool, not part of the app).

    QT_QPA_PLATFORM=xcb xvfb-run -a -s "-screen 0 1280x860x24" .venv/bin/python -m app.screenshot \\
        docs/screenshot-main-window.png --open resources/samples/kv-cache-primer.md \\
        --open "$HALAMAN_CORPUS"/pdf/P01_minimal-document.pdf --open "$HALAMAN_CORPUS"/pdf/P05_dmca.pdf \\
        --ask "What does Title II of the DMCA do?" --ask "Which page explains the safe harbors for online service providers?"

`$HALAMAN_CORPUS` is the test corpus (docs/CORPUS.md). That is how docs/screenshot-main-window.png
was taken (settings.toml with max_new_tokens = 64, on two busy CPU cores, hence the slow TTFT and
tokens/s in its footers; the last one with QT_QPA_PLATFORM=offscreen instead of xvfb-run, which
that machine lacked: the window then paints itself into the image).

Opens each document in turn (the last one stays open), asks the questions on the last one, waits
for the streamed answers, then grabs the window from the screen (a real X server under xvfb-run).

`--show-source` then clicks the last answer's first attended source, so the source pane shows
that page with the attended passages highlighted. That is how docs/screenshot-source-pane.png was
taken: tests/test_app_source_pane.py's 24-page book (`book_pdf`) asked its question, with that
test's settings (budget 256, recall 512 tokens, float32 weights) in settings.toml, offscreen.

`--keep-banner` keeps the banner in the picture (else hidden, as a message of the moment). With no
`--open` and a fresh HALAMAN_HOME that is the first start: the built-in model loads and the banner
says, once, that it is a small demo, with Choose a model…. That is how docs/screenshot-first-run.png
was taken (offscreen, on two busy CPU cores):

    HALAMAN_HOME=$(mktemp -d) QT_QPA_PLATFORM=offscreen .venv/bin/python -m app.screenshot \\
        docs/screenshot-first-run.png --keep-banner

`--settings-advanced` grabs the settings dialog with its Advanced part (how the KV cache is kept)
opened and scrolled into view; docs/screenshot-settings-advanced.png was taken so, with a fresh
HALAMAN_HOME and `--size 1000x760`.

`--settings-model` takes the README's screenshot of Settings › Model instead: the settings dialog
alone (no main window, no model loaded), with the model list's sizes and "fits" for this machine,
or for a GPU of `--gpu-gib` GiB. With `--download ID` it presses Download on that list entry and
grabs the dialog once the download passed `--at` of its bytes (progress, speed and time left
showing), then cancels it. That is how docs/screenshot-models.png was taken: against the demo hub
sending slowly, with a fresh HALAMAN_HOME (nothing downloaded yet, default settings), the list
fitted to a 4 GiB GPU, and Qt's offscreen platform because that machine had no xvfb-run (the
dialog paints itself into the image; under xvfb-run it is grabbed from the screen):

    .venv/bin/python tests/hub_server.py --slow 4 &
    HF_ENDPOINT=http://127.0.0.1:8765 HALAMAN_HOME=$(mktemp -d) QT_QPA_PLATFORM=offscreen \\
        .venv/bin/python -m app.screenshot docs/screenshot-models.png --settings-model --gpu-gib 4 \\
        --size 1000x1040 --download smollm2-135m --at 0.35
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.main import create_app
from app.window import MainWindow


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("output")
    parser.add_argument("--open", action="append", default=[], help="a document to open (repeatable)")
    parser.add_argument("--ask", action="append", default=[], help="a question about the last document (repeatable)")
    parser.add_argument("--size", default="1240x800")
    parser.add_argument("--show-source", action="store_true",
                        help="after the answers, click the last answer's first attended source (the source pane)")
    parser.add_argument("--keep-banner", action="store_true", help="keep the banner (the first start's demo notice) in the picture")
    parser.add_argument("--settings-model", action="store_true", help="grab Settings › Model (the dialog alone) instead")
    parser.add_argument("--settings-advanced", action="store_true",
                        help="grab the settings dialog with its Advanced part opened instead")
    parser.add_argument("--download", metavar="ID", help="with --settings-model: download this list entry and grab mid-way")
    parser.add_argument("--at", type=float, default=0.4, help="with --download: grab once this share of the bytes arrived")
    parser.add_argument("--gpu-gib", type=float, help="with --settings-model: fit the list to a GPU of this many GiB, "
                                                       "not this machine")
    args = parser.parse_args(argv)

    app = create_app()
    if args.settings_model or args.settings_advanced:
        size = None if args.size == parser.get_default("size") else tuple(int(v) for v in args.size.split("x"))
        return settings_model(app, args.output, args.download, args.at, args.gpu_gib, size, advanced=args.settings_advanced)
    window = MainWindow()
    width, height = (int(v) for v in args.size.split("x"))
    window.resize(width, height)
    window.move(0, 0)
    window.show()
    todo: list[tuple[str, str]] = [("open", p) for p in args.open] + [("ask", q) for q in args.ask]

    waited = [0]

    def step() -> None:
        waited[0] += 1
        if waited[0] % 20 == 0:
            current = window.client.current
            print(f"  waiting: job={current.name if current else None} live={window.state.live is not None} "
                  f"progress={window.progress.label.text()!r}", file=sys.stderr, flush=True)
        if window.client.busy or window.state.live is not None or window.state.opening is not None:
            QTimer.singleShot(300, step)
            return
        if window.banner.isVisible() and window.banner.kind == "error":
            print("error:", window.banner.text, file=sys.stderr)
            app.exit(2)
            return
        if not todo:
            if args.show_source and window.state.open_id is not None:
                last = window.library.messages(window.state.open_id)[-1]
                if last.sources:
                    window.show_citation(last.sources[0].label, last.id)
            QTimer.singleShot(800, shoot)
            return
        kind, value = todo.pop(0)
        print(f"{kind}: {value}", file=sys.stderr, flush=True)
        if kind == "open":
            window.open_path(str(Path(value).resolve()))
        else:
            window.conversation.question.setText(value)
            window.asker.ask()
        QTimer.singleShot(500, step)

    def shoot() -> None:
        if not args.keep_banner:
            window.banner.hide()
        ok = save_picture(app, window, args.output)
        window.close()
        app.exit(0 if ok else 1)

    QTimer.singleShot(500, step)
    return app.exec()


def save_picture(app: QApplication, widget, output: str) -> bool:
    """Save `widget` as it is on the screen (frame included) to `output`; where nothing is on a
    screen (the offscreen platform), the widget paints itself instead."""
    QApplication.processEvents()
    image = None
    if app.platformName() != "offscreen":
        frame = widget.frameGeometry()
        image = widget.screen().grabWindow(0, frame.x(), frame.y(), frame.width(), frame.height())
    if image is None or image.isNull():
        image = widget.grab()
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    ok = image.save(output)
    print(f"saved {output} ({image.width()}x{image.height()}, platform {app.platformName()})" if ok else "save failed",
          file=sys.stderr)
    return ok


def settings_model(app: QApplication, output: str, download: str | None, at: float, gpu_gib: float | None,
                   size: tuple[int, int] | None, *, advanced: bool = False) -> int:
    """Show the settings dialog on its own (at `size`, else the size it opens at), fitting the model
    list to this machine or a GPU of `gpu_gib` GiB, optionally start a download from the list, or
    open its `advanced` part (scrolled into view), and save a picture of it to `output` (see the
    module docstring)."""
    from app.settings_dialog import SettingsDialog
    from engine.models.catalog import DeviceMemory, find
    from engine.settings import load_settings

    memory = DeviceMemory("cuda", "GPU", int(gpu_gib * 1024**3), 2) if gpu_gib else None
    dialog = SettingsDialog(load_settings(), memory=memory)
    if size:
        dialog.resize(*size)  # else the size it opens at: its content's, within the screen
    dialog.move(0, 0)
    dialog.show()
    models = dialog.model_list
    result = [1]

    def shoot() -> None:
        result[0] = 0 if save_picture(app, dialog, output) else 1
        models.cancel()  # a running download stops; what arrived stays in HALAMAN_HOME
        QTimer.singleShot(500, app.quit)

    if advanced:
        dialog.cache.advanced_toggle.setChecked(True)
        # Once the opened part is laid out: before, the scroll area does not know where it is.
        QTimer.singleShot(300, lambda: dialog.scroll.ensureWidgetVisible(dialog.cache.advanced))
    if download is None:
        QTimer.singleShot(800, shoot)
    else:
        models.select(find(models.models, download).repo)
        shot = []

        def progress(event) -> None:
            if event.fraction >= at and not shot:
                shot.append(event)
                QTimer.singleShot(300, shoot)  # let the status line show it first

        def failed(message: str) -> None:
            if not shot:  # after the picture, this is the cancel
                print("download failed:", message, file=sys.stderr)
                app.exit(2)

        models.relay.progress.connect(progress)
        models.relay.failed.connect(failed)
        QTimer.singleShot(500, models.download_button.click)
    app.exec()
    dialog.close()
    return result[0]


if __name__ == "__main__":
    sys.exit(main())
