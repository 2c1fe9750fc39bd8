#!/usr/bin/env bash
# Install Debian's chromium for the console's browser test (Playwright drives
# it by executable path; `playwright install` is never used), and a CJK font:
# the test renders Chinese payloads and remarks, which are boxes without one.
# Idempotent.
set -euo pipefail
have_font() { command -v fc-list >/dev/null && fc-list :lang=zh | grep -q .; }
[ -x /usr/bin/chromium ] && have_font && exit 0
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-noto-cjk fontconfig >/dev/null
else
  echo "chromium or a CJK font missing: install Debian's chromium and fonts-noto-cjk for the browser test" >&2
fi
