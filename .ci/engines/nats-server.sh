#!/usr/bin/env bash
# Installs NATS's `nats-server` from Debian's package when it is missing and prints its
# path. Idempotent and quiet on success. See docs/engines.md.
set -euo pipefail

if ! command -v nats-server >/dev/null; then
    exec 9>"/tmp/edge-nats-server-install.lock"
    flock 9
    if ! command -v nats-server >/dev/null; then
        echo "nats-server.sh: installing nats-server from apt" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get -o DPkg::Lock::Timeout=600 install -y -qq nats-server >/dev/null 2>&1 ||
            { apt-get update -qq >/dev/null && apt-get -o DPkg::Lock::Timeout=600 install -y -qq nats-server >/dev/null; }
    fi
fi
command -v nats-server
