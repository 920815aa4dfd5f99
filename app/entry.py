"""The `halaman` script: no arguments opens the desktop app, anything else is the headless CLI.

Lives in `app/` because it may start Qt; the engine's CLI (`engine.cli`) never imports it. Qt is
imported only when the window is really wanted, so `halaman ask ...` works without a display.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point. Returns the process exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        try:
            from app.main import run
        except ImportError as exc:
            print(f"halaman: the desktop app is not available ({exc}); use `halaman ask PATH QUESTION`", file=sys.stderr)
            return 1
        return run()
    from engine.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
