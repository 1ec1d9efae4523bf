#!/usr/bin/env bash
# Installs PyPI's `kubernetes-validate` (pinned in requirements.txt beside this script) into
# a venv in a cache outside the clone, and prints the command's path. Idempotent: with the
# venv present it only prints the path. The venv's name holds the requirements' digest, so
# a change of pin makes a new one.
#
#   EDGE_TOOL_CACHE   the cache directory (default: $HOME/.cache/edge-tools)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
DIGEST=$(sha256sum "$HERE/requirements.txt" | cut -c1-12)
CACHE=${EDGE_TOOL_CACHE:-${HOME:?set HOME or EDGE_TOOL_CACHE}/.cache/edge-tools}
VENV=$CACHE/kubernetes-validate-$DIGEST
BIN=$VENV/bin/kubernetes-validate
STAMP=$VENV/.complete

if [[ -f $STAMP && -x $BIN ]]; then
    echo "$BIN"
    exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/kubernetes-validate.lock"
flock 9
if [[ -f $STAMP && -x $BIN ]]; then
    echo "$BIN"
    exit 0
fi

echo "kubernetes-validate.sh: installing $HERE/requirements.txt into $VENV" >&2
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --disable-pip-version-check --quiet -r "$HERE/requirements.txt" >&2
"$BIN" --version >/dev/null
touch "$STAMP"
echo "$BIN"
