//! deploy/ as a user applies it, on the real control plane:
//! `kubectl apply --server-side -k deploy/<overlay>` (the real API server
//! validates every object, against the real cert-manager and Prometheus
//! Operator CRDs), cert-manager's controller issuing the webhook's
//! certificate and its cainjector injecting the CA, then the operator run
//! with its Deployment's args and env under the shipped ServiceAccount,
//! serving that certificate, and a NodeMaintenance admitted through the
//! webhook the API server calls.
//!
//! No pod network exists here: the operator runs as a local process, and
//! the API server reaches the webhook Service through the harness's
//! CONNECT proxy, which sends the Service's in-cluster name to that
//! process's loopback port. Nothing shipped is rewritten: the Service
//! reference stays, and TLS is checked against the Service's name as in a
//! cluster.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use kube::api::Api;
use nmo_control_plane::{ControlPlane, Options};

const NS: &str = "node-maintenance-operator-system";
const WEBHOOK_SERVICE: &str = "node-maintenance-operator-webhook-service";

async fn kubectl_ok(cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    cp.kubectl(args, stdin)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// How a user installs the operator.
#[derive(Clone, Copy)]
enum Install {
    /// `kubectl apply --server-side -k deploy/<overlay>`.
    Kustomize(&'static str),
    /// `helm install --create-namespace` of `deploy/helm/node-maintenance-operator`.
    Helm,
}

impl Install {
    fn chart() -> String {
        common::real::deploy_dir()
            .join("helm/node-maintenance-operator")
            .display()
            .to_string()
    }

    /// What it installs, as text.
    async fn render(self, cp: &ControlPlane) -> String {
        match self {
            Install::Kustomize(overlay) => {
                let dir = common::real::deploy_dir().join(overlay);
                kubectl_ok(cp, &["kustomize", &dir.display().to_string()], None).await
            }
            Install::Helm => helm(
                cp,
                &[
                    "template",
                    "nmo",
                    &Self::chart(),
                    "--namespace",
                    NS,
                    "--include-crds",
                ],
            ),
        }
    }

    /// Exactly the user's command.
    async fn install(self, cp: &ControlPlane) {
        match self {
            // Server-side: the policies ConfigMap is too big for
            // client-side apply's last-applied annotation.
            Install::Kustomize(overlay) => {
                let dir = common::real::deploy_dir().join(overlay);
                kubectl_ok(
                    cp,
                    &["apply", "--server-side", "-k", &dir.display().to_string()],
                    None,
                )
                .await;
            }
            Install::Helm => {
                let printed = helm(
                    cp,
                    &[
                        "install",
                        "nmo",
                        &Self::chart(),
                        "--namespace",
                        NS,
                        "--create-namespace",
                    ],
                );
                // The chart's NOTES: how to put a node into maintenance.
                assert!(
                    printed.contains("Put a node into maintenance")
                        && printed.contains(&format!("runs in {NS}")),
                    "{printed}"
                );
                // The chart's hook Job ran on a kwok node, which only
                // pretends to run a pod: its command, as the hook's
                // ServiceAccount (what it may do is what is tested), here.
                // `real_node.rs` runs the Job itself on a real kubelet.
                apply_crd_as_the_hook(cp).await;
            }
        }
    }
}

/// `nmo crd --apply` with the token of the chart's hook ServiceAccount
/// (made again here: the hook deleted it when its Job succeeded) under
/// the hook's rights as the chart renders them.
async fn apply_crd_as_the_hook(cp: &ControlPlane) {
    let hook = "node-maintenance-operator-crd-apply";
    let rendered = helm(
        cp,
        &["template", "nmo", &Install::chart(), "--namespace", NS],
    );
    let rights: String = rendered
        .split("\n---\n")
        .filter(|doc| {
            doc.contains(&format!("name: {hook}"))
                && (doc.contains("\nkind: ClusterRole") || doc.contains("\nkind: ServiceAccount"))
        })
        .collect::<Vec<_>>()
        .join("\n---\n");
    cp.apply(&rights).await.unwrap();
    let token = cp.service_account_token(NS, hook).await.unwrap();
    let kubeconfig = cp.write_kubeconfig("crd-hook.kubeconfig", &token).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(["crd", "--apply"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "nmo crd --apply as the hook: {}",
        common::printed(&out)
    );
}

/// Runs the control plane's `helm` as the cluster admin.
fn helm(cp: &ControlPlane, args: &[&str]) -> String {
    common::stdout_of(
        std::process::Command::new(cp.binaries().path("helm"))
            .args(args)
            .arg("--kubeconfig")
            .arg(cp.kubeconfig_path()),
    )
}

/// The operator installed as a user installs it, run as a local process
/// with its Deployment's args, env and ServiceAccount, Ready.
struct Running {
    cp: ControlPlane,
    admin: kube::Client,
    operator: tokio::process::Child,
    log: std::path::PathBuf,
    overlay: &'static str,
    /// The install registers the webhook.
    registered: bool,
    /// Keeps the certificate and policy files.
    _files: tempfile::TempDir,
}

/// Installs as a user does (`install`) and starts the operator.
async fn install_and_run(install: Install) -> Running {
    let overlay = match install {
        Install::Kustomize(overlay) => overlay,
        Install::Helm => "the Helm chart",
    };
    let mut cp = ControlPlane::start(Options::workers(2))
        .await
        .expect("the real control plane starts");
    let rendered = install.render(&cp).await;
    let with_cert_manager = rendered.contains("\nkind: Certificate\n");
    let registered = rendered.contains("\nkind: ValidatingWebhookConfiguration\n");
    if with_cert_manager {
        cp.start_cert_manager().await.unwrap();
    }
    if rendered.contains("\nkind: ServiceMonitor\n") {
        let crds =
            std::fs::read_to_string(cp.binaries().path("prometheus-operator-crds.yaml")).unwrap();
        cp.apply(&crds).await.unwrap();
    }
    if let Install::Helm = install {
        // As a Go-operator user's cluster has it: the shared leases
        // namespace, made by another operator, not by Helm. The install
        // must not stop on it ("cannot be imported into the current
        // release").
        kubectl_ok(&cp, &["create", "namespace", "medik8s-leases"], None).await;
    }
    install.install(&cp).await;

    let admin = cp.client().await.unwrap();
    let certs = tempfile::tempdir().unwrap();
    if with_cert_manager {
        // cert-manager issues the Certificate into the Secret the
        // Deployment mounts (it did not while the Certificate named an
        // Issuer the prefix had renamed)...
        let secrets: Api<Secret> = Api::namespaced(admin.clone(), NS);
        let found = cp
            .wait_for(
                "the webhook certificate issued by cert-manager",
                Duration::from_secs(90),
                || {
                    let secrets = secrets.clone();
                    async move {
                        secrets
                            .get_opt("webhook-server-cert")
                            .await
                            .ok()
                            .flatten()
                            .is_some()
                    }
                },
            )
            .await;
        if let Err(e) = found {
            let certs = kubectl_ok(
                &cp,
                &[
                    "get",
                    "certificate,certificaterequest,issuer",
                    "-A",
                    "-o",
                    "yaml",
                ],
                None,
            )
            .await;
            panic!("{overlay}: {e}\n{certs}");
        }
        let secret = secrets.get("webhook-server-cert").await.unwrap();
        let data = secret.data.unwrap_or_default();
        for key in ["tls.crt", "tls.key"] {
            std::fs::write(certs.path().join(key), &data[key].0).unwrap();
        }
        // ...and its cainjector puts the CA into the webhook's caBundle.
        let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
        cp.wait_for(
            "the webhook's caBundle injected by cainjector",
            Duration::from_secs(60),
            || {
                let vwcs = vwcs.clone();
                async move {
                    vwcs.get("node-maintenance-operator-validating-webhook-configuration")
                        .await
                        .ok()
                        .and_then(|v| v.webhooks)
                        .is_some_and(|w| {
                            w.iter().all(|h| {
                                h.client_config
                                    .ca_bundle
                                    .as_ref()
                                    .is_some_and(|b| !b.0.is_empty())
                            })
                        })
                }
            },
        )
        .await
        .unwrap();
    }

    // The policies ConfigMap as the kubelet mounts it: the real server
    // answers canonical base64 (kustomize's line-wrapped input decoded).
    let cm = Api::<ConfigMap>::namespaced(admin.clone(), NS)
        .get("node-maintenance-operator-policies")
        .await
        .unwrap();
    let policy_dir = certs.path().join("policies");
    std::fs::create_dir(&policy_dir).unwrap();
    let binary: BTreeMap<_, _> = cm.binary_data.unwrap_or_default();
    assert!(
        binary.contains_key("default.wasm"),
        "{overlay}: {:?}",
        binary.keys()
    );
    for (name, bytes) in &binary {
        std::fs::write(policy_dir.join(name), &bytes.0).unwrap();
    }
    for (name, text) in cm.data.unwrap_or_default() {
        std::fs::write(policy_dir.join(name), text).unwrap();
    }

    let deployment = Api::<Deployment>::namespaced(admin.clone(), NS)
        .get("node-maintenance-operator-controller-manager")
        .await
        .unwrap();
    let container =
        serde_json::to_value(&deployment.spec.unwrap().template.spec.unwrap().containers[0])
            .unwrap();
    let sa = deployment_service_account(&rendered);
    let token = cp.service_account_token(NS, &sa).await.unwrap();
    let kc = cp.write_kubeconfig("operator.kubeconfig", &token).unwrap();
    let ports = common::LocalPorts {
        probe: common::free_port(),
        webhook: common::free_port(),
    };
    cp.route_service(
        NS,
        WEBHOOK_SERVICE,
        443,
        ([127, 0, 0, 1], ports.webhook).into(),
    )
    .await
    .unwrap();
    let operator =
        common::deployment_process(&container, &ports, &policy_dir, certs.path(), &kc, NS)
            .stderr(std::process::Stdio::from(
                std::fs::File::create(cp.dir().join("operator.log")).unwrap(),
            ))
            .spawn()
            .unwrap();
    let probe = ports.probe;
    let log = cp.dir().join("operator.log");
    if let Err(e) = cp
        .wait_for("the operator ready", Duration::from_secs(60), || {
            common::ready_on(probe)
        })
        .await
    {
        panic!(
            "{overlay}: {e}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    Running {
        cp,
        admin,
        operator,
        log,
        overlay,
        registered,
        _files: certs,
    }
}

/// Installs the operator as a user does and takes one maintenance through
/// it.
async fn one_maintenance_through(install: Install) {
    let Running {
        cp,
        admin,
        mut operator,
        log,
        overlay,
        registered,
        _files,
    } = install_and_run(install).await;
    let nm = |name: &str| {
        format!(
            "apiVersion: nodemaintenance.medik8s.io/v1beta1\nkind: NodeMaintenance\nmetadata: {{name: {name}}}\nspec: {{nodeName: worker-1, reason: deploy test}}\n"
        )
    };
    // Admitted through the webhook the API server calls (failurePolicy:
    // Fail: had it not answered, this create would fail).
    kubectl_ok(&cp, &["create", "-f", "-"], Some(&nm("nm-1"))).await;
    if registered {
        // The webhook's rules, as the API server calls them, with the Go
        // operator's messages.
        let kc = cp.kubeconfig_path();
        let refused = async |args: &[&str], stdin: Option<&str>, message: &str| {
            let (ok, out) = nmo_control_plane::kubectl_with(&kc, args, stdin)
                .await
                .unwrap();
            assert!(
                !ok && out.contains("denied the request") && out.contains(message),
                "{overlay}: refused with {message:?}: {out}"
            );
        };
        let create = ["create", "-f", "-"];
        refused(
            &create,
            Some(&nm("nm-2")),
            &nmo::webhook::messages::already_exists("worker-1"),
        )
        .await;
        refused(
            &create,
            Some(&nm("nm-ghost").replace("worker-1", "ghost")),
            &nmo::webhook::messages::node_not_found("ghost"),
        )
        .await;
        refused(
            &[
                "patch",
                "nm",
                "nm-1",
                "--type=merge",
                "-p",
                r#"{"spec":{"nodeName":"worker-2"}}"#,
            ],
            None,
            nmo::webhook::messages::NODE_NAME_IMMUTABLE,
        )
        .await;
        // Who may take which node down: a user allowed to create
        // NodeMaintenances, but not in system:masters, may neither drain a
        // control-plane node nor choose a policy (the shipped policies.yaml
        // has no `access` section: the defaults).
        kubectl_ok(
            &cp,
            &[
                "label",
                "node",
                "worker-2",
                "node-role.kubernetes.io/control-plane=",
            ],
            None,
        )
        .await;
        kubectl_ok(&cp, &["apply", "-f", "-"], Some(DEV_USER)).await;
        let dev = cp.service_account_token("default", "dev").await.unwrap();
        let dev_kc = cp.write_kubeconfig("dev.kubeconfig", &dev).unwrap();
        let refused_for_dev = async |stdin: &str, message: &str| {
            let (ok, out) = nmo_control_plane::kubectl_with(&dev_kc, &create, Some(stdin))
                .await
                .unwrap();
            assert!(
                !ok && out.contains("denied the request") && out.contains(message),
                "{overlay}: refused for dev with {message:?}: {out}"
            );
        };
        refused_for_dev(
            &nm("nm-cp").replace("worker-1", "worker-2"),
            "user \"system:serviceaccount:default:dev\" may not put node \"worker-2\" into maintenance: nodes matching node-role.kubernetes.io/control-plane need groups system:masters",
        )
        .await;
        refused_for_dev(
            &nm("nm-annotated").replace(
                "metadata: {name: nm-annotated}",
                "metadata: {name: nm-annotated, annotations: {nodemaintenance.medik8s.io/policy: never-force}}",
            ),
            "may not choose a policy with the nodemaintenance.medik8s.io/policy annotation",
        )
        .await;
        // Nor add the annotation afterwards.
        let (ok, out) = nmo_control_plane::kubectl_with(
            &dev_kc,
            &[
                "patch",
                "nm",
                "nm-1",
                "--type=merge",
                "-p",
                r#"{"metadata":{"annotations":{"nodemaintenance.medik8s.io/policy":"never-force"}}}"#,
            ],
            None,
        )
        .await
        .unwrap();
        assert!(
            !ok && out.contains("may not choose a policy"),
            "{overlay}: the annotation added by patch: {out}"
        );
    }
    let nms: Api<nmo::crd::NodeMaintenance> = Api::all(admin.clone());
    common::wait_succeeded(&nms, "nm-1", Duration::from_secs(90)).await;
    kubectl_ok(
        &cp,
        &["delete", "nm", "nm-1", "--wait=true", "--timeout=60s"],
        None,
    )
    .await;
    let node = Api::<Node>::all(admin.clone())
        .get("worker-1")
        .await
        .unwrap();
    assert_ne!(
        node.spec.and_then(|s| s.unschedulable),
        Some(true),
        "{overlay}: restored"
    );
    if let Install::Helm = install {
        helm(&cp, &["uninstall", "nmo", "--namespace", NS, "--wait"]);
        let leases = kubectl_ok(
            &cp,
            &["get", "namespace", "medik8s-leases", "-o", "name"],
            None,
        )
        .await;
        assert_eq!(
            leases.trim(),
            "namespace/medik8s-leases",
            "helm uninstall kept the shared namespace"
        );
    }
    operator.kill().await.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|l| l["msg"] == "became leader"),
        "{overlay}: no leadership line in the operator's log:\n{text}"
    );
    cp.stop();
}

/// `kubectl delete -k deploy/default` of the whole install while a node is
/// in maintenance: the webhook refuses to delete the CRD (which would
/// delete every maintenance with the operator gone, leaving the node
/// cordoned and the CRD stuck deleting until a reinstall finished the
/// deletion under the new operator), saying what to do instead; the rest
/// is deleted; nothing is lost, and a reinstall finds the CRD and the
/// maintenance as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_whole_install_mid_maintenance_keeps_the_crd_and_the_maintenance() {
    let Running {
        mut cp,
        admin,
        mut operator,
        _files,
        ..
    } = install_and_run(Install::Kustomize("default")).await;
    kubectl_ok(
        &cp,
        &["create", "-f", "-"],
        Some("apiVersion: nodemaintenance.medik8s.io/v1beta1\nkind: NodeMaintenance\nmetadata: {name: nm-1}\nspec: {nodeName: worker-1}\n"),
    )
    .await;
    let nms: Api<nmo::crd::NodeMaintenance> = Api::all(admin.clone());
    common::wait_succeeded(&nms, "nm-1", Duration::from_secs(90)).await;
    let dir = common::real::deploy_dir().join("default");
    let (ok, out) = nmo_control_plane::kubectl_with(
        &cp.kubeconfig_path(),
        &["delete", "-k", &dir.display().to_string(), "--timeout=120s"],
        None,
    )
    .await
    .unwrap();
    assert!(
        !ok && out.contains("crd-guard.nodemaintenance.medik8s.io")
            && out.contains(&nmo::webhook::messages::crd_in_use(
                &["nm-1 on node worker-1".into()],
                false
            )),
        "the CRD's deletion refused, saying why: {out}"
    );
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(admin.clone());
    let crd_name = nmo::crd::CRD_NAME;
    let intact = async || {
        let crd = crds.get(crd_name).await.expect("the CRD is there");
        assert!(
            crd.metadata.deletion_timestamp.is_none(),
            "the CRD is not being deleted"
        );
        let nm = nms.get("nm-1").await.expect("the maintenance is there");
        assert!(nm.metadata.deletion_timestamp.is_none());
    };
    intact().await;
    // The rest of the install went (the webhook with it).
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    assert!(
        vwcs.get_opt("node-maintenance-operator-validating-webhook-configuration")
            .await
            .unwrap()
            .is_none()
    );
    operator.kill().await.unwrap();
    // The reinstall, once the namespaces the delete took are gone (until
    // then the API server refuses new content in them): the same CRD, the
    // maintenance still there.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    cp.wait_for(
        "the deleted namespaces gone",
        Duration::from_secs(180),
        || {
            let namespaces = namespaces.clone();
            async move {
                let mut gone = true;
                for ns in [NS, "medik8s-leases"] {
                    gone &= matches!(namespaces.get_opt(ns).await, Ok(None));
                }
                gone
            }
        },
    )
    .await
    .unwrap();
    Install::Kustomize("default").install(&cp).await;
    intact().await;
    let node = Api::<Node>::all(admin).get("worker-1").await.unwrap();
    assert_eq!(
        node.spec.and_then(|s| s.unschedulable),
        Some(true),
        "still in maintenance: nothing restored it behind the user's back"
    );
    cp.stop();
}

/// A user who may create NodeMaintenances and nothing more.
const DEV_USER: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: dev, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: nm-creator}
rules:
- apiGroups: [nodemaintenance.medik8s.io]
  resources: [nodemaintenances]
  verbs: [create, get, list, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: dev-nm-creator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nm-creator}
subjects:
- {kind: ServiceAccount, name: dev, namespace: default}
"#;

/// The Deployment's ServiceAccount, as rendered.
fn deployment_service_account(rendered: &str) -> String {
    rendered
        .lines()
        .find_map(|l| l.trim().strip_prefix("serviceAccountName: "))
        .expect("the Deployment names its ServiceAccount")
        .trim()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_overlay_with_cert_manager_admits_through_the_webhook() {
    one_maintenance_through(Install::Kustomize("default")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_prometheus_overlay_validates_against_the_prometheus_operator_crds() {
    one_maintenance_through(Install::Kustomize("with-prometheus")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cert_manager_overlay_runs_without_the_webhook() {
    one_maintenance_through(Install::Kustomize("no-cert-manager")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_open_overlay_runs_with_cert_manager() {
    one_maintenance_through(Install::Kustomize("metrics-open")).await;
}

/// The Helm chart, installed as its README says: `helm install
/// --create-namespace` into the operator's namespace, with cert-manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_helm_chart_installs_an_operator_that_admits_through_the_webhook() {
    one_maintenance_through(Install::Helm).await;
}
