"""Take the README's screenshot of the main window (a developer tool, not part of the app).

    QT_QPA_PLATFORM=xcb xvfb-run -a -s "-screen 0 1280x860x24" .venv/bin/python -m app.screenshot \\
        docs/screenshot-main-window.png --open resources/samples/kv-cache-primer.md \\
        --open "$HALAMAN_CORPUS"/pdf/P01_minimal-document.pdf --open "$HALAMAN_CORPUS"/pdf/P05_dmca.pdf \\
        --ask "What does Title II of the DMCA do?" --ask "Which page explains the safe harbors for online service providers?"

`$HALAMAN_CORPUS` is the test corpus (docs/CORPUS.md). That is how docs/screenshot-main-window.png
was taken (settings.toml with max_new_tokens = 64, on two busy CPU cores, hence the slow TTFT and
tokens/s in its footers).

Opens each document in turn (the last one stays open), asks the questions on the last one, waits
for the streamed answers, then grabs the window from the screen (a real X server under xvfb-run).
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
    args = parser.parse_args(argv)

    app = create_app()
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
            print(f"  waiting: job={current.name if current else None} live={window.live is not None} "
                  f"progress={window.progress.label.text()!r}", file=sys.stderr, flush=True)
        if window.client.busy or window.live is not None or window.opening is not None:
            QTimer.singleShot(300, step)
            return
        if window.banner.isVisible() and window.banner.kind == "error":
            print("error:", window.banner.text, file=sys.stderr)
            app.exit(2)
            return
        if not todo:
            QTimer.singleShot(800, shoot)
            return
        kind, value = todo.pop(0)
        print(f"{kind}: {value}", file=sys.stderr, flush=True)
        if kind == "open":
            window.open_path(str(Path(value).resolve()))
        else:
            window.conversation.question.setText(value)
            window.ask()
        QTimer.singleShot(500, step)

    def shoot() -> None:
        window.banner.hide()
        QApplication.processEvents()
        screen = window.screen()
        frame = window.frameGeometry()
        image = screen.grabWindow(0, frame.x(), frame.y(), frame.width(), frame.height())
        if image.isNull():
            image = window.grab()
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        ok = image.save(args.output)
        print(f"saved {args.output} ({image.width()}x{image.height()}, platform {app.platformName()})" if ok else "save failed",
              file=sys.stderr)
        window.close()
        app.exit(0 if ok else 1)

    QTimer.singleShot(500, step)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
