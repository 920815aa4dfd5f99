"""The launcher's command line (installer/launch.py calls `main`).

    launch.py install [--prefix DIR] [--bin-dir DIR | --no-bin-link] [--no-desktop] [--torch auto|cpu|cuda] [--prepare-now]
    launch.py run [HALAMAN ARGS...]     bin/halaman: prepare if needed, then start Halaman
    launch.py prepare [--torch ...]     bin/halaman-setup: run the preparation again (e.g. after a GPU driver update)
    launch.py status                    what is installed and prepared
    launch.py uninstall [--yes | --keep-data]   bin/halaman-uninstall
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from halaman_launcher.layout import Layout, default_bin_dir, default_prefix, format_size, read_json

HERE = Path(__file__).resolve().parent.parent  # the unpacked release, or <prefix>/lib once installed


def installed_layout() -> Layout:
    layout = Layout(HERE.parent)
    if not layout.manifest.exists():
        sys.exit(f"halaman launcher: not an installed copy ({layout.manifest} is missing); "
                 f"install first: {HERE / 'launch.py'} install")
    return layout


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"]:  # everything after `run` belongs to halaman, unparsed
        from halaman_launcher.run import run

        return run(installed_layout(), argv[1:])
    parser = argparse.ArgumentParser(prog="halaman launcher", description="Install, set up and start Halaman.")
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install", help="install this release for the current user")
    install.add_argument("--prefix", type=Path, default=None, help=f"where to install (default {default_prefix()})")
    links = install.add_mutually_exclusive_group()
    links.add_argument("--bin-dir", type=Path, default=None, help=f"where to link the `halaman` command (default {default_bin_dir()})")
    links.add_argument("--no-bin-link", action="store_true", help="do not link the `halaman` command")
    install.add_argument("--no-desktop", action="store_true", help="no menu entry / Start-menu shortcut")
    install.add_argument("--torch", choices=("auto", "cpu", "cuda"), default="auto",
                         help="torch build: auto (CUDA when an NVIDIA GPU is usable), cpu or cuda")
    install.add_argument("--prepare-now", action="store_true", help="set up the environment now instead of on first start")
    prep = sub.add_parser("prepare", help="set up (again) the environment Halaman runs in")
    prep.add_argument("--torch", choices=("auto", "cpu", "cuda"), default=None)
    sub.add_parser("status", help="what is installed and whether it is set up")
    remove = sub.add_parser("uninstall", help="remove Halaman (asks before deleting your data)")
    choice = remove.add_mutually_exclusive_group()
    choice.add_argument("--yes", action="store_true", help="also delete your settings, library, chat history and caches")
    choice.add_argument("--keep-data", action="store_true", help="keep your data without asking")
    args = parser.parse_args(argv)

    if args.command == "install":
        from halaman_launcher.install import InstallError
        from halaman_launcher.install import install as do_install

        try:
            layout = do_install(HERE, args.prefix or default_prefix(),
                                bin_dir=None if args.no_bin_link else (args.bin_dir or default_bin_dir()),
                                desktop_entry=not args.no_desktop, torch=args.torch)
        except InstallError as exc:
            print(f"halaman install: {exc}", file=sys.stderr)
            return 1
        if args.prepare_now:
            from halaman_launcher.run import prepare_with_ui

            ok, _ = prepare_with_ui(layout, start_offer=False)
            return 0 if ok else 1
        return 0
    if args.command == "prepare":
        from halaman_launcher.run import prepare_with_ui, start_app

        layout = installed_layout()
        ok, start = prepare_with_ui(layout, torch=args.torch, force=True, start_offer=True)
        return (start_app(layout, []) if start else 0) if ok else 1
    if args.command == "status":
        return _status(installed_layout())
    from halaman_launcher.uninstall import uninstall

    return uninstall(installed_layout(), yes=args.yes, keep_data=args.keep_data)


def _status(layout: Layout) -> int:
    from halaman_launcher.prepare import is_ready

    manifest, marker = read_json(layout.manifest), read_json(layout.marker)
    print(f"installed   Halaman {manifest.get('version')} in {layout.prefix} (Python {manifest.get('python')})")
    if is_ready(layout):
        print(f"prepared    {marker.get('prepared_at')} in {marker.get('prepare_seconds')} s; torch {marker.get('torch')}: "
              f"{marker.get('torch_reason')}")
        for line in marker.get("self_test", []):
            print(f"  {line}")
    else:
        print("prepared    no: the next start sets it up" + (f" (prepared for {marker.get('version')})" if marker else ""))
    total = sum(p.stat().st_size for p in layout.prefix.rglob("*") if p.is_file() and not p.is_symlink())
    print(f"disk        {format_size(total)} under {layout.prefix}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
