#!/usr/bin/env bash
# Run the whole system locally: API, a worker, beat and a demo echo model
# (SQLite + local result files + the local Redis, unless ASYNCH_* says otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/services.sh
bash scripts/venv.sh
exec .venv/bin/asynch dev "$@"
