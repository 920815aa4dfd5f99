"""Both ends of the JSON-lines pipe of a capped reader process (the PDF worker, the OCR worker):
the child writes one event per line (`emit`) under an address-space cap (`limit_memory`); the
parent reads its stdout on a thread into a queue (`pump`), so a stalled child never blocks the
caller's timeouts or its cancel."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from engine.errors import Cancelled


def emit(event: dict[str, Any]) -> None:
    """Child side: one JSON event on its own line of stdout, flushed."""
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def limit_memory(memory_bytes: int) -> None:
    """Child side: cap this process's address space so that an allocation failure ends it, not the
    machine (0: no cap)."""
    try:
        import resource
    except ImportError:  # Windows: the parent's timeouts are the only bound there.
        return
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    """Parent side, on a thread: every line of `stream` into `lines`, then None (end of stream)."""
    try:
        for line in stream:
            lines.put(line)
    except (OSError, ValueError):
        pass  # the process was killed while we read
    finally:
        lines.put(None)


@dataclass(frozen=True)
class ChildWords:
    """What the parent says when its child fails: the Cancelled message; no event within the
    timeout (`{timeout:g}` is filled in); the child died (a non-zero exit: the memory cap or a
    crash); it stopped before "done"; it wrote a line that is not JSON."""

    cancelled: str
    timed_out: str
    died: str
    stopped: str
    garbled: str


def child_events(process: subprocess.Popen, cancel: threading.Event | None, *, timeout_s: float,
                 poll_s: float, lost: type[Exception], words: ChildWords) -> Iterator[dict[str, Any]]:
    """Parent side: the child's events until its "done" (not yielded). Checks `cancel` every
    `poll_s` seconds (raises Cancelled with `words.cancelled`); raises `lost(one line of words)`
    when no event comes within `timeout_s` of the last, the child exits early, or a line is not JSON."""
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=pump, args=(process.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while True:
        if cancel is not None and cancel.is_set():
            raise Cancelled(words.cancelled)
        try:
            line = lines.get(timeout=poll_s)
        except queue.Empty:
            if time.monotonic() > deadline:
                raise lost(words.timed_out.format(timeout=timeout_s)) from None
            continue
        if line is None:
            raise lost(words.died if process.wait() else words.stopped)
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            raise lost(words.garbled) from None
        if event.get("event") == "done":
            return
        yield event
        deadline = time.monotonic() + timeout_s


__all__ = ["ChildWords", "child_events", "emit", "limit_memory", "pump"]
