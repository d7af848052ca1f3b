#!/usr/bin/env bash
# Builds the real control plane (versions.env) into a cache folder the build
# reuses, keyed by the pinned versions and the wrapper sources:
#   ${NMO_CONTROL_PLANE_CACHE:-~/.cache/nmo-control-plane}/<key>/bin
# Prints that bin folder on its last line. Needs Go and the module proxy.
# Safe to run from several processes at once (one builds, the rest wait).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

if ! command -v go >/dev/null; then
  echo "control-plane: no 'go' on the PATH: the real control plane is built from Go modules (Go 1.26 or later, and the module proxy)" >&2
  exit 2
fi

root="${NMO_CONTROL_PLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nmo-control-plane}"
key="$(cd "$here" && cat versions.env build.sh $(find . -name '*.go' -o -name '*.yaml' | sort) | sha256sum | cut -c1-16)"
dir="$root/$key"
bin="$dir/bin"
want=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy pause kwok kwok-stages.yaml cert-manager-controller cert-manager-cainjector cert-manager-crds.yaml kube-state-metrics node-maintenance-operator node-maintenance-operator-e2e node-maintenance-operator-crd.yaml node-maintenance-operator-csv.yaml prometheus-operator-crds.yaml prometheus-operator-crds-all.yaml prometheus-operator prometheus-config-reloader prometheus helm operator-verify registry crane olm catalog cpb opm olm-crds.yaml)

complete() {
  for b in "${want[@]}"; do [[ -s "$bin/$b" ]] || return 1; done
}

mkdir -p "$root"
exec 9>"$root/.lock"
if ! complete; then
  if ! flock -n 9; then
    echo "control-plane: another process is building $dir; waiting" >&2
    flock 9
  fi
fi
if complete; then
  echo "$bin"
  exit 0
fi

start=$SECONDS
echo "control-plane: building Kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, cert-manager $CERT_MANAGER_VERSION, kube-state-metrics $KUBE_STATE_METRICS_VERSION, the Prometheus Operator $PROMETHEUS_OPERATOR_VERSION, Prometheus $PROMETHEUS_VERSION, the Go Node Maintenance Operator $NODE_MAINTENANCE_OPERATOR_VERSION, helm $HELM_VERSION, operator-verify $OPERATOR_FRAMEWORK_API_VERSION, Distribution $DISTRIBUTION_VERSION, crane $GO_CONTAINERREGISTRY_VERSION, OLM $OLM_VERSION, opm $OPERATOR_REGISTRY_VERSION into $dir (cold, with empty Go caches: 10 to 15 minutes on 2 cores; once built, reused)" >&2
rm -rf "$dir.tmp"
mkdir -p "$dir.tmp/bin" "$dir.tmp/src"
out="$dir.tmp/bin"
export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
ld="-s -w"

step() { echo "control-plane: [$((SECONDS - start))s] $*" >&2; }
# Runs a command, showing its output only when it fails.
quiet() {
  local log
  log="$(mktemp)"
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

# Kubernetes, from a wrapper module.
k="$dir.tmp/src/kubernetes"
mkdir -p "$k"
minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
{
  echo "module nmo.invalid/control-plane/kubernetes"
  echo
  echo "go 1.25.0"
  echo
  echo "replace ("
  for m in api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider \
    cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api \
    cri-client csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms \
    kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics \
    mount-utils pod-security-admission sample-apiserver sample-cli-plugin sample-controller; do
    echo "	k8s.io/$m => k8s.io/$m $KUBERNETES_STAGING_VERSION"
  done
  echo ")"
} >"$k/go.mod"
step "Kubernetes: resolving modules"
(cd "$k" && quiet go get -tool \
  "k8s.io/kubernetes/cmd/kube-apiserver@$KUBERNETES_VERSION" \
  "k8s.io/kubernetes/cmd/kube-controller-manager@$KUBERNETES_VERSION" \
  "k8s.io/kubernetes/cmd/kube-scheduler@$KUBERNETES_VERSION" \
  "k8s.io/kubernetes/cmd/kubelet@$KUBERNETES_VERSION" \
  "k8s.io/kubernetes/cmd/kube-proxy@$KUBERNETES_VERSION")
v=k8s.io/component-base/version
kld="$ld -X $v.gitVersion=$KUBERNETES_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
step "Kubernetes: building kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy"
(cd "$k" && go build -trimpath -ldflags "$kld" -o "$out/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)

# The pod sandbox's process for the real node's containerd (node/pause).
p="$dir.tmp/src/pause"
mkdir -p "$p"
cp "$here/node/pause/main.go" "$p/"
printf 'module nmo.invalid/control-plane/pause\n\ngo 1.26.0\n' >"$p/go.mod"
step "pause: building"
(cd "$p" && go build -trimpath -ldflags "$ld" -o "$out/pause" .)

# etcd, from its server module's own main package.
e="$dir.tmp/src/etcd"
mkdir -p "$e"
cp "$here/etcd/main.go" "$e/"
printf 'module nmo.invalid/control-plane/etcd\n\ngo 1.26.0\n' >"$e/go.mod"
step "etcd: resolving modules"
(cd "$e" && quiet go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" && quiet go mod tidy)
step "etcd: building"
(cd "$e" && go build -trimpath -ldflags "$ld" -o "$out/etcd" .)

# kwok: its module has no replace directives, so it installs as it is.
step "kwok: building"
GOBIN="$out" go install -trimpath -ldflags "$ld -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
# Its stages: kwok's own fast node and pod stages, node heartbeats with a
# lease, and the pod deletion of kwok/pod-delete.yaml (a grace period kept).
# The fast pod-ready stage gets the delay kwok's general one takes from the
# pod's annotation pod-ready.stage.kwok.x-k8s.io/delay ("2s"; none: at
# once), so a benchmark's replacements can take their time to be Ready.
stages="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml; do
  if [[ "$f" == pod/fast/pod-ready.yaml ]]; then
    awk -v delay="$(cat "$here/kwok/pod-ready-delay.yaml")" \
      '/^  next:/ && !done { print delay; done = 1 } { print }' "$stages/$f"
  else
    cat "$stages/$f"
  fi
  echo "---"
done >"$out/kwok-stages.yaml"
cat "$here/kwok/pod-delete.yaml" >>"$out/kwok-stages.yaml"

# cert-manager: the controller and the cainjector, wired from the library.
c="$dir.tmp/src/cert-manager"
mkdir -p "$c"
cp -r "$here/cert-manager/." "$c/"
printf 'module nmo.invalid/control-plane/cert-manager\n\ngo 1.26.0\n' >"$c/go.mod"
step "cert-manager: resolving modules"
(cd "$c" && quiet go get "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION" && quiet go mod tidy)
step "cert-manager: building the controller and the cainjector"
(cd "$c" && go build -trimpath -ldflags "$ld" -o "$out/cert-manager-controller" ./controller &&
  go build -trimpath -ldflags "$ld" -o "$out/cert-manager-cainjector" ./cainjector)
cat "$(go env GOMODCACHE)/github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION"/deploy/crds/*.yaml >"$out/cert-manager-crds.yaml"

# A module's main package, built from a wrapper module that requires the
# exact version: `go install name@version` first asks the proxy for the
# module's version list, which it does not serve for some modules.
#   wrapped_main LABEL NAME MODULE@VERSION PACKAGE EXTRA_LDFLAGS [BUILD_TAGS]
wrapped_main() {
  local label="$1" name="$2" module="$3" package="$4" ldflags="$5" tags="${6:-}"
  local w="$dir.tmp/src/$name"
  mkdir -p "$w"
  printf 'module nmo.invalid/control-plane/%s\n\ngo 1.26.0\n' "$name" >"$w/go.mod"
  step "$label: resolving modules"
  (cd "$w" && quiet go get -tool "$module")
  step "$label: building"
  (cd "$w" && go build -trimpath -tags "$tags" -ldflags "$ld $ldflags" -o "$out/$name" "$package")
}

wrapped_main kube-state-metrics kube-state-metrics "k8s.io/kube-state-metrics/v2@$KUBE_STATE_METRICS_VERSION" \
  k8s.io/kube-state-metrics/v2 "-X github.com/prometheus/common/version.Version=${KUBE_STATE_METRICS_VERSION#v}"

# The Go Node Maintenance Operator, from a wrapper module that replaces the
# k8s.io staging modules its go.mod pins (v0.34.7: kubectl and cli-runtime
# are not served) with a served patch release; its CRD and its OLM bundle's
# ClusterServiceVersion (whose Deployment the drop-in test runs) as its
# release ships them.
w="$dir.tmp/src/node-maintenance-operator"
mkdir -p "$w"
{
  printf 'module nmo.invalid/control-plane/node-maintenance-operator\n\ngo 1.26.0\n\nreplace (\n'
  for m in api apimachinery client-go kubectl cli-runtime component-base component-helpers \
    apiextensions-apiserver apiserver metrics code-generator; do
    printf '\tk8s.io/%s => k8s.io/%s %s\n' "$m" "$m" "$NODE_MAINTENANCE_OPERATOR_STAGING_VERSION"
  done
  printf ')\n'
} >"$w/go.mod"
step "the Go Node Maintenance Operator: resolving modules"
(cd "$w" && quiet go get -tool "github.com/medik8s/node-maintenance-operator/cmd@$NODE_MAINTENANCE_OPERATOR_VERSION")
step "the Go Node Maintenance Operator: building"
(cd "$w" && go build -trimpath -ldflags "$ld" -o "$out/node-maintenance-operator" github.com/medik8s/node-maintenance-operator/cmd)
nmo_go="$(go env GOMODCACHE)/github.com/medik8s/node-maintenance-operator@$NODE_MAINTENANCE_OPERATOR_VERSION"
# Its own e2e suite (test/e2e), compiled as a test binary that
# host/tests/real_node.rs runs against nmo in the Go operator's Deployment.
# Built from a writable copy of the module (the suite imports the module's
# internal packages, so it builds only inside it), with one change, said
# in docs/drop-in.md: its test Deployment's pod carries kwok's delete-delay
# annotation for its grace period (kwok runs no process; on a real node,
# busybox's shell as PID 1 ignores SIGTERM and takes the grace period,
# which the suite relies on to see a drain attempt time out).
step "the Go Node Maintenance Operator's e2e suite: building"
e2e="$dir.tmp/src/node-maintenance-operator-e2e"
cp -r "$nmo_go" "$e2e"
chmod -R u+w "$e2e"
for m in api apimachinery client-go kubectl cli-runtime component-base component-helpers \
  apiextensions-apiserver apiserver metrics code-generator; do
  (cd "$e2e" && go mod edit -replace "k8s.io/$m=k8s.io/$m@$NODE_MAINTENANCE_OPERATOR_STAGING_VERSION")
done
suite="$e2e/test/e2e/node_maintenance_test.go"
grep -q '^					Labels:    podLabel,$' "$suite"
sed -i 's|^					Labels:    podLabel,$|&\n					Annotations: map[string]string{"pod-delete.stage.kwok.x-k8s.io/delay": fmt.Sprintf("%ds", int64(nodemaintenance.DrainerTimeout.Seconds())+50)},|' "$suite"
(cd "$e2e" && quiet go test -c -trimpath -ldflags "$ld" -o "$out/node-maintenance-operator-e2e" ./test/e2e)
cp "$nmo_go/config/crd/bases/nodemaintenance.medik8s.io_nodemaintenances.yaml" "$out/node-maintenance-operator-crd.yaml"
cp "$nmo_go/bundle/manifests/node-maintenance-operator.clusterserviceversion.yaml" "$out/node-maintenance-operator-csv.yaml"

# Helm, for the chart's tests (host/tests/helm.rs, real_deploy.rs).
wrapped_main helm helm "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" helm.sh/helm/v4/cmd/helm \
  "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"

# operator-verify, for the OLM bundle's test (host/tests/olm.rs).
wrapped_main operator-verify operator-verify \
  "github.com/operator-framework/api/cmd/operator-verify@$OPERATOR_FRAMEWORK_API_VERSION" \
  github.com/operator-framework/api/cmd/operator-verify ""

# The registry (CNCF Distribution) and crane, for host/tests/oci.rs.
wrapped_main "the Distribution registry" registry \
  "github.com/distribution/distribution/v3/cmd/registry@$DISTRIBUTION_VERSION" \
  github.com/distribution/distribution/v3/cmd/registry \
  "-X github.com/distribution/distribution/v3/version.version=$DISTRIBUTION_VERSION"
wrapped_main crane crane "github.com/google/go-containerregistry/cmd/crane@$GO_CONTAINERREGISTRY_VERSION" \
  github.com/google/go-containerregistry/cmd/crane ""

# OLM's olm and catalog operators, its cpb (what its bundle unpack Job runs
# in the bundle's image) and opm, from one wrapper module (their image code
# built with the pure-Go OpenPGP, as CGO is off); OLM's CRDs as its release
# ships them.
o="$dir.tmp/src/olm"
mkdir -p "$o"
printf 'module nmo.invalid/control-plane/olm\n\ngo 1.26.0\n' >"$o/go.mod"
olm_pkg=github.com/operator-framework/operator-lifecycle-manager
opm_pkg=github.com/operator-framework/operator-registry
step "OLM and opm: resolving modules"
(cd "$o" && quiet go get -tool "$olm_pkg/cmd/olm@$OLM_VERSION" "$olm_pkg/cmd/catalog@$OLM_VERSION" \
  "$opm_pkg/cmd/opm@$OPERATOR_REGISTRY_VERSION")
step "OLM and opm: building"
(cd "$o" && go build -trimpath -tags containers_image_openpgp \
  -ldflags "$ld -X $olm_pkg/pkg/version.OLMVersion=${OLM_VERSION#v} -X $opm_pkg/cmd/opm/version.opmVersion=$OPERATOR_REGISTRY_VERSION" \
  -o "$out/" "$olm_pkg/cmd/olm" "$olm_pkg/cmd/catalog" "$olm_pkg/util/cpb" "$opm_pkg/cmd/opm")
for f in "$(go env GOMODCACHE)/$olm_pkg@$OLM_VERSION"/deploy/chart/crds/*.yaml; do
  cat "$f"
  echo "---"
done >"$out/olm-crds.yaml"

# The Prometheus Operator: its operator and config reloader, and its CRDs
# (the two the shipped objects use, and all of them for the operator to
# run); Prometheus itself with Kubernetes service discovery only.
po_pkg=github.com/prometheus-operator/prometheus-operator
wrapped_main "the Prometheus Operator" prometheus-operator "$po_pkg/cmd/operator@$PROMETHEUS_OPERATOR_VERSION" \
  "$po_pkg/cmd/operator" "-X github.com/prometheus/common/version.Version=${PROMETHEUS_OPERATOR_VERSION#v}"
(cd "$dir.tmp/src/prometheus-operator" && go build -trimpath \
  -ldflags "$ld -X github.com/prometheus/common/version.Version=${PROMETHEUS_OPERATOR_VERSION#v}" \
  -o "$out/prometheus-config-reloader" "$po_pkg/cmd/prometheus-config-reloader")
po="$(go env GOMODCACHE)/$po_pkg@$PROMETHEUS_OPERATOR_VERSION"
for k in servicemonitors prometheusrules; do
  cat "$po/example/prometheus-operator-crd/monitoring.coreos.com_$k.yaml"
  echo "---"
done >"$out/prometheus-operator-crds.yaml"
for f in "$po"/example/prometheus-operator-crd/monitoring.coreos.com_*.yaml; do
  cat "$f"
  echo "---"
done >"$out/prometheus-operator-crds-all.yaml"
prom_minor="${PROMETHEUS_VERSION#v0.}"; prom_minor="${prom_minor%%.*}"
wrapped_main Prometheus prometheus "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION" \
  github.com/prometheus/prometheus/cmd/prometheus \
  "-X github.com/prometheus/common/version.Version=$((prom_minor / 100)).$((prom_minor % 100)).${PROMETHEUS_VERSION##*.}" \
  remove_all_sd,enable_kubernetes_sd

rm -rf "$dir"
mv "$dir.tmp" "$dir"
# Builds of other versions not used for a week go.
find "$root" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -mtime +7 -exec rm -rf {} + 2>/dev/null || true
step "built into $bin ($(du -sh "$bin" | cut -f1) of binaries)"
echo "$bin"
