"""A local Redis Cluster of three masters (no replicas) on loopback ports,
each node its own redis-server process in a temporary directory.  Started
and torn down by the test that needs it; nothing outside its own ports."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from helpers import free_port


def _cluster_port() -> int:
    """A free port whose cluster-bus port (+10000) is free too; a cluster
    node's port must be at most 55535."""
    import socket

    while True:
        port = free_port()
        if port > 55535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class LocalRedisCluster:
    def __init__(self, root: Path, masters: int = 3) -> None:
        self.root = root
        self.ports = [_cluster_port() for _ in range(masters)]
        self.procs: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        """What ASYNCH_REDIS_URL names it by (two startup nodes: either may be down)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports[:2])

    def start(self) -> "LocalRedisCluster":
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> "LocalRedisCluster":
        server = shutil.which("redis-server")
        cli = shutil.which("redis-cli")
        assert server and cli, "redis-server and redis-cli are needed (Debian package redis-server)"
        for port in self.ports:
            d = self.root / str(port)
            d.mkdir(parents=True, exist_ok=True)
            self.procs.append(subprocess.Popen(
                [server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", str(d / "nodes.conf"), "--cluster-node-timeout", "2000",
                 "--save", "", "--appendonly", "no", "--dir", str(d), "--logfile", str(d / "redis.log")],
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        for port in self.ports:
            self._wait(lambda p=port: redis.Redis(port=p).ping())
        made = subprocess.run([cli, "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports], "--cluster-yes"],
                              capture_output=True, text=True, timeout=60)
        if made.returncode:
            raise RuntimeError(f"redis-cli --cluster create failed: {made.stdout[-2000:]} {made.stderr[-2000:]}")
        self._wait(lambda: all(self.node(p).cluster("info").get("cluster_state") == "ok" for p in self.ports))
        return self

    def _wait(self, pred, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                if pred():
                    return
            except (redis.RedisError, KeyError):
                pass
            if time.time() > deadline:
                raise RuntimeError(f"redis cluster did not come up (logs in {self.root})")
            time.sleep(0.1)

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, decode_responses=True)

    def port_of(self, key: str) -> int:
        """The master serving ``key``'s slot (from CLUSTER NODES)."""
        r = self.node(self.ports[0])
        slot = int(r.execute_command("CLUSTER", "KEYSLOT", key))
        text = r.execute_command("CLUSTER", "NODES")
        text = text if isinstance(text, str) else "\n".join(f"{k} {v}" for k, v in text.items())
        for line in text.splitlines():
            parts = line.split()
            if "master" not in line:
                continue
            for rng in parts[parts.index("connected") + 1:]:  # the slot ranges close the line
                lo, _, hi = rng.partition("-")
                if int(lo) <= slot <= int(hi or lo):
                    return int(next(x for x in parts if "@" in x).split("@")[0].rsplit(":", 1)[1])
        raise AssertionError(f"no node serves slot {slot}")

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
