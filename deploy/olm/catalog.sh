#!/usr/bin/env bash
# Makes a file-based OLM catalog of the bundle beside this script, with
# operator-registry's opm (its releases, or `go install
# github.com/operator-framework/operator-registry/cmd/opm@v1.65.0`):
#
#   deploy/olm/catalog.sh IMAGE [OUT]
#
# IMAGE: the operator's image the ClusterServiceVersion is to run (the
# bundle names nmo:latest). OUT: the catalog's folder (default: catalog),
# written as OUT/index.yaml: the package, its stable channel and the
# bundle, its manifests inline (so OLM needs no bundle image to unpack).
# Serve it with `opm serve OUT` or a catalog image (`opm generate
# dockerfile OUT`), and point a CatalogSource at it: docs/install.md.
# host/tests/olm_install.rs runs this script and installs what it makes through a
# real OLM.
set -euo pipefail
if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 IMAGE [OUT]" >&2
  exit 2
fi
image="$1"
out="${2:-catalog}"
here="$(cd "$(dirname "$0")" && pwd)"
if ! command -v opm >/dev/null; then
  echo "catalog.sh: no 'opm' on the PATH (operator-registry's: https://github.com/operator-framework/operator-registry/releases)" >&2
  exit 2
fi
package=node-maintenance-operator
csv="$here/bundle/manifests/$package.clusterserviceversion.yaml"
name="$(sed -n 's/^  name: \('"$package"'\.v.*\)$/\1/p' "$csv")"
if [[ -z "$name" ]]; then
  echo "catalog.sh: no ClusterServiceVersion name in $csv" >&2
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r "$here/bundle" "$work/bundle"
# The image, where the CSV names it (the container and its annotation).
sed -i "s|\\([: ]\\)nmo:latest\$|\\1$image|" "$work/bundle/manifests/$package.clusterserviceversion.yaml"
if grep -q 'nmo:latest' "$work/bundle/manifests/$package.clusterserviceversion.yaml"; then
  echo "catalog.sh: the image was not set everywhere in the CSV" >&2
  exit 1
fi

mkdir -p "$out"
{
  opm init "$package" --default-channel=stable -o yaml
  opm render "$work/bundle" -o yaml
  printf -- '---\nschema: olm.channel\npackage: %s\nname: stable\nentries:\n- name: %s\n' "$package" "$name"
} >"$out/index.yaml"
opm validate "$out"
echo "catalog.sh: $out/index.yaml: $name, running $image" >&2
