"""How many CPU threads torch gets: the idle physical cores, measured, never more.

torch defaults to one thread per logical CPU it is allowed to run on. On a machine where other
work holds some cores that oversubscribes: every small op of a layer ends in an OpenMP barrier
that waits for the slowest thread, and a thread sharing its core with another process stalls the
rest (two threads ran several times slower than one on a busy 2-core machine). So the
count is taken from what the cores are doing when the model loads, and re-decided while a document
is read and an answer decodes (`ThreadGovernor`): a read that started beside a busy process takes
the second core back when that process ends.
"""

from __future__ import annotations

import math

import psutil

from engine.cpu_load import cpu_sample, others_between, usable_cores

# A core busier than this (percent, over the sample) counts as taken by other work.
BUSY_PERCENT = 50.0
SAMPLE_SECONDS = 0.25


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


# A core counts as taken by other processes once they use this share of it: while our threads hold
# both cores a competing process gets only about two thirds of one, so a higher bar would keep the
# cliff. It counts as free again only below TAKE_BACK_SHARE, so a load near the bar does not flap.
GIVE_UP_SHARE = 0.5
TAKE_BACK_SHARE = 0.25
# The shortest time over which other processes' use is measured: a chunk's worth of work, not a
# scheduler tick.
MIN_SAMPLE_S = 0.5


class ThreadGovernor:
    """Re-decides torch's CPU thread count between chunks of work from what *other* processes use.

    `step()` is cheap (two psutil reads, no sleep) and is called between prefill chunks and every
    few answer tokens. Over the time since the last decision it measures the cores busy with other
    work as the system's busy CPU time minus this process's own, and gives torch the usable cores
    those leave (at least 1): a thread is given up when other work uses `GIVE_UP_SHARE` of a core
    and taken back when it uses less than `TAKE_BACK_SHARE`. Never more threads than usable cores: a
    thread sharing its core with another process stalls every OpenMP barrier (the two-thread
    cliff, `engine.threads`). `requested` > 0 pins the count (the setting), and nothing is measured.
    """

    def __init__(self, requested: int = 0) -> None:
        import torch

        self._torch = torch
        self.requested = requested
        self.threads = torch.get_num_threads()
        self.changes = 0  # how many times the count changed (reports and tests)
        self._mark = cpu_sample()

    def others_cores(self) -> float | None:
        """Cores other processes kept busy since the last decision, or None when too little time has
        passed to tell (the mark is kept, so the next call measures a longer span)."""
        sample = cpu_sample()
        if sample[0] - self._mark[0] < MIN_SAMPLE_S:
            return None
        others = others_between(self._mark, sample)
        self._mark = sample
        return others

    def step(self) -> int:
        """Measure, set torch's thread count if the cores free for it changed, return the count."""
        if self.requested > 0:
            return self.threads
        others = self.others_cores()
        if others is None:
            return self.threads
        usable = usable_cores()
        free_if_giving_up = usable - math.floor(others + 1 - GIVE_UP_SHARE)
        free_if_taking_back = usable - math.floor(others + 1 - TAKE_BACK_SHARE)
        wanted = self.threads
        if free_if_giving_up < self.threads:
            wanted = free_if_giving_up
        elif free_if_taking_back > self.threads:
            wanted = free_if_taking_back
        wanted = max(1, min(usable, wanted))
        if wanted != self.threads:
            self._torch.set_num_threads(wanted)
            self.threads = wanted
            self.changes += 1
        return self.threads
