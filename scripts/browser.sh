#!/usr/bin/env bash
# Install Debian's chromium for the console's browser test (Playwright drives
# it by executable path; `playwright install` is never used).  Idempotent.
set -euo pipefail
[ -x /usr/bin/chromium ] && exit 0
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "chromium missing: install Debian's chromium package for the browser test" >&2
fi
