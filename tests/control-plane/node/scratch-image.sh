#!/usr/bin/env bash
# Writes an image of one static binary: FROM scratch, the binary at PATH
# (its entrypoint), run as USER, as an OCI archive for `ctr images
# import`. The real node's sandbox image (node/pause) is made this way,
# and tests make others (the Go operator's) the same way. buildah's
# storage is a temporary folder. Each further FILE:AT is copied in too
# (executable), and PATH is /bin.
#   scratch-image.sh BINARY OUT.tar NAME [PATH [USER [FILE:AT ...]]]
set -euo pipefail
binary=$1 out=$2 name=$3 path=${4:-/pause} user=${5:-65535:65535}
shift $(($# < 5 ? $# : 5))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bah() { buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs "$@"; }
c=$(bah from scratch)
bah copy --chmod 0755 "$c" "$binary" "$path" >/dev/null
for extra in "$@"; do
  bah copy --chmod 0755 "$c" "${extra%%:*}" "${extra#*:}" >/dev/null
done
bah config --entrypoint "[\"$path\"]" --user "$user" --env PATH=/bin "$c"
bah commit --quiet --timestamp 0 --rm "$c" "$name" >/dev/null
bah push --quiet "$name" "oci-archive:$out:$name"
