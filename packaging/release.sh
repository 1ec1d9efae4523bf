#!/usr/bin/env bash
# Builds the release archive: dist/edge-<version>-<target>.tar.gz holding both binaries
# (edge, edge-node), the packaged config (config/edge.toml: no node defined), the node's
# settings example, the systemd units, the licences and README, and writes its SHA-256 into
# dist/SHA256SUMS. Run from anywhere in the clone; see docs/install.md.
#
#   packaging/release.sh                    cargo build --release, then the archive
#   packaging/release.sh --no-build         the binaries already in target/release
#   packaging/release.sh --profile dev --no-build --out DIR
#                                           the tests' debug binaries, into DIR (the tests)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PROFILE=release
BUILD=yes
OUT=$ROOT/dist
while (($#)); do
    case $1 in
        --profile) PROFILE=${2:?--profile needs a name}; shift 2 ;;
        --no-build) BUILD=no; shift ;;
        --out) OUT=${2:?--out needs a directory}; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "release.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case $PROFILE in
    dev) PROFILE_DIR=debug ;;
    *) PROFILE_DIR=$PROFILE ;;
esac

cd "$ROOT"
VERSION=$(sed -n '/^\[package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
TARGET=$(rustc -vV | sed -n 's/^host: //p')
[[ -n $VERSION && -n $TARGET ]] || { echo "release.sh: cannot read the version or the target" >&2; exit 1; }
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET_DIR/$PROFILE_DIR

if [[ $BUILD == yes ]]; then
    cargo build --locked --profile "$PROFILE" -p edge -p edge-node --bins
fi
for binary in edge edge-node; do
    [[ -x $BIN/$binary ]] || { echo "release.sh: $BIN/$binary is missing (build it, or drop --no-build)" >&2; exit 1; }
done

NAME=edge-$VERSION-$TARGET
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
DIR=$STAGE/$NAME
mkdir -p "$DIR/config" "$DIR/systemd"
install -m 0755 "$BIN/edge" "$BIN/edge-node" "$DIR/"
# Without debug sections (a release build has none; a dev build's are most of its size).
if command -v strip >/dev/null; then
    strip --strip-debug "$DIR/edge" "$DIR/edge-node"
fi
install -m 0644 packaging/edge.toml "$DIR/config/edge.toml"
install -m 0644 packaging/node.env "$DIR/node.env"
install -m 0644 packaging/systemd/edge.service packaging/systemd/edge-node.service "$DIR/systemd/"
install -m 0644 README.md LICENSE-MIT LICENSE-APACHE "$DIR/"
install -m 0644 docs/install.md "$DIR/INSTALL.md"

mkdir -p "$OUT"
ARCHIVE=$NAME.tar.gz
# The same bytes for the same inputs: sorted names, no owners, the last commit's time.
EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$EPOCH" \
    -C "$STAGE" -cf - "$NAME" | gzip -n > "$OUT/$ARCHIVE.part"
mv "$OUT/$ARCHIVE.part" "$OUT/$ARCHIVE"
# SHA256SUMS lists every archive in OUT; this one's line is replaced.
cd "$OUT"
{ grep -v "  $ARCHIVE\$" SHA256SUMS 2>/dev/null || true; sha256sum "$ARCHIVE"; } | sort -k 2 > SHA256SUMS.part
mv SHA256SUMS.part SHA256SUMS
echo "$OUT/$ARCHIVE"
