#!/bin/sh
# Stages what the image carries, from a cargo build directory (the `image` profile): the operator
# binary at OUT/nmo and every shipped policy (policies/default and each of
# policies/examples, not the test policies) at OUT/policies/<name>.wasm,
# and OUT/links/manager -> nmo: the Go operator's Deployments run
# `/manager`, so swapping this image into one (OLM's, say) runs nmo.
# The Dockerfile's build stage and deploy/image/build.sh both call it, so
# the image built here and the one built elsewhere carry the same files.
#   deploy/image/stage.sh <cargo target dir> <out dir>
set -eu
target=$1
out=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out/policies"
cp "$target/image/nmo" "$out/nmo"
mkdir -p "$out/links"
ln -sfn nmo "$out/links/manager"
for dir in "$here/policies/default" "$here"/policies/examples/*/; do
  name=$(basename "$dir")
  crate=$(echo "$name" | tr - _)
  cp "$target/policies/wasm32-wasip2/policy/nmo_policy_$crate.wasm" "$out/policies/$name.wasm"
done
