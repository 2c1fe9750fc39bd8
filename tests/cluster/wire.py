"""The cluster's network: one TAP device per host, moved into the host's
network namespace, and this process switching Ethernet frames between them
(a learning switch in user space).  Being the wire lets it do what netem
would (this kernel has no sch_netem): delay every frame, drop a share of
them at random (real packet loss: the hosts' TCP retransmits), and cut
pairs of hosts (optionally one TCP port) in both directions, silently, as a
partition does.

Run as root:  python wire.py CONFIG.json   (see harness.py for the config)
It prints "ready" once every host's interface is up.  Control: JSON lines
on the unix socket named in the config:
  {"op": "set", "delay": 0.05, "loss": 0.01}     every frame, every link
  {"op": "cut", "a": IP, "b": IP, "port": 6379}  drop a<->b (port: only that TCP port)
  {"op": "heal"}                                 remove every cut
  {"op": "stats"}                                frames forwarded / dropped
Only frames between its own TAP devices exist here; nothing reaches any
other interface.  Closing the devices (exit) removes them.
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import os
import random
import signal
import struct
import subprocess
import sys

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


class Wire:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.fds: dict[int, str] = {}  # fd -> host name
        self.macs: dict[bytes, int] = {}  # learned: MAC -> fd
        self.delay = 0.0
        self.loss = 0.0
        self.cuts: list[tuple[bytes, bytes, int | None]] = []
        self.forwarded = self.dropped = self.cut_frames = 0
        self.loop = asyncio.new_event_loop()

    def setup(self) -> None:
        prefix = self.cfg["net_prefix_len"]
        for host in self.cfg["hosts"]:
            name, ns, ip = host["tap"], host.get("ns"), host["ip"]
            fd = open_tap(name)
            self.fds[fd] = host["name"]
            run = (lambda *a: sh("ip", "netns", "exec", ns, *a)) if ns else (lambda *a: sh(*a))
            if ns:
                sh("ip", "link", "set", name, "netns", ns)
                run("ip", "link", "set", "lo", "up")
            run("ip", "addr", "add", f"{ip}/{prefix}", "dev", name)
            run("ip", "link", "set", name, "mtu", "1500", "up")
            self.loop.add_reader(fd, self._readable, fd)

    # -- frames -------------------------------------------------------------
    def _blocked(self, frame: bytes) -> bool:
        if not self.cuts or len(frame) < 34 or frame[12:14] != b"\x08\x00":
            return False
        src, dst = frame[26:30], frame[30:34]
        ports = None
        for a, b, port in self.cuts:
            if (src, dst) not in ((a, b), (b, a)):
                continue
            if port is None:
                return True
            if ports is None:
                if frame[23] != 6:  # not TCP
                    ports = ()
                else:
                    off = 14 + (frame[14] & 0x0F) * 4
                    ports = struct.unpack("!HH", frame[off:off + 4]) if len(frame) >= off + 4 else ()
            if port in ports:
                return True
        return False

    def _readable(self, fd: int) -> None:
        for _ in range(64):
            try:
                frame = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                return
            if len(frame) < 14:
                continue
            self.macs[frame[6:12]] = fd
            if self._blocked(frame):
                self.cut_frames += 1
                continue
            dst = frame[0:6]
            out = self.macs.get(dst) if not dst[0] & 1 else None
            targets = [out] if out is not None else [f for f in self.fds if f != fd]
            for t in targets:
                if t == fd:
                    continue
                if self.loss and random.random() < self.loss:
                    self.dropped += 1
                    continue
                if self.delay:
                    self.loop.call_later(self.delay, self._send, t, frame)
                else:
                    self._send(t, frame)

    def _send(self, fd: int, frame: bytes) -> None:
        try:
            os.write(fd, frame)
            self.forwarded += 1
        except OSError:  # a full queue or a device gone: the frame is lost, like on a real NIC
            self.dropped += 1

    # -- control ------------------------------------------------------------
    async def _control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            try:
                cmd = json.loads(line)
                op = cmd["op"]
                if op == "set":
                    self.delay, self.loss = float(cmd.get("delay", 0)), float(cmd.get("loss", 0))
                elif op == "cut":
                    ip = lambda s: bytes(int(x) for x in s.split("."))  # noqa: E731
                    self.cuts.append((ip(cmd["a"]), ip(cmd["b"]), cmd.get("port")))
                elif op == "heal":
                    self.cuts = []
                elif op != "stats":
                    raise ValueError(f"unknown op {op}")
                answer = {"ok": True, "forwarded": self.forwarded, "dropped": self.dropped,
                          "cut": self.cut_frames, "delay": self.delay, "loss": self.loss, "cuts": len(self.cuts)}
            except Exception as exc:  # a bad command answers an error, the wire goes on
                answer = {"ok": False, "error": str(exc)}
            writer.write((json.dumps(answer) + "\n").encode())
            await writer.drain()
        writer.close()

    def run(self) -> None:
        path = self.cfg["control"]
        if os.path.exists(path):
            os.unlink(path)
        self.loop.run_until_complete(asyncio.start_unix_server(self._control, path=path))
        self.loop.add_signal_handler(signal.SIGTERM, self.loop.stop)
        self.loop.add_signal_handler(signal.SIGINT, self.loop.stop)
        print("ready", flush=True)
        self.loop.run_forever()
        for fd in self.fds:
            os.close(fd)


def main() -> None:
    cfg = json.load(open(sys.argv[1]))
    w = Wire(cfg)
    w.setup()
    w.run()


if __name__ == "__main__":
    main()
