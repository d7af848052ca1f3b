#!/usr/bin/env bash
# Writes the real node's sandbox image: FROM scratch, the pause binary the
# control plane's build made (node/pause), as an OCI archive for
# `ctr images import`. buildah's storage is a temporary folder.
#   pause-image.sh PAUSE_BINARY OUT.tar NAME
set -euo pipefail
pause=$1 out=$2 name=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bah() { buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs "$@"; }
c=$(bah from scratch)
bah copy --chmod 0755 "$c" "$pause" /pause >/dev/null
bah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
bah commit --quiet --timestamp 0 --rm "$c" "$name" >/dev/null
bah push --quiet "$name" "oci-archive:$out:$name"
