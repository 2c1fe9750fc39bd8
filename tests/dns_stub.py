"""A DNS server on 127.0.0.1 for the URL-check tests: it answers a name with
an A record of ANSWER (and no AAAA), never answers a name in ``hang`` (a
resolver that hangs), and answers NXDOMAIN for every name when
``nxdomain``.  It records the names it was asked.  Nothing it answers is
ever connected to: the SSRF guard only classifies addresses."""
from __future__ import annotations

import socket
import threading
from collections import Counter

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset

ANSWER = "93.184.216.34"  # public (the guard admits it), never dialled


class DnsStub:
    def __init__(self, hang=(), nxdomain: bool = False) -> None:
        self.hang = {h.rstrip(".") for h in hang}
        self.nxdomain = nxdomain
        self.asked: Counter = Counter()
        self._lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def note(self, name: str, kind: str) -> None:
        with self._lock:
            self.asked[(name, kind)] += 1

    def count(self, name: str) -> int:
        with self._lock:
            return sum(n for (q, _t), n in self.asked.items() if q == name)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                wire, peer = self.sock.recvfrom(4096)
            except OSError:
                continue
            try:
                query = dns.message.from_wire(wire)
            except Exception:  # noqa: BLE001 - junk: ignore, as a server would
                continue
            q = query.question[0]
            name = q.name.to_text().rstrip(".")
            self.note(name, dns.rdatatype.to_text(q.rdtype))
            if any(name == h or name.endswith("." + h) for h in self.hang):
                continue  # the hanging resolver: never an answer
            resp = dns.message.make_response(query)
            if self.nxdomain:
                resp.set_rcode(dns.rcode.NXDOMAIN)
            elif q.rdtype == dns.rdatatype.A:
                resp.answer.append(dns.rrset.from_text(q.name, 30, "IN", "A", ANSWER))
            self.sock.sendto(resp.to_wire(), peer)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()
