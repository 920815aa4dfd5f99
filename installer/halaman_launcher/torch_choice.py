"""Which torch build to install: CUDA where an NVIDIA GPU and a recent enough driver are present,
the CPU build otherwise.

torch is pinned by pyproject.toml (2.13.0 today; build.py writes the pin into release.json). What
its builds need, read from the wheels' metadata; check this table whenever the pin moves:

- PyPI's Linux x86_64 wheel *is* the CUDA 13.0 build (it pulls `cuda-toolkit==13.0.*`, cuDNN, NCCL:
  about 3.5 GB). CUDA 13 needs an NVIDIA driver >= 580 and a GPU of compute capability >= 7.5
  (Turing: GTX 16xx / RTX 20xx and newer).
- PyPI's Windows wheel is CPU-only; the CUDA builds for Windows come from PyTorch's own index.
- PyTorch's index `https://download.pytorch.org/whl/<variant>` has `cpu` (small, about 200 MB) and
  CUDA variants. `cu126` serves older drivers (>= 525) and older GPUs (Maxwell / Pascal / Volta);
  whether it still exists for the pinned torch could not be checked from the build machine, so a
  failed CUDA install falls back to the CPU build and says so (prepare.py).

Overrides: `HALAMAN_TORCH=cpu|cuda|auto` (or `--torch` at install time) and
`HALAMAN_TORCH_INDEX_URL` (an index URL; empty = pip's own configuration, e.g. a local mirror).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PYTORCH_INDEX = "https://download.pytorch.org/whl"
GIB = 1024**3


@dataclass(frozen=True)
class NvidiaGpu:
    """One GPU as nvidia-smi reports it. compute_capability: e.g. 8.9, None when unknown."""

    name: str
    driver_version: str
    memory_mib: int | None = None
    compute_capability: float | None = None

    @property
    def driver_major(self) -> int:
        match = re.match(r"(\d+)", self.driver_version)
        return int(match.group(1)) if match else 0


@dataclass(frozen=True)
class CudaBuild:
    """A CUDA build of torch and what it requires of the machine."""

    variant: str               # PyTorch's name: "cu130", "cu126"
    min_driver_major: int      # oldest NVIDIA driver branch that runs it
    min_compute_capability: float
    pypi_on_linux: bool        # PyPI's Linux wheel is this build (no extra index needed there)


# Newest first; the first one the machine satisfies is chosen.
CUDA_BUILDS = (
    CudaBuild("cu130", min_driver_major=580, min_compute_capability=7.5, pypi_on_linux=True),
    CudaBuild("cu126", min_driver_major=525, min_compute_capability=5.0, pypi_on_linux=False),
)

# Disk space the preparation needs, with room for pip's temporary files and its download cache.
# Measured for CPU on Linux (installer/README.md); the CUDA figure adds the CUDA libraries.
NEEDED_BYTES = {"cpu": 4 * GIB, "cuda": 12 * GIB}
DOWNLOAD_BYTES = {"cpu": int(0.6 * GIB), "cuda": int(4.0 * GIB)}


@dataclass(frozen=True)
class TorchChoice:
    """What prepare.py installs. index_url None: pip's configured index (PyPI by default)."""

    variant: str               # "cpu" or a CUDA variant ("cu130")
    index_url: str | None
    reason: str                # one line for the user: why this build
    gpu: NvidiaGpu | None = None

    @property
    def is_cuda(self) -> bool:
        return self.variant != "cpu"

    @property
    def label(self) -> str:
        return "CPU build" if not self.is_cuda else f"CUDA build ({self.variant})"

    @property
    def needed_bytes(self) -> int:
        return NEEDED_BYTES["cuda" if self.is_cuda else "cpu"]

    @property
    def download_bytes(self) -> int:
        return DOWNLOAD_BYTES["cuda" if self.is_cuda else "cpu"]


def detect_nvidia(run=subprocess.run) -> list[NvidiaGpu]:
    """NVIDIA GPUs with a loaded driver: from `nvidia-smi`, else from /proc/driver/nvidia (Linux)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        for fields in ("name,driver_version,memory.total,compute_cap", "name,driver_version,memory.total"):
            try:  # older drivers do not know compute_cap: ask again without it
                out = run([smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=15)
            except (OSError, subprocess.SubprocessError):
                break
            if out.returncode == 0 and out.stdout.strip():
                return [_parse_smi_line(line) for line in out.stdout.strip().splitlines() if line.strip()]
    version = Path("/proc/driver/nvidia/version")
    if sys.platform.startswith("linux") and version.exists():
        try:
            text = version.read_text()
        except OSError:
            text = ""
        match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", text)
        return [NvidiaGpu("NVIDIA GPU (nvidia-smi not found)", match.group(1) if match else "unknown")]
    return []


def _parse_smi_line(line: str) -> NvidiaGpu:
    parts = [part.strip() for part in line.split(",")]
    memory = int(float(parts[2])) if len(parts) > 2 and _is_number(parts[2]) else None
    capability = float(parts[3]) if len(parts) > 3 and _is_number(parts[3]) else None
    return NvidiaGpu(parts[0], parts[1] if len(parts) > 1 else "unknown", memory, capability)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def choose_torch(gpus: list[NvidiaGpu], *, platform: str = sys.platform, override: str | None = None) -> TorchChoice:
    """The torch build for this machine. `override`: "cpu", "cuda" or "auto" (None = $HALAMAN_TORCH)."""
    override = (override if override is not None else os.environ.get("HALAMAN_TORCH", "auto")).strip().lower() or "auto"
    if override not in ("auto", "cpu", "cuda"):
        raise ValueError(f"HALAMAN_TORCH / --torch must be auto, cpu or cuda, not {override!r}")
    windows = platform == "win32"
    cpu_index = None if windows else f"{PYTORCH_INDEX}/cpu"
    if override == "cpu":
        return _with_index_override(TorchChoice("cpu", cpu_index, "the CPU build was asked for"))
    if not gpus:
        if override == "cuda":
            return _with_index_override(TorchChoice(CUDA_BUILDS[0].variant, _cuda_index(CUDA_BUILDS[0], windows),
                                                    "the CUDA build was asked for (no NVIDIA GPU was found)"))
        return _with_index_override(TorchChoice("cpu", cpu_index, "no NVIDIA GPU found: the CPU build"))
    gpu = max(gpus, key=lambda g: (g.memory_mib or 0))
    for build in CUDA_BUILDS:
        if gpu.driver_major and gpu.driver_major < build.min_driver_major:
            continue
        if gpu.compute_capability is not None and gpu.compute_capability < build.min_compute_capability:
            continue
        return _with_index_override(TorchChoice(
            build.variant, _cuda_index(build, windows),
            f"{gpu.name} (driver {gpu.driver_version}): the CUDA build {build.variant}", gpu))
    oldest = CUDA_BUILDS[-1]
    why = (f"driver {gpu.driver_version} is older than {oldest.min_driver_major}"
           if gpu.driver_major and gpu.driver_major < oldest.min_driver_major
           else f"compute capability {gpu.compute_capability} is below {oldest.min_compute_capability}")
    if override == "cuda":
        return _with_index_override(TorchChoice(CUDA_BUILDS[-1].variant, _cuda_index(CUDA_BUILDS[-1], windows),
                                                f"the CUDA build was asked for although the {why}", gpu))
    return _with_index_override(TorchChoice(
        "cpu", cpu_index, f"{gpu.name}: its {why}, which torch's CUDA builds need; the CPU build "
        "(update the NVIDIA driver, then run halaman-setup --torch cuda)", gpu))


def cpu_fallback(choice: TorchChoice, why: str) -> TorchChoice:
    """The CPU build after a CUDA install failed."""
    return _with_index_override(TorchChoice("cpu", None if sys.platform == "win32" else f"{PYTORCH_INDEX}/cpu",
                                            f"the CUDA build could not be installed ({why}): the CPU build", choice.gpu))


def _cuda_index(build: CudaBuild, windows: bool) -> str | None:
    return None if build.pypi_on_linux and not windows else f"{PYTORCH_INDEX}/{build.variant}"


def _with_index_override(choice: TorchChoice) -> TorchChoice:
    if "HALAMAN_TORCH_INDEX_URL" not in os.environ:
        return choice
    url = os.environ["HALAMAN_TORCH_INDEX_URL"].strip() or None
    return TorchChoice(choice.variant, url, choice.reason, choice.gpu)
