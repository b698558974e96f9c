#!/usr/bin/env bash
# Installs Debian's chromium for the report's browser test (tests/test_report.py, part of
# `make test-e2e`; skipped, saying so, without a browser). Needs root and a reachable apt mirror;
# a failure here only means that test is skipped.
set -uo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  echo "chromium: $(chromium --version 2>/dev/null || chromium-browser --version 2>/dev/null)"
elif [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
  if timeout 600 bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium' >/tmp/ci-chromium.log 2>&1; then
    echo "chromium installed: $(chromium --version 2>/dev/null)"
  else
    echo "chromium NOT installed (apt failed, see below): the report's browser test will be skipped"
    tail -5 /tmp/ci-chromium.log || true
  fi
else
  echo "chromium NOT installed (not root or no apt-get): the report's browser test will be skipped"
fi
exit 0
