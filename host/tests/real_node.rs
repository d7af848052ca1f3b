//! The operator as shipped, run as a user runs it: the image built here
//! from the repository's Dockerfile (`deploy/image/build.sh`), imported
//! into a real node's containerd, and `deploy/default` applied with the
//! README's overlay (only the image changed). The pods run under the
//! kubelet: the image's user, the read-only root, the policies ConfigMap
//! and the webhook Secret mounted, the in-cluster configuration from the
//! projected token and the `kubernetes` Service, the probes as the kubelet
//! calls them. The API server calls the webhook through its Service (the
//! cluster IP, kube-proxy's rules), the metrics are read over HTTPS
//! through theirs.
//!
//! Everything runs inside the test's own network namespace
//! (`nmo_control_plane::isolated`): no address of a pod, a node or a
//! Service exists outside it. A kwok node (tainted, so the operator's
//! replicas stay on the real node) holds the workload to drain.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, ListParams};
use nmo_control_plane::{ControlPlane, NodeSpec, Options, isolated};

pub(crate) const NS: &str = "node-maintenance-operator-system";
pub(crate) const REAL: &str = "real-1";
pub(crate) const KWOK: &str = "worker-1";

pub(crate) async fn kubectl_ok(cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    cp.kubectl(args, stdin)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cp.logs_tail(20)))
}

/// The control plane with the kwok node (tainted: it takes only the
/// workload, which tolerates this) and the real nodes `real`, the image
/// imported into each.
pub(crate) async fn start(real: &[&str], image: PathBuf) -> ControlPlane {
    start_with(real, vec![image]).await
}

/// [`start`] with several images imported.
pub(crate) async fn start_with(real: &[&str], images: Vec<PathBuf>) -> ControlPlane {
    let cp = ControlPlane::start(Options {
        nodes: vec![NodeSpec::new(KWOK).max_pods(1100)],
        real_nodes: real.iter().map(|n| n.to_string()).collect(),
        images,
        ..Options::default()
    })
    .await
    .expect("the control plane with real nodes starts");
    eprintln!(
        "control plane with {} real node(s) Ready in {:?}",
        real.len(),
        cp.time_to_ready()
    );
    kubectl_ok(&cp, &["taint", "node", KWOK, "kwok=fake:NoSchedule"], None).await;
    cp
}

/// The README's overlay, pointed at the image imported into the node.
pub(crate) fn user_overlay(dir: &std::path::Path) -> PathBuf {
    // Beside a checkout, as the README has it (kustomize takes relative
    // paths only).
    std::os::unix::fs::symlink(crate::common::real::deploy_dir(), dir.join("deploy")).unwrap();
    let overlay = dir.join("my-nmo");
    std::fs::create_dir_all(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "resources: [../deploy/default]\nimages:\n- {name: nmo, newName: localhost/nmo, newTag: dev}\n",
    )
    .unwrap();
    overlay
}

/// The operator's pods, once both replicas are Ready on the real node.
pub(crate) async fn operator_ready(cp: &mut ControlPlane) -> Vec<Pod> {
    replicas_ready(cp, NS, 2).await
}

/// The operator's pods in `ns`, once `want` replicas are Ready (and
/// updated) through the kubelet's readiness probe.
pub(crate) async fn replicas_ready(cp: &mut ControlPlane, ns: &str, want: i32) -> Vec<Pod> {
    let client = cp.client().await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let ready = cp
        .wait_for(
            "the operator's replicas Ready (the kubelet's readiness probe)",
            Duration::from_secs(180),
            || {
                let deployments = deployments.clone();
                async move {
                    deployments
                        .get("node-maintenance-operator-controller-manager")
                        .await
                        .ok()
                        .and_then(|d| d.status)
                        .is_some_and(|s| {
                            s.ready_replicas == Some(want) && s.updated_replicas == Some(want)
                        })
                }
            },
        )
        .await;
    if let Err(e) = ready {
        fail_describing(cp, ns, e).await;
    }
    pods.list(&ListParams::default().labels("control-plane=controller-manager"))
        .await
        .unwrap()
        .items
}

/// The Go operator v0.21.0's CRD as a cluster where it ran has it: put
/// by `kubectl replace` (OLM's field manager is another, to the same
/// effect), with a maintenance of its own.
async fn go_operators_crd_as_olm_leaves_it(cp: &ControlPlane) {
    let go_crd = cp.binaries().path("node-maintenance-operator-crd.yaml");
    let file = go_crd.display().to_string();
    kubectl_ok(cp, &["create", "-f", &file], None).await;
    kubectl_ok(cp, &["replace", "-f", &file], None).await;
    kubectl_ok(
        cp,
        &[
            "wait",
            "--for=condition=Established",
            "crd/nodemaintenances.nodemaintenance.medik8s.io",
        ],
        None,
    )
    .await;
    kubectl_ok(
        cp,
        &["create", "-f", "-"],
        Some(&maintenance("nm-from-go", "no-such-node")),
    )
    .await;
}

/// After `helm install` over the Go operator's CRD (which Helm 4 refused
/// while the chart had it in `crds/`): the chart's hook Job, run by the
/// real kubelet, applied nmo's CRD over it, and the Go maintenance is
/// still there (nmo fails it: its node does not exist).
async fn the_crd_is_nmos(cp: &ControlPlane) {
    let crd = kubectl_ok(
        cp,
        &[
            "get",
            "crd",
            nmo::crd::CRD_NAME,
            "-o",
            "json",
            "--show-managed-fields",
        ],
        None,
    )
    .await;
    let crd: serde_json::Value = serde_json::from_str(&crd).unwrap();
    let status = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"];
    assert!(
        !status["properties"]["policy"].is_null(),
        "nmo's schema (status.policy): {status}"
    );
    assert!(
        crd["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["manager"] == nmo::crd::CRD_FIELD_MANAGER && m["operation"] == "Apply"),
        "applied by the hook: {}",
        crd["metadata"]["managedFields"]
    );
    kubectl_ok(cp, &["get", "nm", "nm-from-go"], None).await;
    kubectl_ok(
        cp,
        &["delete", "nm", "nm-from-go", "--wait=true", "--timeout=60s"],
        None,
    )
    .await;
    // The hook's objects went once its Job succeeded.
    let left = kubectl_ok(
        cp,
        &["get", "jobs,serviceaccounts", "-n", NS, "-o", "name"],
        None,
    )
    .await;
    assert!(!left.contains("crd-apply"), "{left}");
}

/// Fails with `why` and `kubectl describe pods` of `ns`.
pub(crate) async fn fail_describing(cp: &ControlPlane, ns: &str, why: impl std::fmt::Display) -> ! {
    let described = cp
        .kubectl(&["describe", "pods", "-n", ns], None)
        .await
        .unwrap_or_else(|e| e.to_string());
    panic!("{why}\n{described}");
}

/// Fails, with what the restarted containers last logged and why they
/// ended, if a container of `pods` has restarted.
pub(crate) async fn no_restarts(cp: &ControlPlane, ns: &str, pods: &[Pod]) {
    let mut report = String::new();
    for p in pods {
        let name = p.metadata.name.clone().unwrap_or_default();
        let statuses = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.clone())
            .unwrap_or_default();
        for c in statuses.iter().filter(|c| c.restart_count > 0) {
            let previous = cp
                .kubectl(
                    &["logs", "--previous", "-n", ns, &name, "-c", &c.name],
                    None,
                )
                .await
                .unwrap_or_else(|e| e.to_string());
            let tail: Vec<&str> = previous.lines().rev().take(40).collect();
            report += &format!(
                "{name}/{}: {} restarts, last state {:?}\nits last lines before:\n{}\n",
                c.name,
                c.restart_count,
                c.last_state,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
    if !report.is_empty() {
        let events = cp
            .kubectl(&["get", "events", "-n", ns], None)
            .await
            .unwrap_or_else(|e| e.to_string());
        panic!("a container restarted:\n{report}\nthe namespace's events:\n{events}");
    }
}

/// The API server calls the operator's webhook through its Service:
/// maintenance `name` of `node` is admitted, a second of the same node
/// refused with the operator's own words.
pub(crate) async fn admits_once_through_the_webhook(cp: &ControlPlane, name: &str, node: &str) {
    // kube-proxy writes a Service's rules a moment after its endpoints
    // become ready: until then the call is refused, and so is the
    // maintenance (the webhook fails closed), as on any cluster.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match cp
            .kubectl(&["create", "-f", "-"], Some(&maintenance(name, node)))
            .await
        {
            Ok(_) => break,
            Err(e)
                if e.to_string().contains("failed calling webhook")
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!(
                "the first maintenance is admitted: {e}\n{}\n{}",
                cp.kubectl(
                    &["get", "endpointslices,svc,pods", "-A", "-o", "wide"],
                    None
                )
                .await
                .unwrap_or_else(|e| e.to_string()),
                service_rules()
            ),
        }
    }
    let dup = cp
        .kubectl(
            &["create", "-f", "-"],
            Some(&maintenance(&format!("{name}-dup"), node)),
        )
        .await
        .expect_err("a second maintenance of the node is refused");
    let dup = dup.to_string();
    assert!(
        dup.contains("denied the request") && dup.contains(node),
        "refused by the webhook: {dup}"
    );
}

pub(crate) fn maintenance(name: &str, node: &str) -> String {
    format!(
        "apiVersion: nodemaintenance.medik8s.io/v1beta1\nkind: NodeMaintenance\n\
         metadata: {{name: {name}}}\nspec: {{nodeName: {node}, reason: real node test}}\n"
    )
}

/// GETs `url` with curl (the metrics over HTTPS), with `token` if any;
/// returns the HTTP status and the body.
fn curl(url: &str, token: Option<&str>) -> (u16, String) {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sk", "--max-time", "10", "-w", "\n%{http_code}", url]);
    if let Some(t) = token {
        cmd.arg("-H").arg(format!("Authorization: Bearer {t}"));
    }
    let out = cmd.output().expect("curl (Debian: apt-get install curl)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// How the user installs the operator.
#[derive(Clone, Copy, Debug)]
enum Install {
    /// `kubectl apply --server-side -k` of the README's overlay.
    Kustomize,
    /// `helm install` of deploy/helm with the image set.
    Helm,
}

/// Installs the operator as a user does, from `dir` (a scratch folder).
async fn install(cp: &ControlPlane, how: Install, dir: &std::path::Path) {
    match how {
        Install::Kustomize => apply_overlay(cp, &user_overlay(dir)).await,
        Install::Helm => helm_install(cp, &[]),
    }
}

/// `kubectl apply --server-side -k` of `overlay`, as the README installs.
pub(crate) async fn apply_overlay(cp: &ControlPlane, overlay: &std::path::Path) {
    kubectl_ok(
        cp,
        &[
            "apply",
            "--server-side",
            "-k",
            &overlay.display().to_string(),
        ],
        None,
    )
    .await;
}

/// `helm install nmo` of deploy/helm into the operator's namespace, the
/// image the one imported into the nodes, with more `--set` values.
pub(crate) fn helm_install(cp: &ControlPlane, sets: &[&str]) {
    let chart = crate::common::real::deploy_dir().join("helm/node-maintenance-operator");
    let mut cmd = std::process::Command::new(cp.binaries().path("helm"));
    cmd.args(["install", "nmo"]).arg(&chart).args([
        "--namespace",
        NS,
        "--create-namespace",
        "--set",
        "image.repository=localhost/nmo",
        "--set",
        "image.tag=dev",
    ]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    let out = cmd
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .output()
        .expect("the control plane's helm");
    assert!(
        out.status.success(),
        "helm install: {}",
        crate::common::printed(&out)
    );
}

#[test]
fn deploy_default_runs_as_pods_on_a_real_node_and_serves_through_its_services() {
    runs_as_pods(Install::Kustomize);
}

#[test]
fn the_helm_chart_runs_as_pods_on_a_real_node_and_serves_through_its_services() {
    runs_as_pods(Install::Helm);
}

fn runs_as_pods(how: Install) {
    let image = crate::image::archive();
    isolated(move || async move {
        let begun = Instant::now();
        let mut cp = start(&[REAL], image).await;
        cp.start_cert_manager().await.unwrap();

        if let Install::Helm = how {
            go_operators_crd_as_olm_leaves_it(&cp).await;
        }
        // The user's install.
        let work = tempfile::tempdir().unwrap();
        install(&cp, how, work.path()).await;
        let pods = operator_ready(&mut cp).await;
        eprintln!(
            "{how:?}: operator Ready as pods after {:?}",
            begun.elapsed()
        );
        if let Install::Helm = how {
            the_crd_is_nmos(&cp).await;
        }
        assert_eq!(pods.len(), 2, "{pods:?}");
        for p in &pods {
            let spec = p.spec.as_ref().unwrap();
            assert_eq!(
                spec.node_name.as_deref(),
                Some(REAL),
                "{:?}",
                p.metadata.name
            );
            let status = p.status.as_ref().unwrap();
            let c = &status.container_statuses.as_ref().unwrap()[0];
            assert_eq!(c.image, "localhost/nmo:dev");
        }
        no_restarts(&cp, NS, &pods).await;
        // Each pod Ready, read afresh: the Deployment's count of Ready
        // replicas lags a probe that just failed (a probe's 1 s timeout
        // on a machine held busy), which the next probe mends.
        let operator_pods: Api<Pod> = Api::namespaced(cp.client().await.unwrap(), NS);
        let all_ready = cp
            .wait_for("both operator pods Ready", Duration::from_secs(60), || {
                let operator_pods = operator_pods.clone();
                async move {
                    operator_pods
                        .list(&ListParams::default().labels("control-plane=controller-manager"))
                        .await
                        .is_ok_and(|l| {
                            l.items.len() == 2
                                && l.items.iter().all(|p| {
                                    p.status
                                        .as_ref()
                                        .and_then(|s| s.container_statuses.as_ref())
                                        .is_some_and(|c| c.iter().all(|c| c.ready))
                                })
                        })
                }
            })
            .await;
        if let Err(e) = all_ready {
            fail_describing(&cp, NS, e).await;
        }

        // The workload on the kwok node.
        let client = cp.client().await.unwrap();
        kubectl_ok(&cp, &["apply", "-f", "-"], Some(&web_on_kwok())).await;

        // The API server calls the webhook through its Service.
        admits_once_through_the_webhook(&cp, "nm-kwok", KWOK).await;

        // The operator (as a pod, in-cluster configuration) drains it.
        cp.wait_for("nm-kwok Succeeded", Duration::from_secs(120), || async {
            cp_phase(&client, "nm-kwok").await.as_deref() == Some("Succeeded")
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let nodes: Api<Node> = Api::all(client.clone());
        let node = nodes.get(KWOK).await.unwrap();
        assert_eq!(node.spec.as_ref().unwrap().unschedulable, Some(true));
        eprintln!("maintenance Succeeded after {:?}", begun.elapsed());

        // The metrics over HTTPS through their Service: a token bound to
        // the metrics-reader role reads them, no token is refused.
        let services: Api<Service> = Api::namespaced(client.clone(), NS);
        let svc = services
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|s| {
                s.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.contains("metrics"))
            })
            .expect("a metrics Service");
        let ip = svc.spec.unwrap().cluster_ip.unwrap();
        kubectl_ok(
            &cp,
            &["create", "serviceaccount", "scraper", "-n", "default"],
            None,
        )
        .await;
        kubectl_ok(
            &cp,
            &[
                "create",
                "clusterrolebinding",
                "scraper-reads-nmo",
                "--clusterrole=node-maintenance-operator-metrics-reader",
                "--serviceaccount=default:scraper",
            ],
            None,
        )
        .await;
        let token = cp
            .service_account_token("default", "scraper")
            .await
            .unwrap();
        let url = format!("https://{ip}:8443/metrics");
        // The Service answers once the kubelet's and kube-proxy's view of
        // the new pods has settled (a cold, busy machine: seconds after
        // the Deployment is Ready); an unanswered request proves nothing.
        let mut anonymous = 0;
        cp.wait_for(
            "the metrics Service answers",
            Duration::from_secs(60),
            || {
                anonymous = curl(&url, None).0;
                let answered = anonymous != 0;
                async move { answered }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            anonymous == 401 || anonymous == 403,
            "no token: HTTP {anonymous}"
        );
        let mut read = (0, String::new());
        cp.wait_for(
            "the metrics read with a reader's token",
            Duration::from_secs(30),
            || {
                read = curl(&url, Some(&token));
                let ok = read.0 == 200;
                async move { ok }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}: HTTP {}", read.0));
        assert!(
            read.1.contains("nodemaintenance_drain_duration")
                || read.1.contains("controller_runtime_reconcile_total"),
            "{}",
            &read.1[..read.1.len().min(2000)]
        );

        // Deleting the maintenance gives the node back.
        kubectl_ok(
            &cp,
            &[
                "delete",
                "nodemaintenance",
                "nm-kwok",
                "--wait=true",
                "--timeout=60s",
            ],
            None,
        )
        .await;
        let node = nodes.get(KWOK).await.unwrap();
        assert_ne!(node.spec.as_ref().unwrap().unschedulable, Some(true));

        match how {
            Install::Kustomize => memory_through_a_large_drain(&mut cp, &client).await,
            Install::Helm => {
                rolling_update_in_the_middle_of_a_drain(&mut cp, &client).await;
                an_api_outage_mid_drain_is_ridden_out(&mut cp, &client).await;
                uninstall_and_install_again(&mut cp, &client).await;
            }
        }

        // A policies ConfigMap that is not valid: a replica started on it
        // exits, and its log (read through the kubelet) says which file
        // and why.
        let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(client.clone(), NS);
        let name = configmaps
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .find(|n| n.ends_with("policies"))
            .expect("the policies ConfigMap");
        kubectl_ok(&cp, &["delete", "configmap", &name, "-n", NS], None).await;
        kubectl_ok(
            &cp,
            &[
                "create",
                "configmap",
                &name,
                "-n",
                NS,
                "--from-literal=broken.wasm=not a policy",
            ],
            None,
        )
        .await;
        let pod_api: Api<Pod> = Api::namespaced(client.clone(), NS);
        // One that is not already going (a rollout's old pods may be).
        let victim = pod_api
            .list(&ListParams::default().labels("control-plane=controller-manager"))
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|p| p.metadata.deletion_timestamp.is_none())
            .and_then(|p| p.metadata.name)
            .expect("a running replica");
        kubectl_ok(
            &cp,
            &["delete", "pod", "-n", NS, &victim, "--wait=false"],
            None,
        )
        .await;
        let deadline = Instant::now() + Duration::from_secs(120);
        let crashed = loop {
            let list = pod_api
                .list(&ListParams::default().labels("control-plane=controller-manager"))
                .await
                .unwrap();
            let restarted = list.items.iter().find(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .is_some_and(|c| {
                        c[0].restart_count > 0
                            || c[0]
                                .last_state
                                .as_ref()
                                .is_some_and(|l| l.terminated.is_some())
                    })
            });
            if let Some(p) = restarted {
                break p.metadata.name.clone().unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "no replica exited on the broken policies"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        // The replica in back-off: its log is its last run's.
        let deadline = Instant::now() + Duration::from_secs(60);
        let log = loop {
            let log = cp
                .kubectl(&["logs", "-n", NS, &crashed], None)
                .await
                .unwrap_or_else(|e| e.to_string());
            if log.contains("policy broken") && log.contains("not a WebAssembly file") {
                break log;
            }
            assert!(
                Instant::now() < deadline,
                "the log never names the broken policy:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        eprintln!(
            "a broken policy says why: {}",
            log.lines().last().unwrap_or_default()
        );

        // An image that is not there: the new pod says why in its events.
        kubectl_ok(
            &cp,
            &[
                "set",
                "image",
                "-n",
                NS,
                "deployment/node-maintenance-operator-controller-manager",
                "manager=localhost/nmo:not-built",
            ],
            None,
        )
        .await;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let events = cp_events(&client).await;
            if events.contains("localhost/nmo:not-built") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no event names the missing image:\n{events}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!("real node test done in {:?}", begun.elapsed());
        cp.stop();
    })
    .expect("a network namespace of the test's own");
}

/// The operator's containers' working set as the kubelet measures it
/// (`/metrics/resource`, what `kubectl top` and the memory limit see), in
/// bytes, the largest of its replicas.
async fn operator_working_set(cp: &ControlPlane) -> u64 {
    let text = cp
        .kubectl(
            &[
                "get",
                "--raw",
                &format!("/api/v1/nodes/{REAL}/proxy/metrics/resource"),
            ],
            None,
        )
        .await
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("container_memory_working_set_bytes{container=\"manager\""))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .fold(0, |m, v| m.max(v as u64))
}

/// A 1,000-pod drain of the kwok node, the operator's memory read from
/// the kubelet all along: it stays inside its Deployment's limit.
async fn memory_through_a_large_drain(cp: &mut ControlPlane, client: &kube::Client) {
    const PODS: usize = 1000;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let limit = deployments
        .get("node-maintenance-operator-controller-manager")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers[0].resources.clone())
        .and_then(|r| r.limits)
        .and_then(|l| l.get("memory").cloned())
        .expect("a memory limit");
    let limit_bytes = parse_quantity(&limit.0);
    kubectl_ok(
        cp,
        &[
            "scale",
            "deployment/web",
            "-n",
            "default",
            &format!("--replicas={PODS}"),
        ],
        None,
    )
    .await;
    let running = || web_running(client);
    let deadline = Instant::now() + Duration::from_secs(300);
    let scaling = Instant::now();
    loop {
        let n = running().await;
        if n >= PODS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never {PODS} pods running on {KWOK} ({n})"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!(
        "{PODS} pods running on {KWOK} after {:?}",
        scaling.elapsed()
    );
    let before = operator_working_set(cp).await;
    let started = Instant::now();
    kubectl_ok(
        cp,
        &["create", "-f", "-"],
        Some(&maintenance("nm-many", KWOK)),
    )
    .await;
    let mut peak = before;
    let deadline = Instant::now() + Duration::from_secs(300);
    while cp_phase(client, "nm-many").await.as_deref() != Some("Succeeded") {
        assert!(
            Instant::now() < deadline,
            "the {PODS}-pod drain never ended"
        );
        peak = peak.max(operator_working_set(cp).await);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let drained = started.elapsed();
    peak = peak.max(operator_working_set(cp).await);
    eprintln!(
        "{PODS}-pod drain in {drained:?}; operator working set (kubelet) {} MiB before, {} MiB at most, limit {}",
        before >> 20,
        peak >> 20,
        limit.0
    );
    assert!(before > 0, "the kubelet reports the operator's memory");
    assert!(
        peak < limit_bytes,
        "the operator's working set {peak} passed its limit {}",
        limit.0
    );
    kubectl_ok(
        cp,
        &[
            "delete",
            "nodemaintenance",
            "nm-many",
            "--wait=true",
            "--timeout=60s",
        ],
        None,
    )
    .await;
}

/// A maintenance held by a PodDisruptionBudget while the operator's
/// Deployment rolls (`kubectl rollout restart`: a new ReplicaSet, its pods
/// replacing the old one by one, the lock changing hands): nothing of the
/// maintenance is lost, and once the budget allows, the new leader
/// finishes it.
async fn rolling_update_in_the_middle_of_a_drain(cp: &mut ControlPlane, client: &kube::Client) {
    hold_web_with_a_budget(cp, client).await;
    let leader_before = leader_pod(client).await;
    kubectl_ok(
        cp,
        &["create", "-f", "-"],
        Some(&maintenance("nm-roll", KWOK)),
    )
    .await;
    wait_phase(client, "nm-roll", "Running", Duration::from_secs(60)).await;
    kubectl_ok(
        cp,
        &[
            "rollout",
            "restart",
            "-n",
            NS,
            "deployment/node-maintenance-operator-controller-manager",
        ],
        None,
    )
    .await;
    kubectl_ok(
        cp,
        &[
            "rollout",
            "status",
            "-n",
            NS,
            "deployment/node-maintenance-operator-controller-manager",
            "--timeout=180s",
        ],
        None,
    )
    .await;
    let phase = cp_phase(client, "nm-roll").await;
    assert_eq!(
        phase.as_deref(),
        Some("Running"),
        "held by the budget through the rollout"
    );
    kubectl_ok(cp, &["delete", "pdb", "web", "-n", "default"], None).await;
    wait_phase(client, "nm-roll", "Succeeded", Duration::from_secs(120)).await;
    let leader_after = leader_pod(client).await;
    assert!(
        leader_after.is_some() && leader_after != leader_before,
        "a replica of the new ReplicaSet leads: {leader_before:?} -> {leader_after:?}"
    );
    eprintln!("rolled in the middle of a drain; {leader_before:?} -> {leader_after:?}");
    kubectl_ok(
        cp,
        &[
            "delete",
            "nodemaintenance",
            "nm-roll",
            "--wait=true",
            "--timeout=60s",
        ],
        None,
    )
    .await;
}

/// The operator's replicas' restart counts, by pod.
async fn operator_restarts(client: &kube::Client) -> std::collections::BTreeMap<String, i32> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.list(&ListParams::default().labels("control-plane=controller-manager"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let restarts = p
                .status
                .and_then(|s| s.container_statuses)
                .map_or(0, |c| c.iter().map(|c| c.restart_count).sum());
            (p.metadata.name.unwrap_or_default(), restarts)
        })
        .collect()
}

/// How long the API server is stopped: past the leader's renew deadline
/// (10 s), short of the node lease's 40 s.
const OUTAGE: Duration = Duration::from_secs(15);

/// The API server stops answering (SIGSTOP: every connection hangs) for
/// longer than the leader's renew deadline, in the middle of a drain a
/// budget holds. The leader stops acting and stands for the lock again;
/// no replica exits (the restart counts stay as they were: before, the
/// leader exited on the lost leadership and the kubelet restarted it);
/// once the API server is back a replica leads and finishes the drain
/// when the budget is relaxed.
async fn an_api_outage_mid_drain_is_ridden_out(cp: &mut ControlPlane, client: &kube::Client) {
    hold_web_with_a_budget(cp, client).await;
    kubectl_ok(
        cp,
        &["create", "-f", "-"],
        Some(&maintenance("nm-outage", KWOK)),
    )
    .await;
    wait_phase(client, "nm-outage", "Running", Duration::from_secs(60)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let leader = loop {
        if let Some(l) = leader_pod(client).await {
            break l;
        }
        assert!(Instant::now() < deadline, "no replica leads");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let restarts = operator_restarts(client).await;
    let apiserver = cp
        .pids()
        .into_iter()
        .find(|(name, _)| name == "kube-apiserver")
        .map(|(_, pid)| pid)
        .expect("the API server's pid");
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &apiserver.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {apiserver}");
    };
    signal("-STOP");
    // The outage's length is the scenario, not a verdict: nothing is
    // decided by it.
    tokio::time::sleep(OUTAGE).await;
    signal("-CONT");
    cp.wait_for(
        "the API server answering again",
        Duration::from_secs(60),
        || async { cp_phase(client, "nm-outage").await.is_some() },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    // The leader lost the lock past its renew deadline and stood again.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let log = cp
            .kubectl(&["logs", "-n", NS, &leader], None)
            .await
            .unwrap_or_else(|e| e.to_string());
        if log.contains("standing for the lock again") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the leader never said it stood again after the outage:\n{}",
            log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while leader_pod(client).await.is_none() {
        assert!(
            Instant::now() < deadline,
            "no replica leads after the outage"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        cp_phase(client, "nm-outage").await.as_deref(),
        Some("Running"),
        "held by the budget through the outage"
    );
    kubectl_ok(cp, &["delete", "pdb", "web", "-n", "default"], None).await;
    wait_phase(client, "nm-outage", "Succeeded", Duration::from_secs(120)).await;
    assert_eq!(
        operator_restarts(client).await,
        restarts,
        "no replica exited over the outage"
    );
    eprintln!(
        "an API outage of {OUTAGE:?} mid-drain ridden out; leader before {leader}, after {:?}",
        leader_pod(client).await
    );
    kubectl_ok(
        cp,
        &[
            "delete",
            "nodemaintenance",
            "nm-outage",
            "--wait=true",
            "--timeout=60s",
        ],
        None,
    )
    .await;
}

/// Waits for the workload's three pods to run on the kwok node, then
/// puts a budget on them that allows no eviction: a drain of the node is
/// held until the budget is deleted.
async fn hold_web_with_a_budget(cp: &ControlPlane, client: &kube::Client) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while web_running(client).await < 3 {
        assert!(
            Instant::now() < deadline,
            "the workload never ran on {KWOK}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    kubectl_ok(
        cp,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web, namespace: default}\n\
             spec: {minAvailable: 3, selector: {matchLabels: {app: web}}}\n",
        ),
    )
    .await;
}

/// The end of each operator replica's log in `ns` (for a failing test's
/// message).
async fn operator_logs(cp: &ControlPlane, ns: &str) -> String {
    cp.kubectl(
        &[
            "logs",
            "-n",
            ns,
            "-l",
            "control-plane=controller-manager",
            "--tail=60",
            "--prefix",
        ],
        None,
    )
    .await
    .unwrap_or_else(|e| e.to_string())
}

/// NodeMaintenances as JSON (the Go operator's CRD or nmo's).
fn maintenances(client: &kube::Client) -> Api<kube::api::DynamicObject> {
    Api::all_with(
        client.clone(),
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "nodemaintenance.medik8s.io",
            "v1beta1",
            "NodeMaintenance",
        )),
    )
}

/// `512Mi`, `1Gi`, `100M` → bytes (the forms a memory limit takes here).
fn parse_quantity(q: &str) -> u64 {
    let (n, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = n.parse().expect("a memory quantity");
    n * match unit {
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => 1,
    }
}

/// How many of the workload's pods (`app=web`) run.
async fn web_running(client: &kube::Client) -> usize {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.list(&ListParams::default().labels("app=web"))
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count()
        })
        .unwrap_or(0)
}

/// Waits until maintenance `name` is in `phase`, failing after `limit`.
async fn wait_phase(client: &kube::Client, name: &str, phase: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while cp_phase(client, name).await.as_deref() != Some(phase) {
        assert!(Instant::now() < deadline, "{name} never {phase}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// kube-proxy's NAT rules in the test's namespace (for a failure's message).
pub(crate) fn service_rules() -> String {
    std::process::Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|e| format!("iptables-save: {e}"))
}

pub(crate) async fn cp_phase(client: &kube::Client, name: &str) -> Option<String> {
    let api = maintenances(client);
    let nm = api.get(name).await.ok()?;
    nm.data["status"]["phase"].as_str().map(str::to_owned)
}

/// The operator namespace's Warning events, one line each.
async fn cp_events(client: &kube::Client) -> String {
    use k8s_openapi::api::core::v1::Event;
    let api: Api<Event> = Api::namespaced(client.clone(), NS);
    api.list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .map(|e| {
                    format!(
                        "{} {}: {}",
                        e.type_.as_deref().unwrap_or(""),
                        e.reason.as_deref().unwrap_or(""),
                        e.message.as_deref().unwrap_or("")
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// The leader's replica: the Lease holder's identity is `<pod>_<pid>`.
async fn leader_pod(client: &kube::Client) -> Option<String> {
    leader_pod_in(client, NS).await
}

/// The leader's replica in namespace `ns` (nmo's identity is
/// `<pod>_<pid>`, controller-runtime's `<pod>_<uuid>`).
async fn leader_pod_in(client: &kube::Client, ns: &str) -> Option<String> {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let lease = leases
        .get_opt(nmo::controller::leader::LOCK_NAME)
        .await
        .ok()??;
    let holder = lease.spec?.holder_identity?;
    holder.rsplit_once('_').map(|(pod, _)| pod.to_owned())
}

/// `helm uninstall` leaves nothing of the operator's in its namespace: the
/// chart's post-delete hook removes the leader lease (which the leader
/// could not release: Helm deletes its Role as the pods terminate) and the
/// webhook's Secret (cert-manager keeps it), and its own objects; the CRD
/// stays. `helm install` again: the new replicas lead and serve.
async fn uninstall_and_install_again(cp: &mut ControlPlane, client: &kube::Client) {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Secret;
    let out = std::process::Command::new(cp.binaries().path("helm"))
        .args(["uninstall", "nmo", "--namespace", NS, "--kubeconfig"])
        .arg(cp.kubeconfig_path())
        .output()
        .expect("the control plane's helm");
    assert!(
        out.status.success(),
        "helm uninstall: {}",
        crate::common::printed(&out)
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let lease = leases
        .get_opt(nmo::controller::leader::LOCK_NAME)
        .await
        .unwrap();
    assert!(lease.is_none(), "the leader lease is left: {lease:?}");
    let secret = secrets
        .get_opt(nmo::uninstall::WEBHOOK_SECRET)
        .await
        .unwrap();
    assert!(secret.is_none(), "the webhook's Secret is left");
    let left = kubectl_ok(
        cp,
        &[
            "get",
            "all,serviceaccounts,roles,rolebindings",
            "-n",
            NS,
            "-o",
            "name",
        ],
        None,
    )
    .await;
    assert!(
        !left.contains("node-maintenance-operator"),
        "left in {NS} after helm uninstall:\n{left}"
    );
    kubectl_ok(cp, &["get", "crd", nmo::crd::CRD_NAME], None).await;

    helm_install(cp, &[]);
    let pods = operator_ready(cp).await;
    let names: Vec<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    cp.wait_for(
        "a replica of the new install leads",
        Duration::from_secs(60),
        || {
            let names = names.clone();
            async move { leader_pod(client).await.is_some_and(|l| names.contains(&l)) }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "uninstalled and installed again; {:?} leads",
        leader_pod(client).await
    );
}

/// Two real nodes, a replica on each: a maintenance of the node that hosts
/// the leader. The leader drains its own node: its workload and its own
/// pod, evicted through the operator's PodDisruptionBudget; the other
/// replica takes the lock and finishes; the replacement runs on the other
/// node. Deleting the maintenance gives the node back.
#[test]
fn the_operator_drains_the_node_it_runs_on_and_its_other_replica_finishes() {
    let image = crate::image::archive();
    isolated(move || async move {
        let begun = Instant::now();
        let mut cp = start(&[REAL, "real-2"], image).await;
        cp.start_cert_manager().await.unwrap();
        let work = tempfile::tempdir().unwrap();
        install(&cp, Install::Kustomize, work.path()).await;
        let pods = operator_ready(&mut cp).await;
        let on: Vec<String> = pods
            .iter()
            .filter_map(|p| p.spec.as_ref()?.node_name.clone())
            .collect();
        assert!(
            on.contains(&REAL.to_owned()) && on.contains(&"real-2".to_owned()),
            "one replica on each real node (the Deployment's spread): {on:?}"
        );
        // A real workload on both nodes.
        kubectl_ok(
            &cp,
            &["apply", "-f", "-"],
            Some(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: sleepers, namespace: default}\n\
                 spec:\n  replicas: 2\n  selector: {matchLabels: {app: sleepers}}\n  template:\n\
                 \x20   metadata: {labels: {app: sleepers}}\n    spec:\n\
                 \x20     topologySpreadConstraints: [{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: sleepers}}}]\n\
                 \x20     containers: [{name: c, image: 'localhost/pause:nmo', imagePullPolicy: Never}]\n",
            ),
        )
        .await;
        kubectl_ok(
            &cp,
            &["rollout", "status", "deployment/sleepers", "--timeout=120s"],
            None,
        )
        .await;
        let client = cp.client().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let leader = loop {
            if let Some(l) = leader_pod(&client).await {
                break l;
            }
            assert!(Instant::now() < deadline, "no leader");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let node = pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(&leader))
            .and_then(|p| p.spec.as_ref()?.node_name.clone())
            .expect("the leader is one of the replicas");
        eprintln!("leader {leader} on {node}; maintenance of {node}");

        kubectl_ok(&cp, &["create", "-f", "-"], Some(&maintenance("nm-own", &node))).await;
        let done = cp
            .wait_for("nm-own Succeeded", Duration::from_secs(180), || async {
                cp_phase(&client, "nm-own").await.as_deref() == Some("Succeeded")
            })
            .await;
        if let Err(e) = done {
            let state = cp
                .kubectl(&["get", "nm,pods,lease", "-A", "-o", "wide"], None)
                .await
                .unwrap_or_else(|e| e.to_string());
            panic!("{e}\n{state}");
        }
        eprintln!("own node drained after {:?}", begun.elapsed());
        let new_leader = leader_pod(&client).await.expect("a leader");
        assert_ne!(new_leader, leader, "the other replica took the lock");
        let all: Api<Pod> = Api::all(client.clone());
        let left: Vec<String> = all
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        assert!(left.is_empty(), "pods left on {node}: {left:?}");
        // The Deployment is whole again, on the other node.
        let pods = operator_ready(&mut cp).await;
        for p in &pods {
            assert_ne!(p.spec.as_ref().unwrap().node_name.as_deref(), Some(node.as_str()));
        }

        kubectl_ok(
            &cp,
            &["delete", "nodemaintenance", "nm-own", "--wait=true", "--timeout=60s"],
            None,
        )
        .await;
        let nodes: Api<Node> = Api::all(client.clone());
        let n = nodes.get(&node).await.unwrap();
        assert_ne!(n.spec.as_ref().unwrap().unschedulable, Some(true));
        cp.stop();
    })
    .expect("a network namespace of the test's own");
}

/// The namespace the Go operator's bundle is installed in here.
const GO_NS: &str = "medik8s-operators";

/// Installs the Go operator v0.21.0's own Deployment as OLM installs its
/// bundle's ClusterServiceVersion (command `/manager`, its arguments, its
/// 100Mi memory limit; its permissions as OLM grants them in the
/// AllNamespaces mode, the only one the bundle supports: cluster-wide) in
/// [`GO_NS`], with `replicas` and `image`, and its webhook certificate
/// (made for its Service) mounted where OLM mounts it
/// (controller-runtime's folder and OLM's `/apiserver.local.config`).
/// Returns the certificate (PEM), the webhook's CA bundle.
async fn install_go_deployment(cp: &ControlPlane, image: &str, replicas: i64) -> String {
    let text =
        std::fs::read_to_string(cp.binaries().path("node-maintenance-operator-csv.yaml")).unwrap();
    let csv: serde_json::Value = nmo::yaml::documents::<serde_json::Value>(&text)
        .unwrap()
        .remove(0);
    let install = &csv["spec"]["install"]["spec"];
    let ns = GO_NS;
    let sa = install["deployments"][0]["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut deployment = install["deployments"][0]["spec"].clone();
    deployment["replicas"] = replicas.into();
    let pod = &mut deployment["template"]["spec"];
    pod["containers"][0]["image"] = image.into();
    // On the real node: the kwok nodes run no containers (the bundle
    // prefers control-plane nodes, and tolerates their taint).
    pod["nodeSelector"] = serde_json::json!({"kubernetes.io/hostname": REAL});
    pod["tolerations"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"key": OPERATORS_ONLY, "operator": "Exists"}));
    let mounts = [
        ("/tmp/k8s-webhook-server/serving-certs", "webhook-cert"),
        ("/apiserver.local.config/certificates", "apiservice-cert"),
    ];
    for (path, name) in mounts {
        let volume = serde_json::json!({"name": name, "secret": {"secretName": "go-webhook-cert"}});
        let mount = serde_json::json!({"name": name, "mountPath": path, "readOnly": true});
        match pod["volumes"].as_array_mut() {
            Some(v) => v.push(volume),
            None => pod["volumes"] = serde_json::json!([volume]),
        }
        match pod["containers"][0]["volumeMounts"].as_array_mut() {
            Some(v) => v.push(mount),
            None => pod["containers"][0]["volumeMounts"] = serde_json::json!([mount]),
        }
    }
    // One rule more than the bundle's: v0.21.0's lease manager reads its
    // namespace through the cached client, which watches Namespaces; the
    // bundle grants only get and create, and the Go operator then waits
    // on that watch (`namespaces is forbidden`) and starts no maintenance
    // (docs/drop-in.md). nmo needs neither.
    let mut rules = install["clusterPermissions"][0]["rules"].clone();
    rules.as_array_mut().unwrap().push(serde_json::json!(
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}));
    let objects = serde_json::json!([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "medik8s-leases"}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "go-nmo"},
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "go-nmo"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "go-nmo"},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]},
        // The bundle supports the AllNamespaces install mode only, in
        // which OLM grants its `permissions` cluster-wide too.
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "go-nmo-all-namespaces"},
         "rules": install["permissions"][0]["rules"]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "go-nmo-all-namespaces"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "go-nmo-all-namespaces"},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]},
    ]);
    let yaml: String = objects
        .as_array()
        .unwrap()
        .iter()
        .map(|o| format!("---\n{o}\n"))
        .collect();
    kubectl_ok(cp, &["apply", "--server-side", "-f", "-"], Some(&yaml)).await;
    // The certificate OLM would make for the webhook's Service.
    let service = format!("{GO_WEBHOOK_SERVICE}.{ns}.svc");
    let cert = rcgen::generate_simple_self_signed(vec![
        service.clone(),
        format!("{service}.cluster.local"),
    ])
    .unwrap();
    let certs = tempfile::tempdir().unwrap();
    let (crt, key) = (certs.path().join("tls.crt"), certs.path().join("tls.key"));
    std::fs::write(&crt, cert.cert.pem()).unwrap();
    std::fs::write(&key, cert.signing_key.serialize_pem()).unwrap();
    let secret = kubectl_ok(
        cp,
        &[
            "create",
            "secret",
            "generic",
            "go-webhook-cert",
            "-n",
            ns,
            "--dry-run=client",
            "-o",
            "yaml",
            &format!("--from-file=tls.crt={}", crt.display()),
            &format!("--from-file=tls.key={}", key.display()),
            &format!("--from-file=apiserver.crt={}", crt.display()),
            &format!("--from-file=apiserver.key={}", key.display()),
        ],
        None,
    )
    .await;
    kubectl_ok(cp, &["apply", "-f", "-"], Some(&secret)).await;
    let deployment = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": install["deployments"][0]["name"], "namespace": ns}, "spec": deployment});
    kubectl_ok(
        cp,
        &["apply", "--server-side", "-f", "-"],
        Some(&deployment.to_string()),
    )
    .await;
    cert.cert.pem()
}

/// The taint that keeps all but the operator (which tolerates it) off the
/// real node, where the e2e suite's busybox could not be pulled.
const OPERATORS_ONLY: &str = "nmo-test/operators-only";
/// The webhook's Service, as OLM names it from the bundle.
const GO_WEBHOOK_SERVICE: &str = "node-maintenance-operator-controller-manager-service";

/// Registers the bundle's validating webhook as OLM does from the CSV's
/// `webhookdefinitions`: a Service to the Deployment's pods, and the
/// ValidatingWebhookConfiguration with `ca` (PEM) as its CA bundle.
async fn register_go_webhook(cp: &ControlPlane, ca: &str) {
    let text =
        std::fs::read_to_string(cp.binaries().path("node-maintenance-operator-csv.yaml")).unwrap();
    let csv: serde_json::Value = nmo::yaml::documents::<serde_json::Value>(&text)
        .unwrap()
        .remove(0);
    let w = &csv["spec"]["webhookdefinitions"][0];
    let labels =
        &csv["spec"]["install"]["spec"]["deployments"][0]["spec"]["selector"]["matchLabels"];
    let ca = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, ca);
    let objects = serde_json::json!([
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": GO_WEBHOOK_SERVICE, "namespace": GO_NS},
         "spec": {"selector": labels, "ports": [{"port": w["containerPort"], "targetPort": w["targetPort"]}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": w["generateName"]},
         "webhooks": [{
            "name": w["generateName"],
            "admissionReviewVersions": w["admissionReviewVersions"],
            "failurePolicy": w["failurePolicy"],
            "sideEffects": w["sideEffects"],
            "timeoutSeconds": w["timeoutSeconds"],
            "rules": w["rules"],
            "clientConfig": {"caBundle": ca, "service": {
                "name": GO_WEBHOOK_SERVICE, "namespace": GO_NS, "path": w["webhookPath"], "port": w["containerPort"]}},
         }]},
    ]);
    let yaml: String = objects
        .as_array()
        .unwrap()
        .iter()
        .map(|o| format!("---\n{o}\n"))
        .collect();
    kubectl_ok(cp, &["apply", "-f", "-"], Some(&yaml)).await;
}

/// The Go operator v0.21.0's own e2e suite (its `test/e2e`, built with
/// the control plane, with the one change build.sh says) against nmo
/// running in the Go operator's own Deployment, as a pod on a real node,
/// its webhook registered as OLM registers it from the bundle. The
/// suite's cluster: a control-plane node and two workers (kwok; the
/// suite's busybox workload runs there), the real node kept for the
/// operator. Every spec that does not need OpenShift passes; the one
/// skipped needs OpenShift (the etcd quorum check is OpenShift's in
/// v0.21.0 too).
#[test]
fn the_go_operators_e2e_suite_passes_against_nmo_in_its_deployment() {
    let image = crate::image::archive();
    isolated(move || async move {
        let mut cp = ControlPlane::start(Options {
            nodes: vec![
                NodeSpec::new("worker-1"),
                NodeSpec::new("worker-2"),
                NodeSpec::new("master-0").label("node-role.kubernetes.io/control-plane", ""),
            ],
            real_nodes: vec![REAL.to_owned()],
            images: vec![image],
            ..Options::default()
        })
        .await
        .expect("the control plane with a real node starts");
        kubectl_ok(
            &cp,
            &[
                "taint",
                "node",
                REAL,
                &format!("{OPERATORS_ONLY}=:NoSchedule"),
            ],
            None,
        )
        .await;
        let crd = std::fs::read_to_string(cp.binaries().path("node-maintenance-operator-crd.yaml"))
            .unwrap();
        cp.apply(&crd).await.unwrap();
        let ca = install_go_deployment(&cp, "localhost/nmo:dev", 1).await;
        register_go_webhook(&cp, &ca).await;
        replicas_ready(&mut cp, GO_NS, 1).await;
        let suite = cp.binaries().path("node-maintenance-operator-e2e");
        let begun = Instant::now();
        let out = tokio::process::Command::new(&suite)
            .args([
                "-test.v",
                "-test.timeout=20m",
                "-ginkgo.v",
                "-ginkgo.no-color",
                // Needs OpenShift: v0.21.0 checks the etcd quorum only there.
                "-ginkgo.skip=for the 1st master/control-plane node should fail",
            ])
            .env("KUBECONFIG", cp.kubeconfig_path())
            .env("OPERATOR_NS", GO_NS)
            .env("TEST_NAMESPACE", "nmo-e2e")
            .current_dir(tempfile::tempdir().unwrap().keep())
            .output()
            .await
            .expect("the e2e suite runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let ran = text
            .lines()
            .find(|l| l.trim_start().starts_with("Ran "))
            .unwrap_or("no summary")
            .to_owned();
        eprintln!(
            "the Go operator's e2e suite against nmo: {ran} in {:?}",
            begun.elapsed()
        );
        assert!(
            out.status.success(),
            "the Go operator's e2e suite failed against nmo:\n{}",
            text.lines()
                .rev()
                .take(120)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        );
        // The specs that ran: a missing node refused, a worker put under
        // maintenance and given back (the others skip themselves with
        // fewer than three control-plane nodes).
        assert!(ran.trim_start().starts_with("Ran 2 of"), "{ran}");
        cp.stop();
    })
    .expect("a network namespace of the test's own");
}

/// The Go operator v0.21.0's own Deployment ([`install_go_deployment`])
/// with only the image changed to nmo's: the pod runs nmo, becomes Ready
/// through the kubelet's probes without a restart, leads, and drains a
/// node.
#[test]
fn the_go_operators_own_deployment_with_the_image_swapped_runs_nmo() {
    let image = crate::image::archive();
    isolated(move || async move {
        let mut cp = start(&[REAL], image).await;
        let crd = std::fs::read_to_string(cp.binaries().path("node-maintenance-operator-crd.yaml"))
            .unwrap();
        cp.apply(&crd).await.unwrap();
        install_go_deployment(&cp, "localhost/nmo:dev", 1).await;
        let ns = GO_NS;
        let pods = replicas_ready(&mut cp, ns, 1).await;
        no_restarts(&cp, ns, &pods).await;

        let client = cp.client().await.unwrap();
        kubectl_ok(
            &cp,
            &["create", "-f", "-"],
            Some(&maintenance("nm-swap", KWOK)),
        )
        .await;
        wait_phase(&client, "nm-swap", "Succeeded", Duration::from_secs(120)).await;
        let memory = operator_working_set(&cp).await;
        eprintln!(
            "the Go Deployment running nmo: working set {} MiB (its limit 100Mi)",
            memory >> 20
        );
        // No restart (an OOM kill at 100Mi, say).
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let pods = pods.list(&ListParams::default()).await.unwrap().items;
        no_restarts(&cp, ns, &pods).await;
        cp.stop();
    })
    .expect("a network namespace of the test's own");
}

/// The Go operator's image, built here: `FROM scratch`, its binary (built
/// from its module with the control plane, static) as `/manager`, its
/// distroless user 65532.
const GO_IMAGE: &str = "localhost/node-maintenance-operator:v0.21.0";

fn go_image(dir: &std::path::Path) -> PathBuf {
    let bins = nmo_control_plane::Binaries::ensure().expect("the control plane's binaries");
    let out = dir.join("go-operator.tar");
    nmo_control_plane::scratch_image(
        &bins.path("node-maintenance-operator"),
        &out,
        GO_IMAGE,
        "/manager",
        "65532:65532",
    )
    .expect("the Go operator's image");
    out
}

/// Two replicas of the Go operator's own Deployment, first with the Go
/// operator v0.21.0's image, then (deleted and installed again) with
/// nmo's: the same hand-over for each, observed the same way and compared
/// as the differential suite compares (docs/drop-in.md's table). A drain
/// a PodDisruptionBudget holds; the leader's pod deleted as a rollout or
/// a node drain deletes it (gracefully); another replica takes the lock
/// and finishes once the budget is relaxed.
#[test]
fn two_replicas_hand_over_a_drain_as_the_go_operators_do() {
    let image = crate::image::archive();
    let work = tempfile::tempdir().unwrap();
    let go = go_image(work.path());
    isolated(move || async move {
        let mut cp = start_with(&[REAL], vec![image, go]).await;
        let crd = std::fs::read_to_string(cp.binaries().path("node-maintenance-operator-crd.yaml"))
            .unwrap();
        cp.apply(&crd).await.unwrap();
        let client = cp.client().await.unwrap();
        kubectl_ok(&cp, &["apply", "-f", "-"], Some(&web_on_kwok())).await;
        let mut seen = Vec::new();
        for image in [GO_IMAGE, "localhost/nmo:dev"] {
            install_go_deployment(&cp, image, 2).await;
            seen.push(hand_over(&mut cp, &client, image).await);
            // The next operator starts from nothing of this one's.
            kubectl_ok(
                &cp,
                &[
                    "delete",
                    "deployment",
                    "--all",
                    "-n",
                    GO_NS,
                    "--wait=true",
                    "--timeout=120s",
                ],
                None,
            )
            .await;
            let deadline = Instant::now() + Duration::from_secs(120);
            let pods: Api<Pod> = Api::namespaced(client.clone(), GO_NS);
            while !pods
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
            {
                assert!(Instant::now() < deadline, "{image}'s pods never went");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            kubectl_ok(&cp, &["delete", "lease", "--all", "-n", GO_NS], None).await;
        }
        let nmo = seen.pop().unwrap();
        let go = seen.pop().unwrap();
        crate::differential::assert_documented(&go, &nmo, "two replicas as pods on a real node");
        cp.stop();
    })
    .expect("a network namespace of the test's own");
}

/// The workload on the kwok node: three pods, the drain's to move.
pub(crate) fn web_on_kwok() -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: default}}\n\
         spec:\n  replicas: 3\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n\
         \x20   metadata: {{labels: {{app: web}}}}\n    spec:\n      nodeSelector: {{kubernetes.io/hostname: {KWOK}}}\n\
         \x20     tolerations: [{{key: kwok, operator: Exists}}]\n\
         \x20     terminationGracePeriodSeconds: 1\n\
         \x20     containers: [{{name: web, image: web:1}}]\n"
    )
}

/// How long a standby may take to lead after the leader's pod is deleted
/// for the hand-over to count as at once (a few retry periods, 2 s each);
/// a lock left to expire takes its lease duration, 15 s.
const AT_ONCE: Duration = Duration::from_secs(8);

/// One operator's hand-over, as observed: `replicas/…` keys.
async fn hand_over(
    cp: &mut ControlPlane,
    client: &kube::Client,
    image: &str,
) -> std::collections::BTreeMap<String, String> {
    let mut seen = std::collections::BTreeMap::new();
    let pods = replicas_ready(cp, GO_NS, 2).await;
    assert_eq!(pods.len(), 2, "{image}: {pods:?}");
    hold_web_with_a_budget(cp, client).await;
    kubectl_ok(
        cp,
        &["create", "-f", "-"],
        Some(&maintenance("handover", KWOK)),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while cp_phase(client, "handover").await.as_deref() != Some("Running") {
        if Instant::now() >= deadline {
            let logs = operator_logs(cp, GO_NS).await;
            let nm = cp
                .kubectl(&["get", "nodemaintenance", "handover", "-o", "yaml"], None)
                .await
                .unwrap_or_else(|e| e.to_string());
            panic!("{image}: handover never Running\n{nm}\n{logs}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let names: Vec<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let leader = loop {
        if let Some(l) = leader_pod_in(client, GO_NS).await {
            break l;
        }
        assert!(Instant::now() < deadline, "{image}: no replica leads");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    seen.insert(
        "replicas/leader".to_owned(),
        if names.contains(&leader) {
            "one of the replicas"
        } else {
            "another"
        }
        .to_owned(),
    );
    let deleted = Instant::now();
    kubectl_ok(
        cp,
        &["delete", "pod", "-n", GO_NS, &leader, "--wait=false"],
        None,
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        match leader_pod_in(client, GO_NS).await {
            Some(l) if l != leader => break,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "{image}: no other replica took the lock"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = deleted.elapsed();
    eprintln!("{image}: another replica led {took:?} after the leader's pod was deleted");
    seen.insert(
        "replicas/hand-over-after-a-graceful-delete".to_owned(),
        if took < AT_ONCE {
            "at once"
        } else {
            "after the lock expired"
        }
        .to_owned(),
    );
    seen.insert(
        "replicas/held/phase".to_owned(),
        cp_phase(client, "handover").await.unwrap_or_default(),
    );
    kubectl_ok(cp, &["delete", "pdb", "web", "-n", "default"], None).await;
    wait_phase(client, "handover", "Succeeded", Duration::from_secs(120)).await;
    let api = maintenances(client);
    let status = api.get("handover").await.unwrap().data["status"].clone();
    for field in crate::differential::STATUS_FIELDS
        .into_iter()
        .chain(["pendingPods"])
    {
        seen.insert(
            format!("replicas/succeeded/status.{field}"),
            status[field].to_string(),
        );
    }
    let last_error = status["lastError"].as_str().unwrap_or_default();
    seen.insert(
        "replicas/succeeded/status.lastError".to_owned(),
        if last_error.is_empty() {
            "empty"
        } else {
            "set"
        }
        .to_owned(),
    );
    kubectl_ok(
        cp,
        &["delete", "nodemaintenance", "handover", "--wait=false"],
        None,
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while api.get_opt("handover").await.unwrap().is_some() {
        if Instant::now() >= deadline {
            let logs = operator_logs(cp, GO_NS).await;
            panic!("{image}: the deleted maintenance never went\n{logs}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let node = Api::<Node>::all(client.clone()).get(KWOK).await.unwrap();
    let spec = node.spec.unwrap_or_default();
    seen.insert(
        "replicas/ended/node".to_owned(),
        format!(
            "unschedulable {:?}, taints {:?}",
            spec.unschedulable.unwrap_or(false),
            spec.taints
                .unwrap_or_default()
                .iter()
                .map(|t| t.key.clone())
                .collect::<Vec<_>>()
        ),
    );
    let restarts: i32 = Api::<Pod>::namespaced(client.clone(), GO_NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref())
        .flat_map(|c| c.iter().map(|c| c.restart_count))
        .sum();
    seen.insert("replicas/restarts".to_owned(), restarts.to_string());
    seen
}
