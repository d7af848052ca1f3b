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

const NS: &str = "node-maintenance-operator-system";
const REAL: &str = "real-1";
const KWOK: &str = "worker-1";

async fn kubectl_ok(cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    cp.kubectl(args, stdin)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cp.logs_tail(20)))
}

/// The control plane with the kwok node (tainted: it takes only the
/// workload, which tolerates this) and the real nodes `real`, the image
/// imported into each.
async fn start(real: &[&str], image: PathBuf) -> ControlPlane {
    let cp = ControlPlane::start(Options {
        nodes: vec![NodeSpec::new(KWOK).max_pods(1100)],
        real_nodes: real.iter().map(|n| n.to_string()).collect(),
        images: vec![image],
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
fn user_overlay(dir: &std::path::Path) -> PathBuf {
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
async fn operator_ready(cp: &mut ControlPlane) -> Vec<Pod> {
    replicas_ready(cp, NS, 2).await
}

/// The operator's pods in `ns`, once `want` replicas are Ready (and
/// updated) through the kubelet's readiness probe.
async fn replicas_ready(cp: &mut ControlPlane, ns: &str, want: i32) -> Vec<Pod> {
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
        let described = cp
            .kubectl(&["describe", "pods", "-n", ns], None)
            .await
            .unwrap_or_else(|e| e.to_string());
        panic!("{e}\n{described}");
    }
    pods.list(&ListParams::default().labels("control-plane=controller-manager"))
        .await
        .unwrap()
        .items
}

fn maintenance(name: &str, node: &str) -> String {
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
        Install::Kustomize => {
            let overlay = user_overlay(dir);
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
        Install::Helm => {
            let chart = crate::common::real::deploy_dir().join("helm/node-maintenance-operator");
            let out = std::process::Command::new(cp.binaries().path("helm"))
                .args(["install", "nmo"])
                .arg(&chart)
                .args([
                    "--namespace",
                    NS,
                    "--create-namespace",
                    "--set",
                    "image.repository=localhost/nmo",
                    "--set",
                    "image.tag=dev",
                    "--kubeconfig",
                ])
                .arg(cp.kubeconfig_path())
                .output()
                .expect("the control plane's helm");
            assert!(
                out.status.success(),
                "helm install: {}",
                crate::common::printed(&out)
            );
        }
    }
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

        // The user's install.
        let work = tempfile::tempdir().unwrap();
        install(&cp, how, work.path()).await;
        let pods = operator_ready(&mut cp).await;
        eprintln!("{how:?}: operator Ready as pods after {:?}", begun.elapsed());
        assert_eq!(pods.len(), 2, "{pods:?}");
        for p in &pods {
            let spec = p.spec.as_ref().unwrap();
            assert_eq!(spec.node_name.as_deref(), Some(REAL), "{:?}", p.metadata.name);
            let status = p.status.as_ref().unwrap();
            let c = &status.container_statuses.as_ref().unwrap()[0];
            assert_eq!(c.image, "localhost/nmo:dev");
            assert_eq!(c.restart_count, 0, "{c:?}");
            assert!(c.ready);
        }

        // The workload on the kwok node.
        let client = cp.client().await.unwrap();
        kubectl_ok(
            &cp,
            &["apply", "-f", "-"],
            Some(&format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: default}}\n\
                 spec:\n  replicas: 3\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n\
                 \x20   metadata: {{labels: {{app: web}}}}\n    spec:\n      nodeSelector: {{kubernetes.io/hostname: {KWOK}}}\n\
                 \x20     tolerations: [{{key: kwok, operator: Exists}}]\n\
                 \x20     terminationGracePeriodSeconds: 1\n\
                 \x20     containers: [{{name: web, image: web:1}}]\n"
            )),
        )
        .await;

        // The API server calls the webhook through its Service: the first
        // maintenance is admitted, a second of the same node refused with
        // the operator's own words.
        // kube-proxy writes a Service's rules a moment after its endpoints
        // become ready: until then the call is refused, and so is the
        // maintenance (the webhook fails closed), as on any cluster.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match cp.kubectl(&["create", "-f", "-"], Some(&maintenance("nm-kwok", KWOK))).await {
                Ok(_) => break,
                Err(e) if e.to_string().contains("failed calling webhook") && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => panic!(
                    "the first maintenance is admitted: {e}\n{}\n{}",
                    cp.kubectl(&["get", "endpointslices,svc,pods", "-A", "-o", "wide"], None)
                        .await
                        .unwrap_or_else(|e| e.to_string()),
                    service_rules()
                ),
            }
        }
        let dup = cp
            .kubectl(&["create", "-f", "-"], Some(&maintenance("nm-dup", KWOK)))
            .await
            .expect_err("a second maintenance of the node is refused");
        let dup = dup.to_string();
        assert!(
            dup.contains("denied the request") && dup.contains(KWOK),
            "refused by the webhook: {dup}"
        );

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
            .find(|s| s.metadata.name.as_deref().is_some_and(|n| n.contains("metrics")))
            .expect("a metrics Service");
        let ip = svc.spec.unwrap().cluster_ip.unwrap();
        kubectl_ok(&cp, &["create", "serviceaccount", "scraper", "-n", "default"], None).await;
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
        let token = cp.service_account_token("default", "scraper").await.unwrap();
        let url = format!("https://{ip}:8443/metrics");
        let (code, _) = curl(&url, None);
        assert!(code == 401 || code == 403, "no token: HTTP {code}");
        let mut read = (0, String::new());
        cp.wait_for("the metrics read with a reader's token", Duration::from_secs(30), || {
            read = curl(&url, Some(&token));
            let ok = read.0 == 200;
            async move { ok }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}: HTTP {}", read.0));
        assert!(
            read.1.contains("nodemaintenance_drain_duration")
                || read.1.contains("controller_runtime_reconcile_total"),
            "{}",
            &read.1[..read.1.len().min(2000)]
        );

        // Deleting the maintenance gives the node back.
        kubectl_ok(&cp, &["delete", "nodemaintenance", "nm-kwok", "--wait=true", "--timeout=60s"], None).await;
        let node = nodes.get(KWOK).await.unwrap();
        assert_ne!(node.spec.as_ref().unwrap().unschedulable, Some(true));

        match how {
            Install::Kustomize => memory_through_a_large_drain(&mut cp, &client).await,
            Install::Helm => {
                rolling_update_in_the_middle_of_a_drain(&mut cp, &client).await;
                an_api_outage_mid_drain_is_ridden_out(&mut cp, &client).await;
            }
        }

        // A policies ConfigMap that is not valid: a replica started on it
        // exits, and its log (read through the kubelet) says which file
        // and why.
        let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), NS);
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
            &["create", "configmap", &name, "-n", NS, "--from-literal=broken.wasm=not a policy"],
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
        kubectl_ok(&cp, &["delete", "pod", "-n", NS, &victim, "--wait=false"], None).await;
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
                    .is_some_and(|c| c[0].restart_count > 0 || c[0].last_state.as_ref().is_some_and(|l| l.terminated.is_some()))
            });
            if let Some(p) = restarted {
                break p.metadata.name.clone().unwrap();
            }
            assert!(Instant::now() < deadline, "no replica exited on the broken policies");
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
            assert!(Instant::now() < deadline, "the log never names the broken policy:\n{log}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        eprintln!("a broken policy says why: {}", log.lines().last().unwrap_or_default());

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
            assert!(Instant::now() < deadline, "no event names the missing image:\n{events}");
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
    let running = || web_running(client);
    let deadline = Instant::now() + Duration::from_secs(120);
    while running().await < 3 {
        assert!(
            Instant::now() < deadline,
            "the workload never came back to {KWOK}"
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
    let deadline = Instant::now() + Duration::from_secs(120);
    while web_running(client).await < 3 {
        assert!(
            Instant::now() < deadline,
            "the workload never came back to {KWOK}"
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
fn service_rules() -> String {
    std::process::Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|e| format!("iptables-save: {e}"))
}

async fn cp_phase(client: &kube::Client, name: &str) -> Option<String> {
    let api: Api<kube::api::DynamicObject> = Api::all_with(
        client.clone(),
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "nodemaintenance.medik8s.io",
            "v1beta1",
            "NodeMaintenance",
        )),
    );
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
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let lease = leases
        .get_opt(nmo::controller::leader::LOCK_NAME)
        .await
        .ok()??;
    let holder = lease.spec?.holder_identity?;
    holder.rsplit_once('_').map(|(pod, _)| pod.to_owned())
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

/// The Go operator v0.21.0's own Deployment, as its OLM bundle's
/// ClusterServiceVersion installs it (command `/manager`, its arguments,
/// its 100Mi memory limit, its permissions), with only the image changed
/// to nmo's: the pod runs nmo, becomes Ready through the kubelet's probes
/// without a restart, leads, and drains a node. (Without OLM there is no
/// webhook certificate: the webhook waits for one, as documented.)
#[test]
fn the_go_operators_own_deployment_with_the_image_swapped_runs_nmo() {
    let image = crate::image::archive();
    isolated(move || async move {
        let mut cp = start(&[REAL], image).await;
        let crd = std::fs::read_to_string(cp.binaries().path("node-maintenance-operator-crd.yaml")).unwrap();
        cp.apply(&crd).await.unwrap();
        let text = std::fs::read_to_string(cp.binaries().path("node-maintenance-operator-csv.yaml")).unwrap();
        let csv: serde_json::Value = nmo::yaml::documents::<serde_json::Value>(&text).unwrap().remove(0);
        let install = &csv["spec"]["install"]["spec"];
        let ns = "medik8s-operators";
        let sa = install["deployments"][0]["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .unwrap()
            .to_owned();
        let mut deployment = install["deployments"][0]["spec"].clone();
        deployment["template"]["spec"]["containers"][0]["image"] = "localhost/nmo:dev".into();
        let objects = serde_json::json!([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "go-nmo"},
             "rules": install["clusterPermissions"][0]["rules"]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "go-nmo"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "go-nmo"},
             "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "go-nmo", "namespace": ns},
             "rules": install["permissions"][0]["rules"]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "go-nmo", "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "go-nmo"},
             "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]},
            {"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": install["deployments"][0]["name"], "namespace": ns}, "spec": deployment},
        ]);
        let yaml: String = objects
            .as_array()
            .unwrap()
            .iter()
            .map(|o| format!("---\n{o}\n"))
            .collect();
        kubectl_ok(&cp, &["apply", "--server-side", "-f", "-"], Some(&yaml)).await;
        let pods = replicas_ready(&mut cp, ns, 1).await;
        let status = pods[0].status.as_ref().unwrap();
        let c = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!(c.restart_count, 0, "{c:?}");

        let client = cp.client().await.unwrap();
        kubectl_ok(&cp, &["create", "-f", "-"], Some(&maintenance("nm-swap", KWOK))).await;
        wait_phase(&client, "nm-swap", "Succeeded", Duration::from_secs(120)).await;
        let memory = operator_working_set(&cp).await;
        eprintln!("the Go Deployment running nmo: working set {} MiB (its limit 100Mi)", memory >> 20);
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let p = pods.list(&ListParams::default()).await.unwrap().items.remove(0);
        let c = &p.status.unwrap().container_statuses.unwrap()[0];
        assert_eq!(c.restart_count, 0, "no restart (an OOM kill at 100Mi, say): {c:?}");
        cp.stop();
    })
    .expect("a network namespace of the test's own");
}
