"""Both ends of the JSON-lines pipe of a capped reader process (the PDF worker, the OCR worker):
the child writes one event per line (`emit`) under an address-space cap (`limit_memory`); the
parent reads its stdout on a thread into a queue (`pump`), so a stalled child never blocks the
caller's timeouts or its cancel."""

from __future__ import annotations

import json
import queue
import sys
from typing import IO, Any


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


__all__ = ["emit", "limit_memory", "pump"]
