#!/usr/bin/env bash
# Installs the agent harnesses the tests drive the edge with — Claude Code and the Codex
# CLI, from npm at pinned versions — into a cache outside the clone, and prints the
# directory holding their `claude` and `codex` commands. Idempotent: with the cache present
# it only prints the path. Installs Node.js and npm from apt when they are missing.
#
#   EDGE_CLIENT_CACHE   the cache directory (default: $HOME/.cache/edge-clients)
set -euo pipefail

CLAUDE_CODE=2.1.332
CODEX=0.171.0

CACHE=${EDGE_CLIENT_CACHE:-${HOME:?set HOME or EDGE_CLIENT_CACHE}/.cache/edge-clients}
PREFIX=$CACHE/agents-claude-$CLAUDE_CODE-codex-$CODEX
BIN=$PREFIX/node_modules/.bin
STAMP=$PREFIX/.complete

if [[ -f $STAMP ]]; then
    echo "$BIN"
    exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/agents.lock"
flock 9
if [[ -f $STAMP ]]; then
    echo "$BIN"
    exit 0
fi

if ! command -v npm >/dev/null; then
    echo "agents.sh: installing Node.js and npm from apt" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq nodejs npm >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null && apt-get -o DPkg::Lock::Timeout=600 install -y -qq nodejs npm >/dev/null; }
fi
echo "agents.sh: installing @anthropic-ai/claude-code@$CLAUDE_CODE and @openai/codex@$CODEX from npm" >&2
rm -rf "$PREFIX"
mkdir -p "$PREFIX"
cd "$PREFIX"
echo '{"private": true}' > package.json
npm install --no-audit --no-fund --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_CODE" "@openai/codex@$CODEX" >&2
"$BIN/claude" --version >/dev/null
"$BIN/codex" --version >/dev/null
touch "$STAMP"
echo "$BIN"
