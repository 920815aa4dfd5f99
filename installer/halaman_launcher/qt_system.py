"""The Debian / Ubuntu packages holding the system libraries that PySide6's Qt loads (Qt itself is
inside the wheel). The one list of them: installer/setup-dev.sh installs what is missing, the
launcher names them when the window dies at start, tests/test_app_setup.py names them when a
library does not resolve.

Found with `ldd` on PySide6's Qt libraries and platform plugins in a fresh venv on Debian 12:
EGL/GL, xkbcommon, fontconfig/freetype, D-Bus and GLib for any window (the offscreen platform the
tests use included), plus the xcb set for a real X display.

    python3 installer/halaman_launcher/qt_system.py     prints the list on one line
"""

from __future__ import annotations

DEBIAN_PACKAGES = (
    "libegl1", "libgl1", "libxkbcommon0", "libfontconfig1", "libfreetype6", "libdbus-1-3", "libglib2.0-0",
    "libxkbcommon-x11-0", "libx11-xcb1", "libxcb-cursor0", "libxcb-icccm4", "libxcb-image0", "libxcb-keysyms1",
    "libxcb-randr0", "libxcb-render-util0", "libxcb-shape0", "libxcb-xfixes0", "libxcb-xkb1",
)


def apt_command(packages: tuple[str, ...] | list[str] = DEBIAN_PACKAGES) -> str:
    """The command a user with sudo rights runs to install `packages`."""
    return "sudo apt-get install -y --no-install-recommends " + " ".join(packages)


if __name__ == "__main__":
    print(" ".join(DEBIAN_PACKAGES))
