#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (CPU only, static) from the llama.cpp tree vendored in
# the pinned PyPI sdist of llama-cpp-python, into a cache outside the clone, and prints the
# binary's path. Idempotent: with the cache present it only prints the path. Also keeps the
# sdist's vocab-only GGUF files and its `gguf-py` package next to the binary, for
# tests/python/make_tiny_model.py. See docs/engines.md.
#
#   EDGE_ENGINE_CACHE   the cache directory (default: $HOME/.cache/edge-engines)
#   EDGE_ENGINE_JOBS    parallel compile jobs (default: the number of cores)
set -euo pipefail

VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
URL=https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-$VERSION.tar.gz
# Bump when the build flags below change: a new recipe builds into a new directory.
RECIPE=r1

CACHE=${EDGE_ENGINE_CACHE:-${HOME:?set HOME or EDGE_ENGINE_CACHE}/.cache/edge-engines}
PREFIX=$CACHE/llama.cpp-$VERSION-$RECIPE
BIN=$PREFIX/bin/llama-server
STAMP=$PREFIX/.complete

if [[ -f $STAMP && -x $BIN ]]; then
    echo "$BIN"
    exit 0
fi

mkdir -p "$CACHE"
# One installer at a time, across test binaries, CI and people.
exec 9>"$CACHE/llama-server.lock"
flock 9
if [[ -f $STAMP && -x $BIN ]]; then
    echo "$BIN"
    exit 0
fi

log() { echo "llama-server.sh: $*" >&2; }

if ! command -v cmake >/dev/null; then
    log "installing cmake from apt"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq cmake >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null && apt-get -o DPkg::Lock::Timeout=600 install -y -qq cmake >/dev/null; }
fi

SDIST=$CACHE/downloads/llama_cpp_python-$VERSION.tar.gz
if ! echo "$SHA256  $SDIST" | sha256sum --check --status 2>/dev/null; then
    log "downloading llama-cpp-python $VERSION sdist"
    mkdir -p "$CACHE/downloads"
    curl --fail --silent --show-error --location --retry 3 -o "$SDIST.part" "$URL"
    if ! echo "$SHA256  $SDIST.part" | sha256sum --check --status; then
        rm -f "$SDIST.part"
        log "checksum mismatch for $URL (expected $SHA256)"
        exit 1
    fi
    mv "$SDIST.part" "$SDIST"
fi

WORK=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
tar -xzf "$SDIST" -C "$WORK" "llama_cpp_python-$VERSION/vendor/llama.cpp"
SRC=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp

# Only what llama-server needs: no tests, examples, web UI (neither npm nor a download),
# HTTPS, OpenMP or GPU backends; a portable x86-64-v3 (AVX2/FMA/F16C) baseline instead of
# -march=native, so a cache restored onto another CPU still runs; static libraries so the
# binary stands alone.
FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=OFF
    -DGGML_OPENMP=OFF
    -DGGML_LLAMAFILE=OFF
    -DGGML_CCACHE=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_ALL_WARNINGS=OFF
    -DGGML_ALL_WARNINGS=OFF
)
JOBS=${EDGE_ENGINE_JOBS:-$(nproc)}
log "building llama-server from llama-cpp-python $VERSION with $JOBS jobs (about 11 CPU-minutes; 16-32 min on a busy 2-core machine); log in $PREFIX.build.log"
started=$(date +%s)
if ! {
    cmake -S "$SRC" -B "$WORK/build" "${FLAGS[@]}" &&
        cmake --build "$WORK/build" --target llama-server -j "$JOBS"
} >"$PREFIX.build.log" 2>&1; then
    log "build failed; the last lines of $PREFIX.build.log:"
    tail -n 30 "$PREFIX.build.log" >&2
    exit 1
fi
seconds=$(($(date +%s) - started))

rm -rf "$PREFIX"
mkdir -p "$PREFIX/bin" "$PREFIX/models"
cp "$WORK/build/bin/llama-server" "$BIN"
cp "$SRC"/models/ggml-vocab-*.gguf "$PREFIX/models/"
cp -r "$SRC/gguf-py" "$PREFIX/gguf-py"
"$BIN" --version >/dev/null 2>&1 || { log "$BIN does not run"; exit 1; }
{
    echo "source: llama-cpp-python $VERSION sdist ($URL)"
    echo "sha256: $SHA256"
    echo "cmake flags: ${FLAGS[*]}"
    echo "build seconds: $seconds (jobs $JOBS, $(nproc) cores)"
} >"$PREFIX/BUILD-INFO"
mv "$PREFIX.build.log" "$PREFIX/build.log"
touch "$STAMP"
log "built in ${seconds}s"
echo "$BIN"
