"""How many CPU threads torch gets: the idle physical cores, measured, never more.

torch defaults to one thread per logical CPU it is allowed to run on. On a machine where other
work holds some cores that oversubscribes: every small op of a layer ends in an OpenMP barrier
that waits for the slowest thread, and a thread sharing its core with another process stalls the
rest (two threads ran 8x slower than one on a busy 2-core machine, docs/BENCHMARKS.md). So the
count is taken from what the cores are doing when the model loads.
"""

from __future__ import annotations

import os

import psutil

# A core busier than this (percent, over the sample) counts as taken by other work.
BUSY_PERCENT = 50.0
SAMPLE_SECONDS = 0.25


def usable_cores() -> int:
    """Physical cores this process may run on (affinity mask ∩ physical cores), at least 1."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    physical = psutil.cpu_count(logical=False) or allowed
    return max(1, min(allowed, physical))


def idle_cores(sample_seconds: float = SAMPLE_SECONDS) -> int:
    """Cores less than `BUSY_PERCENT` busy over `sample_seconds` (at least 1), capped at `usable_cores`.

    Sampled with psutil over all logical CPUs (this process is idle while it samples).
    """
    per_cpu = psutil.cpu_percent(interval=sample_seconds, percpu=True)
    idle = sum(1 for busy in per_cpu if busy < BUSY_PERCENT)
    return max(1, min(usable_cores(), idle))


def choose_threads(requested: int = 0) -> int:
    """Threads for torch on the CPU: `requested` if > 0 (capped at `usable_cores`), else `idle_cores()`."""
    if requested > 0:
        return min(requested, usable_cores())
    return idle_cores()


def apply_threads(requested: int = 0) -> int:
    """Set torch's intra-op thread count with `choose_threads`; returns the count set."""
    import torch

    count = choose_threads(requested)
    torch.set_num_threads(count)
    return count
