//! The OLM bundle (`deploy/olm/bundle`) is generated from `deploy/default`
//! as kustomize renders it, so the two never drift: a
//! ClusterServiceVersion whose install strategy is the operator's
//! Deployment, whose permissions are the shipped RBAC and whose webhook is
//! the shipped ValidatingWebhookConfiguration; the CRD; and the objects
//! OLM installs beside them (the metrics Service, the metrics-reader
//! ClusterRole, the operator's PodDisruptionBudget). These tests check the
//! bundle on disk is that generation, and that the Operator Framework's
//! own validator (`operator-verify`, built with the control plane: the
//! library `operator-sdk bundle validate` runs) finds no error in it.
//!
//! What OLM does differently from `deploy/default`, and why:
//! - OLM issues and mounts the webhook's certificate (at the path the
//!   operator reads, `/tmp/k8s-webhook-server/serving-certs`): the
//!   Deployment's cert-manager volume is left out.
//! - A CSV cannot hold a Role in another namespace: the node leases'
//!   rights (a Role in `medik8s-leases` in `deploy/leases`) become cluster
//!   permissions, as the Go operator's are; and OLM creates no namespace:
//!   `medik8s-leases` must exist (the Go operator's install makes it).
//! - No policies ConfigMap: the operator decides with its embedded
//!   default policy until one is added (`nmo policy add`); the volume is
//!   optional.
//!
//! A real OLM installs it in `olm_install.rs`.
//!
//! After a change under `deploy/`: `NMO_WRITE_BUNDLE=1 cargo test -p nmo
//! --test suite olm::` rewrites the bundle.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");
pub(crate) const PACKAGE: &str = "node-maintenance-operator";

pub(crate) fn bundle_dir() -> PathBuf {
    common::real::deploy_dir().join("olm/bundle")
}

fn kind(o: &Value) -> &str {
    o["kind"].as_str().unwrap_or_default()
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or_default()
}

/// The one object of `kind` named `name` (its `node-maintenance-operator-`
/// prefix left out) in the render.
fn one<'a>(objects: &'a [Value], k: &str, short: &str) -> &'a Value {
    let full = format!("{PACKAGE}-{short}");
    objects
        .iter()
        .find(|o| kind(o) == k && (name(o) == full || name(o) == short))
        .unwrap_or_else(|| panic!("deploy/default renders no {k} {full}"))
}

/// An object as OLM takes it: no namespace (OLM installs into its own).
fn unnamespaced(o: &Value) -> Value {
    let mut o = o.clone();
    if let Some(m) = o["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    o
}

/// The Deployment's spec without the cert-manager volume (OLM mounts its
/// own certificate at the same path), and without the priority class:
/// OpenShift, where OLM installs, admits the `system-*` classes only in
/// `kube-system` and `openshift-*` namespaces.
fn deployment_spec(d: &Value) -> Value {
    let mut spec = d["spec"].clone();
    let pod = &mut spec["template"]["spec"];
    if let Some(pod) = pod.as_object_mut() {
        pod.remove("priorityClassName");
    }
    if let Some(volumes) = pod["volumes"].as_array_mut() {
        volumes.retain(|v| v["secret"]["secretName"] != "webhook-server-cert");
    }
    for c in pod["containers"].as_array_mut().into_iter().flatten() {
        if let Some(mounts) = c["volumeMounts"].as_array_mut() {
            mounts.retain(|m| m["mountPath"] != "/tmp/k8s-webhook-server/serving-certs");
        }
    }
    spec
}

/// The rules of the Role or ClusterRole `short`.
fn rules(objects: &[Value], k: &str, short: &str) -> Vec<Value> {
    one(objects, k, short)["rules"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The ClusterServiceVersion.
fn csv(objects: &[Value]) -> Value {
    let deployment = one(objects, "Deployment", "controller-manager");
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"].clone();
    let crd = objects
        .iter()
        .find(|o| kind(o) == "CustomResourceDefinition")
        .expect("the CRD");
    let vwc = one(
        objects,
        "ValidatingWebhookConfiguration",
        "validating-webhook-configuration",
    );
    // OLM's webhook definitions carry no matchConditions: the CRD
    // deletion guard would be asked about every CRD's deletion, and with
    // the operator down none could be deleted. OLM keeps the CRD when the
    // operator is uninstalled, which is what the guard is for.
    let webhooks: Vec<Value> = vwc["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w["matchConditions"].is_null())
        .map(|w| {
            json!({
                "type": "ValidatingAdmissionWebhook",
                "generateName": w["name"],
                "deploymentName": deployment["metadata"]["name"],
                "containerPort": 443,
                "targetPort": 9443,
                "admissionReviewVersions": w["admissionReviewVersions"],
                "failurePolicy": w["failurePolicy"],
                "sideEffects": w["sideEffects"],
                "timeoutSeconds": w["timeoutSeconds"],
                "rules": w["rules"],
                "webhookPath": w["clientConfig"]["service"]["path"],
            })
        })
        .collect();
    let mut cluster_rules = rules(objects, "ClusterRole", "manager-role");
    cluster_rules.extend(rules(objects, "ClusterRole", "metrics-auth-role"));
    cluster_rules.extend(rules(objects, "Role", "node-lease-role"));
    let image = deployment["spec"]["template"]["spec"]["containers"][0]["image"].clone();
    let example = json!([{
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": "nodemaintenance-sample"},
        "spec": {"nodeName": "node02", "reason": "Test node maintenance"},
    }]);
    json!({
        "apiVersion": "operators.coreos.com/v1alpha1",
        "kind": "ClusterServiceVersion",
        "metadata": {
            "name": format!("{PACKAGE}.v{VERSION}"),
            "annotations": {
                "alm-examples": example.to_string(),
                "capabilities": "Basic Install",
                "categories": "OpenShift Optional",
                "containerImage": image,
                "description": "Cordons, taints and drains a node for maintenance, with WebAssembly drain policies; a drop-in replacement for medik8s' Node Maintenance Operator.",
                "repository": "https://example.invalid/nmo-rs",
                "operatorframework.io/suggested-namespace": "node-maintenance-operator-system",
            },
        },
        "spec": {
            "displayName": "Node Maintenance Operator (nmo)",
            "description": "Creating a NodeMaintenance cordons, taints and drains its node; deleting it restores the node. Every drain, failure and admission decision is made by a WebAssembly policy; the embedded default reproduces the Go Node Maintenance Operator.\n\nBefore installing: the namespace `medik8s-leases` must exist (the node leases live there).",
            "version": VERSION,
            "minKubeVersion": "1.26.0",
            "maturity": "alpha",
            "provider": {"name": "nmo-rs"},
            "maintainers": [{"name": "nmo-rs", "email": "nmo-rs@example.invalid"}],
            "links": [{"name": "Source", "url": "https://example.invalid/nmo-rs"}],
            "keywords": ["node", "maintenance", "drain", "medik8s", "webassembly"],
            "icon": [{
                "base64data": "PHN2ZyB4bWxucz0iaHR0cDovL3d3dy53My5vcmcvMjAwMC9zdmciIHZpZXdCb3g9IjAgMCAxIDEiLz4=",
                "mediatype": "image/svg+xml",
            }],
            "installModes": [
                {"type": "OwnNamespace", "supported": false},
                {"type": "SingleNamespace", "supported": false},
                {"type": "MultiNamespace", "supported": false},
                {"type": "AllNamespaces", "supported": true},
            ],
            "customresourcedefinitions": {"owned": [{
                "name": crd["metadata"]["name"],
                "version": "v1beta1",
                "kind": "NodeMaintenance",
                "displayName": "Node Maintenance",
                "description": "Puts a node into maintenance: cordon, taint, drain; deleted, the node is restored.",
            }]},
            "install": {
                "strategy": "deployment",
                "spec": {
                    "deployments": [{
                        "name": deployment["metadata"]["name"],
                        "label": deployment["metadata"]["labels"],
                        "spec": deployment_spec(deployment),
                    }],
                    "clusterPermissions": [{"serviceAccountName": sa, "rules": cluster_rules}],
                    "permissions": [{
                        "serviceAccountName": sa,
                        "rules": rules(objects, "Role", "leader-election-role"),
                    }],
                },
            },
            "webhookdefinitions": webhooks,
        },
    })
}

/// A manifest's file name, as operator-sdk names them.
fn file_name(o: &Value) -> String {
    let (group, version) = o["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .split_once('/')
        .unwrap_or(("", o["apiVersion"].as_str().unwrap_or_default()));
    let group = if group.is_empty() { "" } else { group };
    format!(
        "{}_{}_{}_{}.yaml",
        name(o),
        group.replace('.', "_"),
        version,
        kind(o).to_lowercase()
    )
    .replace("__", "_")
}

const HEADER: &str = "# Generated from deploy/default by host/tests/olm.rs: do not edit.\n";

/// The bundle's generated files: path under the bundle, content.
fn generated() -> BTreeMap<PathBuf, String> {
    let objects = common::real::rendered("default");
    let mut files = BTreeMap::new();
    let mut put = |path: PathBuf, o: &Value| {
        files.insert(
            path,
            format!("{HEADER}{}", nmo::yaml::to_string(o).unwrap()),
        );
    };
    put(
        Path::new("manifests").join(format!("{PACKAGE}.clusterserviceversion.yaml")),
        &csv(&objects),
    );
    let crd = objects
        .iter()
        .find(|o| kind(o) == "CustomResourceDefinition")
        .unwrap();
    put(Path::new("manifests").join(file_name(crd)), crd);
    for (k, short) in [
        ("Service", "metrics-service"),
        ("ClusterRole", "metrics-reader"),
        ("PodDisruptionBudget", "controller-manager"),
    ] {
        let o = unnamespaced(one(&objects, k, short));
        put(Path::new("manifests").join(file_name(&o)), &o);
    }
    put(
        Path::new("metadata").join("annotations.yaml"),
        &json!({"annotations": {
            "operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
            "operators.operatorframework.io.bundle.manifests.v1": "manifests/",
            "operators.operatorframework.io.bundle.metadata.v1": "metadata/",
            "operators.operatorframework.io.bundle.package.v1": PACKAGE,
            "operators.operatorframework.io.bundle.channels.v1": "stable",
            "operators.operatorframework.io.bundle.channel.default.v1": "stable",
        }}),
    );
    // The bundle image (`docker build -f deploy/olm/bundle.Dockerfile
    // deploy/olm`): the same annotations as labels, as operator-sdk writes it.
    let mut dockerfile = format!(
        "# Generated by host/tests/olm.rs: do not edit.\n# docker build -f deploy/olm/bundle.Dockerfile -t <registry>/nmo-bundle:v{VERSION} deploy/olm\nFROM scratch\n",
    );
    for (k, v) in [
        ("mediatype.v1", "registry+v1"),
        ("manifests.v1", "manifests/"),
        ("metadata.v1", "metadata/"),
        ("package.v1", PACKAGE),
        ("channels.v1", "stable"),
        ("channel.default.v1", "stable"),
    ] {
        dockerfile.push_str(&format!(
            "LABEL operators.operatorframework.io.bundle.{k}={v}\n"
        ));
    }
    dockerfile.push_str("COPY bundle/manifests /manifests/\nCOPY bundle/metadata /metadata/\n");
    files.insert(PathBuf::from("../bundle.Dockerfile"), dockerfile);
    files
}

/// The bundle on disk is the generation from `deploy/default`.
#[test]
fn the_bundle_is_generated_from_deploy_default() {
    let dir = bundle_dir();
    common::generated::check(
        &dir,
        &["manifests", "metadata"],
        &generated(),
        "NMO_WRITE_BUNDLE",
    );
}

/// The Operator Framework's validator (`operator-verify manifests`, with
/// the OperatorHub and object checks) finds no error in the bundle; the
/// CSV's install strategy is the shipped Deployment without the
/// cert-manager volume, and its permissions the shipped rules.
#[test]
fn the_operator_framework_validator_finds_no_error_in_the_bundle() {
    let verify = nmo_control_plane::Binaries::ensure()
        .expect("the control plane's binaries build")
        .path("operator-verify");
    let out = std::process::Command::new(verify)
        .args(["manifests", "--operatorhub_validate", "--object_validate"])
        .arg(bundle_dir())
        .output()
        .unwrap();
    let text = common::printed(&out);
    assert!(out.status.success(), "{text}");
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("level=error") || l.contains("level=fatal"))
        .collect();
    assert!(errors.is_empty(), "{text}");
    println!(
        "operator-verify: {}",
        if text.trim().is_empty() {
            "no finding"
        } else {
            text.trim()
        }
    );

    let objects = common::real::rendered("default");
    let csv = csv(&objects);
    let strategy = &csv["spec"]["install"]["spec"];
    let pod = &strategy["deployments"][0]["spec"]["template"]["spec"];
    assert!(!pod.to_string().contains("webhook-server-cert"), "{pod}");
    assert_eq!(
        pod["containers"][0]["args"],
        one(&objects, "Deployment", "controller-manager")["spec"]["template"]["spec"]["containers"]
            [0]["args"]
    );
    let rules = strategy["clusterPermissions"][0]["rules"].to_string();
    for needed in [
        "nodemaintenances",
        "pods/eviction",
        "poddisruptionbudgets",
        "leases",
        "tokenreviews",
    ] {
        assert!(rules.contains(needed), "{needed}: {rules}");
    }
}
