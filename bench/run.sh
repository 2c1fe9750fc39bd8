#!/usr/bin/env bash
# Reproduce docs/performance.md: every benchmark, each beside its baseline.
# Usage: bash bench/run.sh [admission|e2e|wakeup|latency|scale|cost|cpu ...]   (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/services.sh
bash scripts/venv.sh
command -v wrk >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
mkdir -p bench/logs
benches=("$@")
[ ${#benches[@]} -gt 0 ] || benches=(cost admission e2e wakeup latency scale cpu)
{
  echo "# $(date -u +%FT%TZ)  $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -m), $(.venv/bin/python -V)"
  for b in "${benches[@]}"; do
    echo "## $b"
    PYTHONPATH=. .venv/bin/python -m "bench.bench_$b"
  done
} 2>&1 | tee bench/logs/summary.txt
