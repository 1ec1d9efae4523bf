#!/usr/bin/env bash
# Installs Debian's `chromium` and `chromium-driver` when missing (the browser the console's
# tests in tests/it/console_web.rs drive through Selenium) and prints chromedriver's path.
# Idempotent and quiet on success.
set -euo pipefail

if ! command -v chromium >/dev/null || ! [ -x /usr/bin/chromedriver ]; then
    exec 9>"/tmp/edge-browser-install.lock"
    flock 9
    if ! command -v chromium >/dev/null || ! [ -x /usr/bin/chromedriver ]; then
        echo "browser.sh: installing chromium and chromium-driver from apt" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium chromium-driver fonts-dejavu-core >/dev/null 2>&1 ||
            { apt-get update -qq >/dev/null && apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium chromium-driver fonts-dejavu-core >/dev/null; }
    fi
fi
echo /usr/bin/chromedriver
