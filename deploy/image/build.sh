#!/usr/bin/env bash
# Builds the operator's image on this machine from the repository's own
# Dockerfile, with buildah and no outside registry:
#   - the binary and the policies come from cargo (the `image` profile, as
#     the Dockerfile's build stage builds them), staged by stage.sh into a
#     `binaries` image (the Dockerfile's BINARIES argument);
#   - the runtime base is assembled from the Debian packages distroless cc
#     is made of (libc6, libgcc-s1, ca-certificates) plus its nonroot user
#     (the Dockerfile's RUNTIME argument).
# Output: target/oci/nmo.tar, an OCI archive of localhost/nmo:dev (for
# `ctr images import` or `skopeo copy`); the image's size and digest are
# printed. Timestamps are fixed: the same inputs give the same digest.
# buildah's storage is target/oci/storage, nothing system-wide.
#   deploy/image/build.sh            build (quick when nothing changed)
#   deploy/image/build.sh run CMD..  run CMD in the built image, as its user,
#                                    with no network (runc, through buildah:
#                                    crun refuses a hybrid cgroup v1 layout)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"

need() {
  command -v "$1" >/dev/null || {
    echo "deploy/image/build.sh: $1 not found: $2" >&2
    exit 1
  }
}
need buildah "install it (Debian: apt-get install buildah)"
need dpkg-deb "it comes with dpkg (Debian)"
need apt-get "the runtime base is assembled from Debian packages"

target=${CARGO_TARGET_DIR:-$repo/target}
work=$target/oci
mkdir -p "$work"
bah() {
  buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs "$@"
}

if [ "${1:-}" = run ]; then
  shift
  need runc "install it (Debian: apt-get install runc)"
  c=$(bah from --pull-never --quiet localhost/nmo:dev)
  trap 'bah rm "$c" >/dev/null' EXIT
  bah run --runtime runc --network none --user 65532:65532 "$c" -- "$@"
  exit
fi

echo "== the binary and the policies (cargo, profile image)"
cargo build --profile image --locked -p nmo --no-default-features
rm -rf "$work/out"
deploy/image/stage.sh "$target" "$work/out"

echo "== the runtime base (Debian packages: libc6 libgcc-s1 ca-certificates)"
base=localhost/nmo-runtime-base:debian
if ! bah inspect --type image "$base" >/dev/null 2>&1; then
  debs=$work/debs
  rootfs=$work/rootfs
  rm -rf "$debs" "$rootfs"
  mkdir -p "$debs" "$rootfs"
  chmod 1777 "$debs" # apt-get download writes as _apt where it can
  download() { (cd "$debs" && apt-get download -qq libc6 libgcc-s1 ca-certificates); }
  if ! download; then
    # No package lists yet (a fresh machine): fetch them once, as root.
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && download; else false; fi || {
      echo "deploy/image/build.sh: apt-get download failed: run apt-get update first" >&2
      exit 1
    }
  fi
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$rootfs"; done
  # What distroless's base adds: the nonroot user, /tmp, the CA bundle
  # (ca-certificates' maintainer script would build it).
  mkdir -p "$rootfs/etc/ssl/certs" "$rootfs/home/nonroot" "$rootfs/tmp"
  chmod 1777 "$rootfs/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
  cat "$rootfs"/usr/share/ca-certificates/mozilla/*.crt >"$rootfs/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$rootfs/usr/share/doc" "$rootfs/usr/share/man" "$rootfs/usr/share/lintian"
  c=$(bah from scratch)
  bah copy "$c" "$rootfs" / >/dev/null
  bah config --user 65532:65532 "$c"
  bah commit --quiet --timestamp 0 --rm "$c" "$base" >/dev/null
fi

echo "== the binaries image"
binaries=localhost/nmo-binaries:dev
c=$(bah from scratch)
bah copy "$c" "$work/out" /out >/dev/null
bah commit --quiet --timestamp 0 --rm "$c" "$binaries" >/dev/null

echo "== the image (the repository's Dockerfile)"
bah bud --quiet --timestamp 0 --layers=false -f Dockerfile \
  --build-arg RUNTIME="$base" --build-arg BINARIES="$binaries" \
  -t localhost/nmo:dev . >/dev/null
rm -f "$work/nmo.tar"
bah push --quiet localhost/nmo:dev "oci-archive:$work/nmo.tar:localhost/nmo:dev"

size=$(bah images --format '{{.Size}}' localhost/nmo:dev)
digest=$(tar -xOf "$work/nmo.tar" index.json | sed -n 's/.*"digest":"\(sha256:[0-9a-f]*\)".*/\1/p' | head -1)
echo "image localhost/nmo:dev: $work/nmo.tar ($(du -h "$work/nmo.tar" | cut -f1) archive, ${size// /} unpacked), manifest $digest"
