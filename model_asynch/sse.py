"""Event streams (text/event-stream) for both clients: the event shape, the parser, the lines of a stream's
chunks and the request headers that resume one (Last-Event-ID).  HTTP only, as the rest of the package."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Iterator


@dataclass
class Event:
    id: str
    event: str
    data: Any


class SSEParser:
    """text/event-stream lines in, events out (blocks without data dispatch nothing)."""

    def __init__(self) -> None:
        self._fields: dict[str, str] = {}

    def feed(self, line: str) -> Event | None:
        if line == "":
            f, self._fields = self._fields, {}
            if "data" not in f:
                return None
            try:  # a job's output is text as the model sent it, even when it reads as JSON
                data = f["data"] if f.get("event") == "output" else json.loads(f["data"])
            except ValueError:
                data = f["data"]
            return Event(f.get("id", ""), f.get("event", "message"), data)
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        self._fields[name] = self._fields[name] + "\n" + value if name == "data" and name in self._fields else value
        return None


def lines_of(chunks: Iterable[bytes]) -> Iterator[str]:
    """An event stream's lines (LF, CRLF or CR ended: the server sends LF) from its chunks as they arrive; not
    ``str.splitlines``, which also splits on U+2028 and friends inside a line of text."""
    buf = b""
    for chunk in chunks:
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            yield line.decode("utf-8", "replace").removesuffix("\r")
    if buf:
        yield buf.decode("utf-8", "replace")


def stream_headers(last: str | None) -> dict[str, str]:
    return {"Accept": "text/event-stream", **({"Last-Event-ID": last} if last is not None else {})}
