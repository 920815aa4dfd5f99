"""What the processor is doing: the cores this process may use and how many other processes keep
busy (the system's busy CPU time less this process's own). Torch-free: the read-time plan
(`engine.read_time`) asks it before any model is loaded; `engine.threads` decides torch's threads
from it.
"""

from __future__ import annotations

import os
import time

import psutil

SAMPLE_SECONDS = 0.25


def usable_cores() -> int:
    """Physical cores this process may run on (affinity mask ∩ physical cores), at least 1."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    physical = psutil.cpu_count(logical=False) or allowed
    return max(1, min(allowed, physical))


def cpu_sample() -> tuple[float, float, float]:
    """(now, the system's busy CPU seconds, this process's CPU seconds): two of them apart tell the
    cores other processes kept busy in between."""
    system = psutil.cpu_times()
    busy = system.user + system.nice + system.system + getattr(system, "irq", 0.0) + getattr(system, "softirq", 0.0)
    own = psutil.Process().cpu_times()
    return time.monotonic(), busy, own.user + own.system


def others_between(first: tuple[float, float, float], second: tuple[float, float, float]) -> float:
    """Cores other processes kept busy between two `cpu_sample`s: the system's busy CPU time less
    this process's own, per second (this process's work is not "other", however busy)."""
    then, busy_then, own_then = first
    now, busy, own = second
    return max(0.0, (busy - busy_then) - (own - own_then)) / max(now - then, 1e-3)


def others_busy_cores(sample_seconds: float = SAMPLE_SECONDS) -> float:
    """Cores other processes keep busy, measured over `sample_seconds` (`others_between`)."""
    first = cpu_sample()
    time.sleep(sample_seconds)
    return others_between(first, cpu_sample())


__all__ = ["SAMPLE_SECONDS", "cpu_sample", "others_between", "others_busy_cores", "usable_cores"]
