"""Choices between exact ways of computing the same thing, measured once per process and key (a
model shape on a device) and then kept: `column_sums` (H2O's prefill sums) and `key_layout` (the
decode workspace's keys) each hold one `MeasuredChoices`."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

Choice = TypeVar("Choice")


class MeasuredChoices(Generic[Choice]):
    """What was measured per key, thread-safe: `get(key, measure)` calls `measure()` on the key's
    first use only, so concurrent first uses measure once and every later use gets the same choice.
    `measure` runs under the registry's lock, so it must not use the same registry (it would wait
    for itself); other callers wait until it is done."""

    def __init__(self) -> None:
        self._choices: dict[tuple, Choice] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple, measure: Callable[[], Choice]) -> Choice:
        with self._lock:
            if key not in self._choices:
                self._choices[key] = measure()
            return self._choices[key]

    def measured(self) -> list[Choice]:
        """The choices made so far in this process (for benchmark reports)."""
        with self._lock:
            return list(self._choices.values())

    def forget(self) -> None:
        """Drop the measured choices, so the next use measures again (tests, benchmarks)."""
        with self._lock:
            self._choices.clear()
