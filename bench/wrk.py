"""Drive an HTTP endpoint with wrk and parse its figures."""
from __future__ import annotations

import re
import subprocess
import tempfile

_LUA = """
wrk.method = "%s"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
%s
"""


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def run_wrk(url: str, body: str, headers: dict[str, str], connections: int = 32, seconds: int = 10,
            threads: int = 2, method: str | None = None) -> dict:
    hdr = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items())
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(_LUA % (method or ("POST" if body else "GET"), body, hdr))
        script = f.name
    out = subprocess.run(["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s", "--latency",
                          "--timeout", "10s", "-s", script, url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    lat = {p: _ms(v, u) for p, v, u in re.findall(r"^\s+(50|75|90|99)%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.M)}
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*", out)
    return {"rps": rps, "p50_ms": lat.get("50"), "p99_ms": lat.get("99"),
            "non_2xx": int(non2xx.group(1)) if non2xx else 0, "socket_errors": errors.group(0) if errors else "",
            "raw": out}
