"""Server-sent events: an incremental parser of the W3C EventSource stream format.

Spec: https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation
A stream is UTF-8 text in lines ending with CRLF, LF or CR. `data:` lines accumulate (joined by
"\\n"), `event:` names the event, `id:` sets the last event id, lines starting with ":" are comments
(keep-alives), and a blank line dispatches the event. An event not closed by a blank line when the
stream ends is discarded, as the spec requires: a cut stream never yields a half event.

OpenAI-compatible Chat Completions streams send one JSON chunk per event (`data: {...}`) and end
with `data: [DONE]`; that layer is in `engine.cloud.client`, this one only knows the format.
"""

from __future__ import annotations

from dataclasses import dataclass

# A line longer than this is not a Chat Completions chunk: the server is broken or not SSE.
MAX_LINE_BYTES = 4 * 1024 * 1024


class SseFormatError(ValueError):
    """The byte stream is not an event stream (a line over MAX_LINE_BYTES)."""


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event. event: the `event:` field ("message" when absent)."""

    data: str
    event: str = "message"
    id: str | None = None


class SseParser:
    """Feed bytes as they arrive; get the events completed so far.

        parser = SseParser()
        for chunk in body:                # any split, even inside a line or a UTF-8 character
            for event in parser.feed(chunk):
                ...
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._event = ""
        self._last_id: str | None = None
        self._first_line = True

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Parse `chunk` (bytes) and return the events it completed, in order.

        Raises SseFormatError when a line grows past MAX_LINE_BYTES.
        """
        self._buffer += chunk
        events: list[SseEvent] = []
        start = 0
        buffer = self._buffer
        while True:
            cr, lf = buffer.find(b"\r", start), buffer.find(b"\n", start)
            if cr < 0 and lf < 0:
                break
            end = min(i for i in (cr, lf) if i >= 0)
            if buffer[end] == 13:  # CR: a lone CR ends a line, CRLF too; at the end of the buffer we cannot tell yet
                if end + 1 == len(buffer):
                    break
                step = 2 if buffer[end + 1] == 10 else 1
            else:
                step = 1
            event = self._line(buffer[start:end].decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
            start = end + step
        self._buffer = buffer[start:]
        if len(self._buffer) > MAX_LINE_BYTES:
            raise SseFormatError(f"an event-stream line is longer than {MAX_LINE_BYTES} bytes")
        return events

    def _line(self, line: str) -> SseEvent | None:
        if self._first_line:
            self._first_line = False
            line = line.removeprefix("\ufeff")  # a byte-order mark may open the stream
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # comment, e.g. a keep-alive
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\x00" not in value:
            self._last_id = value
        # "retry" and unknown fields are ignored: we never reconnect a half-answered completion.
        return None

    def _dispatch(self) -> SseEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return SseEvent(data="\n".join(data), event=event or "message", id=self._last_id)
