"""An incremental Server-Sent Events parser, robust to how bytes happen to be split.

A network read may end mid-line, mid-CRLF or in the middle of a UTF-8 character; the
parser keeps what it cannot use yet and only dispatches an event at its blank line,
as the WHATWG EventSource specification says.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field


@dataclass
class SSEEvent:
    data: str
    event: str = "message"
    id: str | None = None


@dataclass
class SSEParser:
    """Feed it raw bytes; it returns the events that are complete so far."""

    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )
    _buffer: str = ""
    _pending_cr: bool = False  # a chunk ended with '\r': a following '\n' belongs to it
    _data: list[str] = field(default_factory=list)
    _event: str = ""
    _id: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        return self._feed_text(self._decoder.decode(chunk))

    def close(self) -> list[SSEEvent]:
        """End of stream: a last event without its blank line still counts."""
        events = self._feed_text(self._decoder.decode(b"", final=True))
        if self._buffer:
            events.extend(self._process_line(self._buffer))
            self._buffer = ""
        events.extend(self._dispatch())
        return events

    def _feed_text(self, text: str) -> list[SSEEvent]:
        if not text:  # e.g. only half of a UTF-8 character arrived
            return []
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]
        self._pending_cr = False
        events: list[SSEEvent] = []
        for line in self._split_lines(self._buffer + text):
            events.extend(self._process_line(line))
        return events

    def _split_lines(self, text: str) -> list[str]:
        """Complete lines of text; the unterminated tail stays in the buffer."""
        lines: list[str] = []
        start = 0
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "\n" or ch == "\r":
                lines.append(text[start:i])
                if ch == "\r":
                    if i + 1 == len(text):
                        self._pending_cr = True
                    elif text[i + 1] == "\n":
                        i += 1
                start = i + 1
            i += 1
        self._buffer = text[start:]
        return lines

    def _process_line(self, line: str) -> list[SSEEvent]:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):  # a comment, e.g. a keep-alive ping
            return []
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        return []

    def _dispatch(self) -> list[SSEEvent]:
        if not self._data:
            self._event = ""
            return []
        event = SSEEvent(data="\n".join(self._data), event=self._event or "message", id=self._id)
        self._data = []
        self._event = ""
        return [event]
