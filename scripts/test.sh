#!/usr/bin/env bash
# Run the whole test suite on this machine.  The suite starts its own
# PostgreSQL and Valkey (tests/conftest.py) and never restarts, flushes or
# writes the machine's own PostgreSQL or Redis.  This script starts RabbitMQ
# if needed (tests/test_rabbitmq.py), installs what the cluster tests run
# themselves and chromium (browser test), builds .venv, then pytest (extra
# arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/services.sh --rabbitmq --cluster
# Under CI a failed install fails the browser test rather than this script.
bash scripts/browser.sh || echo "chromium install failed" >&2
bash scripts/venv.sh
# Modules run in ASYNCH_TEST_PROCESSES processes (pytest-xdist, a module stays
# in one process: its worker fixtures are module-scoped); each process brings
# its own PostgreSQL, Valkey, Celery queue and API.  0 runs them in this one.
n=${ASYNCH_TEST_PROCESSES:-3}
if [ "$n" = 0 ]; then exec .venv/bin/python -m pytest "$@"; fi
exec .venv/bin/python -m pytest -n "$n" --dist loadfile "$@"
