"""A multipart/form-data body read as a stream (werkzeug's sans-IO decoder over the WSGI input).

Invariants: at most READ bytes of the body are read at a time and the decoder's buffer never holds more than
BUFFER_CAP bytes (a part's data is handed on as it is decoded), so a file part of any size passes through in
flat memory; a plain field is capped at FIELD_CAP bytes; at most MAX_PARTS parts.  A file part's chunks must be
consumed (or are skipped) before the next part is read.  Malformed input raises MultipartError (a 400 upstream).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder, NeedData

READ = 64 * 1024
BUFFER_CAP = 1024 * 1024
FIELD_CAP = 64 * 1024
MAX_PARTS = 16


class MultipartError(ValueError):
    """The body is not the multipart/form-data it claims to be."""


@dataclass
class Part:
    name: str
    filename: str | None  # None: a plain field
    content_type: str
    chunks: Iterator[bytes]  # a file part's data as it arrives

    def text(self) -> str:
        data = b"".join(self.chunks)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MultipartError(f"form field {self.name!r} is not UTF-8 text") from exc


def boundary_of(content_type: str | None) -> bytes:
    from werkzeug.http import parse_options_header

    kind, opts = parse_options_header(content_type or "")
    if kind != "multipart/form-data" or not opts.get("boundary"):
        raise MultipartError("the body must be multipart/form-data with a boundary")
    return opts["boundary"].encode("latin-1")


def parts(stream: BinaryIO, boundary: bytes) -> Iterator[Part]:
    """The body's parts in order; a part's ``chunks`` end at its boundary."""
    dec = MultipartDecoder(boundary, BUFFER_CAP, max_parts=MAX_PARTS)
    state = {"eof": False}

    def event():
        while True:
            try:
                ev = dec.next_event()
            except RequestEntityTooLarge as exc:
                raise MultipartError("too many parts or a part header too large") from exc
            except ValueError as exc:
                raise MultipartError(str(exc)) from exc
            if not isinstance(ev, NeedData):
                return ev
            if state["eof"]:
                raise MultipartError("the body ended inside a part")
            data = stream.read(READ)
            if not data:
                state["eof"] = True
            try:
                dec.receive_data(data or None)
            except RequestEntityTooLarge as exc:
                raise MultipartError("a part header too large") from exc

    def data_of(cap: int | None) -> Callable[[], Iterator[bytes]]:
        done = {"v": False}

        def gen() -> Iterator[bytes]:
            seen = 0
            while not done["v"]:
                ev = event()
                if not isinstance(ev, Data):
                    raise MultipartError("unexpected multipart event")
                seen += len(ev.data)
                if cap is not None and seen > cap:
                    raise MultipartError(f"a form field is larger than {cap} bytes")
                done["v"] = not ev.more_data
                if ev.data:
                    yield ev.data
        gen.done = done  # type: ignore[attr-defined]
        return gen

    while True:
        if state["eof"] and dec.state.name in ("EPILOGUE", "COMPLETE"):
            return
        ev = event()
        if isinstance(ev, Epilogue):
            return
        if isinstance(ev, (Field, File)):
            cap = None if isinstance(ev, File) else FIELD_CAP
            gen = data_of(cap)
            it = gen()
            yield Part(ev.name, ev.filename if isinstance(ev, File) else None,
                       ev.headers.get("content-type", "application/octet-stream"), it)
            if not gen.done["v"]:  # the caller left it: skip the rest
                for _ in it:
                    pass
