"""Set-up on a fresh machine: installer/setup-dev.sh (the README's set-up command, also run by
.ci/run) installs the system libraries PySide6's wheels need, or prints the command that does; and
with them installed, every shared library Qt's GUI, widgets and the offscreen and X11 (xcb) platform
plugins link against resolves."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SETUP = REPO / "installer" / "setup-dev.sh"
sys.path.insert(0, str(REPO / "installer"))
from halaman_launcher.qt_system import DEBIAN_PACKAGES  # noqa: E402 - the one list of them

NEEDED = [
    "lib/libQt6Core.so.6", "lib/libQt6Gui.so.6", "lib/libQt6Widgets.so.6", "lib/libQt6DBus.so.6",
    "lib/libQt6XcbQpa.so.6", "plugins/platforms/libqoffscreen.so", "plugins/platforms/libqxcb.so",
]


@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd (Linux)")
@pytest.mark.parametrize("relative", NEEDED)
def test_qt_libraries_and_platform_plugins_resolve(relative):
    PySide6 = pytest.importorskip("PySide6")
    path = Path(PySide6.__file__).resolve().parent / "Qt" / relative
    assert path.exists(), f"{path} is not in this PySide6 wheel"
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=True).stdout
    missing = [line.split("=>")[0].strip() for line in out.splitlines() if "not found" in line]
    assert missing == [], (f"{relative} needs {missing}: run installer/setup-dev.sh as root, or "
                           f"sudo apt-get install {' '.join(DEBIAN_PACKAGES)}")


def test_qt_calls_do_not_leak_references_to_none_true_or_false():
    """PySide6 6.12.0 on Python 3.11 drops a reference to None on every void call (a paint event,
    QPainter.setBrush, QLabel.setText...); None's count reaches zero after minutes of painting and
    the interpreter aborts ("none_dealloc"). pyproject.toml pins a version without the bug."""
    pytest.importorskip("PySide6")
    import gc

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QRectF
    from PySide6.QtGui import QColor, QPainter
    from PySide6.QtWidgets import QApplication, QLabel, QWidget

    app = QApplication.instance() or QApplication([])

    class Painted(QWidget):
        def paintEvent(self, _event):
            painter = QPainter(self)
            painter.setBrush(QColor("red"))
            painter.drawRect(QRectF(1, 1, 5, 5))
            painter.end()

    widget, label = Painted(), QLabel("x")
    widget.show()
    label.show()
    app.processEvents()

    def counts():
        gc.collect()
        return sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False)

    before = counts()
    for i in range(300):
        widget.repaint()
        label.setText(str(i))
        label.setVisible(True)
    after = counts()
    widget.close()
    label.close()
    assert all(a - b > -50 for a, b in zip(after, before, strict=True)), f"references to None/True/False lost: {before} -> {after}"


# --- installer/setup-dev.sh, system step ----------------------------------------------------------
# The packages cannot be removed from the test machine, so the script runs against stand-ins for
# the system's own tools, first on PATH: `id` (which user), `sudo` (refuses, or runs the command),
# `dpkg-query` (reports the packages listed in `missing` as not installed) and `apt-get` (logs its
# arguments and marks the packages it installs). The script itself is the real one.
FAKE_TOOLS = {
    "id": 'echo "$FAKE_UID"\n',
    "sudo": '[ "$FAKE_SUDO" = yes ] || exit 1\n[ "$1" = -n ] && shift\nexec "$@"\n',
    "dpkg-query": 'for package; do :; done\n'
                  'if grep -qx "$package" "$FAKE_STATE/missing"; then exit 1; fi\n'
                  "printf 'install ok installed'\n",
    "apt-get": 'echo "$*" >> "$FAKE_STATE/apt-get.log"\n'
               '[ "$1" = install ] || exit 0\n'
               'for arg; do case "$arg" in -*|install) ;; *) grep -vx "$arg" "$FAKE_STATE/missing" > "$FAKE_STATE/m"; '
               'mv "$FAKE_STATE/m" "$FAKE_STATE/missing";; esac; done\n',
}
ABSENT = ["libxcb-icccm4", "libxcb-keysyms1"]  # what the fresh-Debian trial lacked


def run_system_step(tmp_path: Path, uid: str, sudo: str) -> tuple[subprocess.CompletedProcess, Path]:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, body in FAKE_TOOLS.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    (state / "missing").write_text("".join(f"{package}\n" for package in ABSENT))
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_UID": uid, "FAKE_SUDO": sudo,
           "FAKE_STATE": str(state)}
    out = subprocess.run(["bash", str(SETUP), "--system-only"], env=env, capture_output=True, text=True, timeout=120)
    return out, state


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("bash") is None,
                                reason="the set-up script is for Linux")


@linux_only
def test_without_root_the_script_prints_the_exact_command_and_fails(tmp_path):
    out, state = run_system_step(tmp_path, uid="1000", sudo="no")
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"\n    sudo apt-get install -y --no-install-recommends {' '.join(ABSENT)}\n" in out.stderr
    assert not (state / "apt-get.log").exists()  # nothing was attempted


@linux_only
@pytest.mark.parametrize(("uid", "sudo"), [("0", "no"), ("1000", "yes")])
def test_as_root_or_with_passwordless_sudo_the_script_installs_only_what_is_missing(tmp_path, uid, sudo):
    out, state = run_system_step(tmp_path, uid=uid, sudo=sudo)
    assert out.returncode == 0, out.stdout + out.stderr
    log = (state / "apt-get.log").read_text().splitlines()
    assert log == ["update -qq", f"install -y -qq --no-install-recommends {' '.join(ABSENT)}"]
    assert (state / "missing").read_text() == "" and "all installed" in out.stdout


def test_the_readme_and_ci_set_up_with_the_script():
    """The README's set-up command and .ci/run both go through the script, so what CI checks from
    scratch is what a new user runs."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "```bash\ninstaller/setup-dev.sh && .venv/bin/halaman\n```" in readme
    assert "```bash\n.venv/bin/python -m pytest\n```" in readme
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-3:] == ["rm -rf .venv", "installer/setup-dev.sh", ".venv/bin/python -m pytest"]
