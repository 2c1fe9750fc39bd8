#!/usr/bin/env bash
# Run the whole test suite on this machine: starts PostgreSQL, Redis and
# RabbitMQ if needed, builds .venv, then pytest (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/services.sh --rabbitmq
bash scripts/venv.sh
exec .venv/bin/python -m pytest "$@"
