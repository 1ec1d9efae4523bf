#!/usr/bin/env bash
# Installs cargo-deb (the Debian packages' builder, docs/install.md) at a pinned version from
# crates.io into a cache outside the clone, and prints the binary's path. Idempotent: with
# the cache present it only prints the path.
#
#   EDGE_TOOL_CACHE   the cache directory (default: $HOME/.cache/edge-tools)
set -euo pipefail

VERSION=3.8.0

CACHE=${EDGE_TOOL_CACHE:-${HOME:?set HOME or EDGE_TOOL_CACHE}/.cache/edge-tools}
PREFIX=$CACHE/cargo-deb-$VERSION
BIN=$PREFIX/bin/cargo-deb
STAMP=$PREFIX/.complete

if [[ -f $STAMP && -x $BIN ]]; then
    echo "$BIN"
    exit 0
fi
mkdir -p "$CACHE"
# One installer at a time, across test binaries, CI and people.
exec 9>"$CACHE/cargo-deb.lock"
flock 9
if [[ -f $STAMP && -x $BIN ]]; then
    echo "$BIN"
    exit 0
fi

echo "cargo-deb.sh: installing cargo-deb $VERSION from crates.io into $PREFIX (a few CPU-minutes, once)" >&2
started=$(date +%s)
# Its own target directory: nothing of the clone's is touched or locked.
CARGO_TARGET_DIR="$CACHE/cargo-deb-build" cargo install --quiet --locked \
    --root "$PREFIX" "cargo-deb@$VERSION" >&2
rm -rf "$CACHE/cargo-deb-build"
"$BIN" --version >/dev/null
touch "$STAMP"
echo "cargo-deb.sh: installed in $(($(date +%s) - started))s" >&2
echo "$BIN"
