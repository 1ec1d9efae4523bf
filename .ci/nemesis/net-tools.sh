#!/usr/bin/env bash
# Installs what the nemesis (tests/it/nemesis.rs) makes its partitions with — `ip` (iproute2:
# network namespaces, veth pairs, a bridge) and `nft` (nftables: the drops) — from Debian's
# packages when missing. Idempotent and quiet on success. Without them (or without root) the
# nemesis runs every process on loopback and says it skips its partitions.
set -euo pipefail

missing=()
command -v ip >/dev/null || missing+=(iproute2)
command -v nft >/dev/null || missing+=(nftables)
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" = 0 ]; then
    exec 9>"/tmp/edge-net-tools-install.lock"
    flock 9
    echo "net-tools.sh: installing ${missing[*]} from apt" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null && apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null; }
fi
command -v nft || echo "net-tools.sh: no nft here: the nemesis will skip its partitions" >&2
