#!/usr/bin/env bash
# Makes a Debian bookworm root file system with mmdebstrap (`--variant=minbase`) as a tarball
# in a cache outside the clone, and prints its path. Idempotent: with the tarball present it
# only prints the path.
#
#   base-rootfs.sh minbase   the images' base (the Containerfile's BASE, imported locally:
#                            this machine reaches no image registry), with ca-certificates,
#                            which the Containerfile would otherwise install from apt
#   base-rootfs.sh systemd   minbase, systemd and ca-certificates: the throwaway root the
#                            Debian packages are installed into (they depend on
#                            ca-certificates), where `systemd-analyze verify --root` finds
#                            systemd's own units
#
#   EDGE_TOOL_CACHE   the cache directory (default: $HOME/.cache/edge-tools)
set -euo pipefail

FLAVOUR=${1:?usage: base-rootfs.sh minbase|systemd}
SUITE=bookworm
# Bump to make the tarballs anew (Debian's point releases do not change the tests' needs).
RECIPE=r2
case $FLAVOUR in
    minbase) INCLUDE=(--include=ca-certificates) ;;
    systemd) INCLUDE=(--include=systemd,ca-certificates) ;;
    *) echo "base-rootfs.sh: unknown flavour $FLAVOUR (minbase or systemd)" >&2; exit 2 ;;
esac

CACHE=${EDGE_TOOL_CACHE:-${HOME:?set HOME or EDGE_TOOL_CACHE}/.cache/edge-tools}
TARBALL=$CACHE/debian-$SUITE-$FLAVOUR-$RECIPE.tar

if [[ -f $TARBALL ]]; then
    echo "$TARBALL"
    exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/base-rootfs-$FLAVOUR.lock"
flock 9
if [[ -f $TARBALL ]]; then
    echo "$TARBALL"
    exit 0
fi

bash "$(dirname "$0")/image-tools.sh" >/dev/null
echo "base-rootfs.sh: making a $SUITE $FLAVOUR root with mmdebstrap (1-2 minutes, once)" >&2
started=$(date +%s)
mmdebstrap --quiet --format=tar --variant=minbase "${INCLUDE[@]}" "$SUITE" "$TARBALL.part" >&2
mv "$TARBALL.part" "$TARBALL"
echo "base-rootfs.sh: made $TARBALL in $(($(date +%s) - started))s" >&2
echo "$TARBALL"
