#!/usr/bin/env bash
# Installs Debian's `mmdebstrap` (makes the Debian roots the packaging tests install into and
# build images on) and `buildah` (builds the Containerfile's images without a daemon) when
# they are missing, and prints buildah's path. Idempotent and quiet on success. See
# docs/install.md.
set -euo pipefail

if ! command -v mmdebstrap >/dev/null || ! command -v buildah >/dev/null; then
    exec 9>"/tmp/edge-image-tools-install.lock"
    flock 9
    if ! command -v mmdebstrap >/dev/null || ! command -v buildah >/dev/null; then
        echo "image-tools.sh: installing mmdebstrap and buildah from apt" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get -o DPkg::Lock::Timeout=600 install -y -qq mmdebstrap buildah >/dev/null 2>&1 ||
            { apt-get update -qq >/dev/null && apt-get -o DPkg::Lock::Timeout=600 install -y -qq mmdebstrap buildah >/dev/null; }
    fi
fi
command -v buildah
