"""The `halaman` script: no arguments opens the desktop app; one argument naming a file or folder
opens the app on it (what "Open with Halaman" in a file manager runs: the desktop entry's
`Exec=halaman %f`); anything else is the headless CLI.

Lives in `app/` because it may start Qt; the engine's CLI (`engine.cli`) never imports it. Qt is
imported only when the window is really wanted, so `halaman ask ...` works without a display.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Entry point. Returns the process exit code."""
    argv = sys.argv[1:] if argv is None else argv
    missing = missing_document(argv)
    if missing is not None:  # a mistyped `halaman book.pdf`: argparse would list the commands instead
        print(f"halaman: {missing}: no such file or folder; check the path", file=sys.stderr)
        return 1
    document = document_argument(argv)
    if not argv or document is not None:
        try:
            from app.main import run
        except ImportError as exc:
            print(f"halaman: the desktop app is not available ({exc}); use `halaman ask PATH QUESTION`", file=sys.stderr)
            return 1
        return run([document]) if document is not None else run()
    from engine.cli import main as cli_main

    return cli_main(argv)


def document_argument(argv: list[str]) -> str | None:
    """The file or folder to open in the window when `argv` is just one that exists and is not one
    of the CLI's commands (a folder called `cache` in the current directory stays the command)."""
    name = _lone_path(argv)
    return name if name is not None and Path(name).exists() else None


def missing_document(argv: list[str]) -> str | None:
    """The one argument of `argv` when it reads as a file or folder (a name with a suffix or a path
    separator, not one of the CLI's commands) that does not exist; else None."""
    name = _lone_path(argv)
    if name is None or Path(name).exists():
        return None
    return name if Path(name).suffix or "/" in name or "\\" in name else None


def _lone_path(argv: list[str]) -> str | None:
    """`argv`'s one argument when it is neither an option nor one of the CLI's commands."""
    if len(argv) != 1 or argv[0].startswith("-"):
        return None
    from engine.cli import command_names

    return None if argv[0] in command_names() else argv[0]


if __name__ == "__main__":
    sys.exit(main())
