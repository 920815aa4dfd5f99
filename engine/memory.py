"""MemoryReport: what the weights, the KV cache and the workspace hold against the device's memory.

On CUDA the device numbers come from `torch.cuda.mem_get_info` (free / total of the GPU); on CPU
from system RAM (psutil). The weights and KV numbers are Halaman's own accounting, so they are the
same on both; workspace is what the process holds beyond them (activations, allocator caches).
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil
import torch

from engine.kvcache.cache import MemoryBreakdown


@dataclass(frozen=True)
class MemoryReport:
    """Bytes by use on one device. `device_total_bytes` / `device_free_bytes` describe the device."""

    device: str
    weights_bytes: int
    kv: MemoryBreakdown
    workspace_bytes: int
    device_total_bytes: int
    device_free_bytes: int
    budget_bytes: int = 0        # what the KV cache may grow to (budget + one chunk), 0 if unknown

    @property
    def kv_bytes(self) -> int:
        return self.kv.total_bytes

    @property
    def used_fraction(self) -> float:
        """Share of the device in use (by anything), 0..1."""
        if not self.device_total_bytes:
            return 0.0
        return 1 - self.device_free_bytes / self.device_total_bytes


def measure(device: torch.device, *, weights_bytes: int, kv: MemoryBreakdown | None, budget_bytes: int = 0) -> MemoryReport:
    """A report for `device` now. Never raises for a missing GPU: falls back to system RAM."""
    kv = kv or MemoryBreakdown()
    if device.type == "cuda" and torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info(device)
        allocated = torch.cuda.memory_reserved(device)
        workspace = max(0, allocated - weights_bytes - kv.total_bytes)
        name = torch.cuda.get_device_name(device)
    else:
        vm = psutil.virtual_memory()
        free, total = vm.available, vm.total
        rss = psutil.Process().memory_info().rss
        workspace = max(0, rss - weights_bytes - kv.total_bytes)
        name = "CPU (system RAM)"
    return MemoryReport(
        device=name,
        weights_bytes=weights_bytes,
        kv=kv,
        workspace_bytes=workspace,
        device_total_bytes=int(total),
        device_free_bytes=int(free),
        budget_bytes=budget_bytes,
    )


def remeasure(report: MemoryReport, device: str) -> MemoryReport:
    """`report` with the device-wide numbers (free, total, workspace) measured again now on
    `device` ("cpu", "cuda", "cuda:0"); weights, KV and budget are kept. Safe from any thread: it
    reads psutil / `torch.cuda.mem_get_info`, never an engine's state."""
    return measure(torch.device(device), weights_bytes=report.weights_bytes, kv=report.kv, budget_bytes=report.budget_bytes)
