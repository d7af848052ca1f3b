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
//! And as a user installs it: `deploy/olm/catalog.sh` makes a catalog of
//! it with the real opm, a real OLM (its olm and catalog operators, with
//! the control plane) installs it from there through
//! `deploy/olm/subscription.yaml`, and the operator runs as its pods on a
//! real node; the bundle image built from `bundle.Dockerfile` reads back
//! in opm as the folder does.
//!
//! After a change under `deploy/`: `NMO_WRITE_BUNDLE=1 cargo test -p nmo
//! --test suite olm::` rewrites the bundle.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const PACKAGE: &str = "node-maintenance-operator";

fn bundle_dir() -> PathBuf {
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
/// own certificate at the same path).
fn deployment_spec(d: &Value) -> Value {
    let mut spec = d["spec"].clone();
    let pod = &mut spec["template"]["spec"];
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
    let webhooks: Vec<Value> = vwc["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
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

/// The image the real-node tests import (`deploy/image/build.sh`), as a
/// user's catalog names it.
const OPERATOR_IMAGE: &str = "localhost/nmo:dev";
const INSTALL_NS: &str = "node-maintenance-operator-system";

/// The catalog a user makes of the bundle, as the install guide has it:
/// `deploy/olm/catalog.sh` with the image, run with the control plane's
/// real `opm` on the PATH (it renders the bundle, its manifests inline,
/// adds the package and its channel, and runs `opm validate`). Returns
/// the catalog's folder.
fn catalog(cp: &nmo_control_plane::ControlPlane, work: &Path) -> PathBuf {
    let configs = work.join("catalog");
    let path = format!(
        "{}:{}",
        cp.binaries().dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new(bundle_dir().join("../catalog.sh"))
        .arg(OPERATOR_IMAGE)
        .arg(&configs)
        .env("PATH", path)
        .output()
        .expect("deploy/olm/catalog.sh");
    assert!(
        out.status.success(),
        "deploy/olm/catalog.sh: {}",
        common::printed(&out)
    );
    let index = std::fs::read_to_string(configs.join("index.yaml")).unwrap();
    assert!(
        index.contains("schema: olm.bundle") && index.contains(&format!("{PACKAGE}.v{VERSION}")),
        "{index}"
    );
    configs
}

/// What a user applies to install from that catalog: the CatalogSource
/// (the registry's address: OLM's `grpc` source with no pod of its own),
/// then `deploy/olm/subscription.yaml` as shipped (the leases' namespace,
/// the operator's namespace with an OperatorGroup for all namespaces, the
/// Subscription).
fn subscription(address: &str) -> String {
    let olm = nmo_control_plane::OLM_NAMESPACE;
    let shipped = std::fs::read_to_string(bundle_dir().join("../subscription.yaml")).unwrap();
    format!(
        "apiVersion: operators.coreos.com/v1alpha1\nkind: CatalogSource\n\
         metadata: {{name: nmo-catalog, namespace: {olm}}}\n\
         spec: {{sourceType: grpc, address: '{address}', displayName: nmo}}\n---\n{shipped}"
    )
}

/// The CSV's phase in the install namespace, if it is there.
async fn csv_phase(kubeconfig: &Path) -> Option<String> {
    let (ok, out) = nmo_control_plane::kubectl_with(
        kubeconfig,
        &[
            "get",
            "csv",
            &format!("{PACKAGE}.v{VERSION}"),
            "-n",
            INSTALL_NS,
            "-o",
            "jsonpath={.status.phase}",
        ],
        None,
    )
    .await
    .ok()?;
    Some(out.trim().to_owned()).filter(|p| ok && !p.is_empty())
}

/// The bundle installed by a real OLM (v0, its olm and catalog operators
/// as its release builds them) from a catalog that opm made and serves:
/// the Subscription resolves, the InstallPlan runs, the CSV Succeeds; the
/// operator's two replicas run as pods on the real node from the image
/// built here, with the certificate OLM issued for the webhook; the API
/// server calls that webhook through the Service OLM made (a duplicate is
/// refused); a maintenance of a kwok node Succeeds and, deleted, gives the
/// node back; uninstalled, the CRD and the maintenances stay.
#[test]
fn a_real_olm_installs_the_bundle_and_the_operator_runs_as_its_pods() {
    use crate::real_node::{self, KWOK, REAL};
    use k8s_openapi::api::core::v1::Node;
    use nmo_control_plane::isolated;
    use std::time::{Duration, Instant};

    let image = crate::image::archive();
    isolated(move || async move {
        let begun = Instant::now();
        let mut cp = real_node::start(&[REAL], image).await;
        cp.start_olm().await.unwrap();
        let work = tempfile::tempdir().unwrap();
        let configs = catalog(&cp, work.path());
        let address = cp.serve_catalog(&configs).await.unwrap();
        real_node::kubectl_ok(&cp, &["apply", "-f", "-"], Some(&subscription(&address))).await;

        let kubeconfig = cp.kubeconfig_path();
        let succeeded = cp
            .wait_for(
                "the CSV Succeeded (OLM resolved, planned and installed it)",
                Duration::from_secs(240),
                || async { csv_phase(&kubeconfig).await.as_deref() == Some("Succeeded") },
            )
            .await;
        if let Err(e) = succeeded {
            let state = cp
                .kubectl(
                    &[
                        "get",
                        "catalogsource,subscription,installplan,csv,deployment,pods",
                        "-A",
                        "-o",
                        "yaml",
                    ],
                    None,
                )
                .await
                .unwrap_or_else(|e| e.to_string());
            panic!("{e}\n{state}\n{}", cp.logs_tail(30));
        }
        eprintln!("OLM: the CSV Succeeded after {:?}", begun.elapsed());
        let plan = real_node::kubectl_ok(
            &cp,
            &[
                "get",
                "installplan",
                "-n",
                INSTALL_NS,
                "-o",
                "jsonpath={.items[*].status.phase}",
            ],
            None,
        )
        .await;
        assert_eq!(plan.trim(), "Complete", "the InstallPlan");

        let pods = real_node::replicas_ready(&mut cp, INSTALL_NS, 2).await;
        assert_eq!(pods.len(), 2, "{pods:?}");
        for p in &pods {
            assert_eq!(
                p.spec.as_ref().unwrap().node_name.as_deref(),
                Some(REAL),
                "{:?}",
                p.metadata.name
            );
            let c = &p
                .status
                .as_ref()
                .unwrap()
                .container_statuses
                .as_ref()
                .unwrap()[0];
            assert_eq!(c.image, OPERATOR_IMAGE);
            assert_eq!(c.restart_count, 0, "{c:?}");
        }
        // The webhook's registration is OLM's, with the CA it made.
        let ca = real_node::kubectl_ok(
            &cp,
            &[
                "get",
                "validatingwebhookconfigurations",
                "-l",
                &format!("olm.owner={PACKAGE}.v{VERSION}"),
                "-o",
                "jsonpath={.items[*].webhooks[*].clientConfig.caBundle}",
            ],
            None,
        )
        .await;
        assert!(
            !ca.trim().is_empty(),
            "OLM registers the webhook with its CA"
        );

        let client = cp.client().await.unwrap();
        real_node::kubectl_ok(&cp, &["apply", "-f", "-"], Some(&real_node::web_on_kwok())).await;
        real_node::admits_once_through_the_webhook(&cp, "nm-olm", KWOK).await;
        cp.wait_for("nm-olm Succeeded", Duration::from_secs(120), || async {
            real_node::cp_phase(&client, "nm-olm").await.as_deref() == Some("Succeeded")
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cp.logs_tail(20)));
        let nodes: kube::Api<Node> = kube::Api::all(client.clone());
        let cordoned = nodes.get(KWOK).await.unwrap();
        assert_eq!(cordoned.spec.unwrap().unschedulable, Some(true));
        eprintln!("OLM: the maintenance Succeeded after {:?}", begun.elapsed());

        real_node::kubectl_ok(&cp, &["delete", "nodemaintenance", "nm-olm"], None).await;
        cp.wait_for("the node given back", Duration::from_secs(60), || async {
            nodes
                .get(KWOK)
                .await
                .ok()
                .and_then(|n| n.spec)
                .is_some_and(|s| s.unschedulable != Some(true))
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));

        // Uninstalled as OLM uninstalls (the Subscription and the CSV
        // deleted): the Deployment and the webhook's registration go, the
        // CRD and the maintenances stay (OLM never deletes a CRD).
        real_node::kubectl_ok(
            &cp,
            &["create", "-f", "-"],
            Some(&real_node::maintenance("nm-kept", KWOK)),
        )
        .await;
        real_node::kubectl_ok(
            &cp,
            &["delete", "subscription,csv", "--all", "-n", INSTALL_NS],
            None,
        )
        .await;
        cp.wait_for(
            "the operator's Deployment and webhook gone with the CSV",
            Duration::from_secs(60),
            || async {
                let get = |what: &'static str, selector: String| {
                    let kubeconfig = kubeconfig.clone();
                    async move {
                        let args = ["get", what, "-A", "-l", &selector, "-o", "name"];
                        match nmo_control_plane::kubectl_with(&kubeconfig, &args, None).await {
                            Ok((true, out)) => Some(out.trim().to_owned()),
                            _ => None,
                        }
                    }
                };
                let deployments =
                    get("deployments", "control-plane=controller-manager".into()).await;
                let webhooks = get(
                    "validatingwebhookconfigurations",
                    format!("olm.owner={PACKAGE}.v{VERSION}"),
                )
                .await;
                deployments.is_some_and(|d| d.is_empty()) && webhooks.is_some_and(|w| w.is_empty())
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let kept = real_node::kubectl_ok(
            &cp,
            &["get", "nodemaintenance", "nm-kept", "-o", "name"],
            None,
        )
        .await;
        assert_eq!(
            kept.trim(),
            "nodemaintenance.nodemaintenance.medik8s.io/nm-kept"
        );
        cp.stop();
    })
    .unwrap();
}

/// Runs `program` with `args`, failing with what it printed; returns its
/// standard output.
fn run(program: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        program.display(),
        common::printed(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `olm.bundle` of `opm render`'s JSON output: its name, package and
/// properties (the manifests among them); its image and related images
/// (which name the bundle image itself, if any) left out.
fn rendered_bundle(json: &str) -> Value {
    let bundle = serde_json::Deserializer::from_str(json)
        .into_iter::<Value>()
        .map(Result::unwrap)
        .find(|b| b["schema"] == "olm.bundle")
        .unwrap_or_else(|| panic!("no olm.bundle in {json}"));
    json!({
        "name": bundle["name"],
        "package": bundle["package"],
        "properties": bundle["properties"],
    })
}

/// The bundle image as a user builds it (`deploy/olm/bundle.Dockerfile`,
/// here with buildah) and pushes it to a registry (CNCF Distribution on
/// loopback) is a bundle opm reads back from the registry (what catalog
/// tools do with it) as the same bundle, object for object, as the
/// folder `deploy/olm/catalog.sh` renders.
#[test]
fn the_bundle_image_built_from_its_dockerfile_renders_as_the_bundle_folder() {
    let binaries = nmo_control_plane::Binaries::ensure().expect("the control plane's binaries");
    let tmp = tempfile::tempdir().unwrap();
    let buildah = Path::new("buildah");
    let storage = |rest: &[&str]| -> Vec<String> {
        let mut args = vec![
            format!("--root={}", tmp.path().join("storage").display()),
            format!("--runroot={}", tmp.path().join("run").display()),
            "--storage-driver=vfs".to_owned(),
        ];
        args.extend(rest.iter().map(|s| s.to_string()));
        args
    };
    let olm_dir = bundle_dir().join("..");
    let dockerfile = olm_dir.join("bundle.Dockerfile");
    let tag = format!("localhost/nmo-bundle:v{VERSION}");
    let args = storage(&[
        "bud",
        "--quiet",
        "--layers=false",
        "-f",
        &dockerfile.display().to_string(),
        "-t",
        &tag,
        &olm_dir.display().to_string(),
    ]);
    run(
        buildah,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let registry = nmo_control_plane::OciRegistry::start(&binaries, tmp.path()).unwrap();
    let reference = format!("{}/nmo-bundle:v{VERSION}", registry.host());
    let args = storage(&[
        "push",
        "--quiet",
        "--tls-verify=false",
        &tag,
        &format!("docker://{reference}"),
    ]);
    run(
        buildah,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );

    let opm = binaries.path("opm");
    let from_image = run(&opm, &["render", &reference, "--use-http", "-o", "json"]);
    let from_folder = run(
        &opm,
        &["render", &bundle_dir().display().to_string(), "-o", "json"],
    );
    let image_bundle = rendered_bundle(&from_image);
    assert_eq!(image_bundle["name"], format!("{PACKAGE}.v{VERSION}"));
    // Compared whole, shown short: the manifests are base64 JSON.
    assert!(
        image_bundle == rendered_bundle(&from_folder),
        "the bundle image renders otherwise than the folder:\n{from_image}"
    );
    registry.stop();
}
