"""A job's streamed output (docs/architecture.md, "Streamed output"): how an upstream's stream is cut into output
events, and how a worker forwards them live.

The stored result is the truth: the whole answer, byte for byte, uploaded before the job is done.  What a worker
forwards while the call runs is derived state, in a Redis stream per job (``keys.job_output``), kept for
``LIVE_TTL_SECONDS`` after its last entry.

Invariants:
- Cut by offsets, not by arrival: an ``output`` event is one SSE event (up to and including its blank line) or one
  NDJSON line of the upstream's body, named by the byte offset of its end; ``Cutter`` makes the same cuts whatever
  pieces the body arrives in (a CR at a piece's end waits for the next byte), so a stream resumed from the stored
  result (``replay``) continues at exactly the event the live one reached.  An event never exceeds
  ``MAX_EVENT_BYTES`` (a longer one is cut there: still deterministic).  Any other content type is one event, the
  whole body, at the end.
- Live entry ids are ``<attempt>-<end>`` (``<attempt>-0``: the attempt's start, field ``a`` its content type);
  a data entry carries its text (``d``) and the end of the entry before it (``p``): a reader that sees ``p`` differ
  from its cursor missed entries and reads them back (XRANGE).  Redis refuses an id not above the newest, so a
  late write of an older attempt is dropped by Redis itself.
- One flusher thread per process writes every call's entries in batches (one pipeline: XADDs, EXPIREs, one
  PUBLISH of the batch on ``keys.output_channel``): a call's thread never waits for Redis, and a Redis away costs
  the live view only (logged once per outage), never the call.
"""
from __future__ import annotations

import json
import logging
import queue
import re
import threading

from app.infra.process import PerProcess
from app.infra.redis import keys
from app.infra.redis.client import get_redis

log = logging.getLogger(__name__)

MAX_EVENT_BYTES = 1 << 20
LIVE_TTL_SECONDS = 3600  # a finished job's live entries; its output is replayed from the stored result anyway
FLUSH_BATCH = 512  # entries per pipeline at most
STREAMED = ("text/event-stream", "application/x-ndjson", "application/jsonl", "application/json-seq")


def mime(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def is_streamed(content_type: str | None) -> bool:
    return mime(content_type) in STREAMED


class Cutter:
    """Cuts a body fed in pieces into events ``(end offset, bytes)``; the cuts depend only on the bytes."""

    def __init__(self, content_type: str) -> None:
        self.sse = mime(content_type) == "text/event-stream"
        self.buf = bytearray()
        self.start = 0          # offset of buf[0] in the body
        self.scan = 0           # buf index scanned up to
        self.blank = True       # (SSE) the current line is empty so far: a line end then ends the event

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self.buf += data
        out = []
        i, buf = self.scan, self.buf
        while i < len(buf):
            c = buf[i]
            if c == 0x0D and i + 1 == len(buf):
                break  # a CR at the end: a CRLF's half, or a line end of its own; the next byte says
            if c in (0x0A, 0x0D):
                end = i + 2 if c == 0x0D and buf[i + 1] == 0x0A else i + 1
                if not self.sse or self.blank:
                    out.append(self._cut(end))
                    buf, i = self.buf, 0
                    self.blank = True
                    continue
                self.blank, i = True, end
                continue
            self.blank = False
            i += 1
            if i >= MAX_EVENT_BYTES:
                out.append(self._cut(i))
                buf, i = self.buf, 0
        self.scan = i
        return out

    def _cut(self, end: int) -> tuple[int, bytes]:
        piece = bytes(self.buf[:end])
        del self.buf[:end]
        self.start += end
        return self.start, piece

    def close(self) -> list[tuple[int, bytes]]:
        """The rest (an event the body ended inside of)."""
        self.scan = len(self.buf)
        return [self._cut(len(self.buf))] if self.buf else []


def events_of(body: bytes, content_type: str) -> list[tuple[int, bytes]]:
    """The output events of a whole body, as the live stream cut them (``replay``'s)."""
    if not is_streamed(content_type):
        return [(len(body), body)] if body else []
    c = Cutter(content_type)
    return c.feed(body) + c.close()


def text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def notice(batch: dict[str, list[tuple[str, dict]]]) -> str:
    """A PUBLISH of entries just added: ``{job: [[entry id, fields], ...]}``."""
    return json.dumps(batch, separators=(",", ":"))


_ENTRY_ID = re.compile(r"^(\d{1,18})-(\d{1,18})$")


def entry_id(value: str) -> tuple[int, int] | None:
    """``<attempt>-<offset>`` as numbers (a Last-Event-ID too); None if it is not one."""
    m = _ENTRY_ID.match((value or "").strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


class _Flusher:
    """This process's one writer of live output (a forked child starts its own)."""

    def __init__(self) -> None:
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()
        self.failing = False

    def put(self, job_id: str, eid: str, fields: dict) -> None:
        if self.thread is None or not self.thread.is_alive():
            with self.lock:
                if self.thread is None or not self.thread.is_alive():
                    self.thread = threading.Thread(target=self._run, name="asynch-output", daemon=True)
                    self.thread.start()
        self.q.put((job_id, eid, fields))

    def _run(self) -> None:
        while True:
            batch = [self.q.get()]
            while len(batch) < FLUSH_BATCH:
                try:
                    batch.append(self.q.get_nowait())
                except queue.Empty:
                    break
            self._write(batch)

    def _write(self, batch: list[tuple[str, str, dict]]) -> None:
        by_job: dict[str, list] = {}
        for job_id, eid, fields in batch:
            by_job.setdefault(job_id, []).append([eid, fields])
        try:
            r = get_redis()
            pipe, sent = r.pipeline(transaction=False), []
            for job_id, entries in by_job.items():
                key = keys.job_output(job_id)
                for eid, fields in entries:
                    pipe.xadd(key, fields, id=eid)
                    sent.append((job_id, eid))
                pipe.expire(key, LIVE_TTL_SECONDS)
                sent.append(None)
            res = pipe.execute(raise_on_error=False)
            # An id Redis refused (a late entry of an older attempt) is not announced either.
            refused = {s_ for s_, r_ in zip(sent, res) if s_ is not None and isinstance(r_, Exception)}
            announced = {j: [e for e in es if (j, e[0]) not in refused] for j, es in by_job.items()}
            r.publish(keys.output_channel(), notice({j: es for j, es in announced.items() if es}))
            if self.failing:
                log.warning("live output written again")
            self.failing = False
        except Exception as exc:  # derived state: the call goes on, readers resume from the stored result
            if not self.failing:
                log.warning("live output not written (readers will see it from the stored result): %s", exc)
            self.failing = True


_flusher = PerProcess(_Flusher)


class Forwarder:
    """One attempt's live output: ``start`` when the answer's head arrived (a streamed type only), then every
    piece of the body as it is read; ``close`` at the call's end, whatever the end."""

    def __init__(self, job_id: str, attempt: int) -> None:
        self.job_id, self.attempt = job_id, attempt
        self.cutter: Cutter | None = None
        self.prev = 0

    def start(self, content_type: str) -> bool:
        if not is_streamed(content_type):
            return False
        self.cutter = Cutter(content_type)
        _flusher.get().put(self.job_id, f"{self.attempt}-0", {"a": mime(content_type)})
        return True

    def piece(self, data: bytes) -> None:
        if self.cutter is not None:
            self._send(self.cutter.feed(data))

    def close(self, complete: bool) -> None:
        """The call ended: an answer read whole (``complete``) sends its last unterminated event too."""
        if self.cutter is not None and complete:
            self._send(self.cutter.close())
        self.cutter = None

    def _send(self, events: list[tuple[int, bytes]]) -> None:
        f = _flusher.get()
        for end, data in events:
            f.put(self.job_id, f"{self.attempt}-{end}", {"d": text(data), "p": self.prev})
            self.prev = end
