//! deploy/: the kustomize layout renders, applies to the simulated cluster,
//! its Deployment's args are ones the binary accepts, and its RBAC allows
//! exactly the API calls the operator makes.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use nmo_sim::{SimCluster, SimOptions};
use serde_json::{Value, json};

fn render(overlay: &str) -> Vec<Value> {
    common::real::rendered(overlay)
}

/// CRDs a real cluster gets from cert-manager and the Prometheus operator.
const THIRD_PARTY: &[(&str, &str, &str)] = &[
    ("cert-manager.io", "Certificate", "certificates"),
    ("cert-manager.io", "Issuer", "issuers"),
    ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
    ("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
];

/// The overlays a user applies.
const OVERLAYS: [&str; 5] = [
    "default",
    "with-prometheus",
    "with-kube-state-metrics",
    "no-cert-manager",
    "metrics-open",
];

#[test]
fn the_overlays_hold_what_they_promise() {
    let kinds = |overlay: &str| -> BTreeSet<String> {
        render(overlay)
            .iter()
            .filter_map(|d| d["kind"].as_str().map(str::to_owned))
            .collect()
    };
    let default = kinds("default");
    for k in [
        "CustomResourceDefinition",
        "Deployment",
        "ClusterRole",
        "ValidatingWebhookConfiguration",
        "Certificate",
    ] {
        assert!(default.contains(k), "{k} missing from deploy/default");
    }
    // The replicas spread over nodes, with a budget of their own that lets
    // one go at a time (and never holds a single replica's node).
    let docs = render("default");
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the Deployment");
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let spread = &deployment["spec"]["template"]["spec"]["topologySpreadConstraints"][0];
    assert_eq!(spread["topologyKey"], "kubernetes.io/hostname", "{spread}");
    assert_eq!(&spread["labelSelector"]["matchLabels"], pod_labels);
    let pdb = docs
        .iter()
        .find(|d| d["kind"] == "PodDisruptionBudget")
        .expect("the operator's PodDisruptionBudget");
    assert_eq!(
        pdb["metadata"]["namespace"],
        "node-maintenance-operator-system"
    );
    assert_eq!(pdb["spec"]["maxUnavailable"], 1, "{pdb}");
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], pod_labels);
    // The Prometheus Operator's objects are an optional component.
    assert!(!default.contains("ServiceMonitor"));
    for overlay in ["with-prometheus", "metrics-open"] {
        let docs = render(overlay);
        for (kind, name) in [
            (
                "ServiceMonitor",
                "node-maintenance-operator-controller-manager-metrics-monitor",
            ),
            ("PrometheusRule", "node-maintenance-operator-alerts"),
        ] {
            assert!(
                docs.iter().any(|d| d["kind"] == kind
                    && d["metadata"]["name"] == name
                    && d["metadata"]["namespace"] == "node-maintenance-operator-system"),
                "{overlay}: {kind} {name}"
            );
        }
    }
    // kube-state-metrics' configuration, its read rights and the guide's
    // alerts on it come with its overlay only, and not with the operator's
    // own alerts (two flavours of the same alerts would page twice).
    let ksm = render("with-kube-state-metrics");
    for (kind, name, namespace) in [
        (
            "ConfigMap",
            "kube-state-metrics-nodemaintenance",
            Some("kube-system"),
        ),
        (
            "ClusterRole",
            "node-maintenance-operator-kube-state-metrics",
            None,
        ),
        (
            "ClusterRoleBinding",
            "node-maintenance-operator-kube-state-metrics",
            None,
        ),
        (
            "PrometheusRule",
            "node-maintenance-operator-kube-state-metrics-alerts",
            Some("node-maintenance-operator-system"),
        ),
    ] {
        assert!(
            ksm.iter().any(|d| d["kind"] == kind
                && d["metadata"]["name"] == name
                && d["metadata"]["namespace"].as_str() == namespace),
            "with-kube-state-metrics: {kind} {name}"
        );
    }
    assert!(
        !ksm.iter()
            .any(|d| d["metadata"]["name"] == "node-maintenance-operator-alerts"),
        "with-kube-state-metrics ships one flavour of the alerts"
    );
    assert!(
        !render("with-prometheus")
            .iter()
            .any(|d| d["metadata"]["name"] == "node-maintenance-operator-kube-state-metrics-alerts")
    );
    // No name carries the prefix twice.
    for overlay in OVERLAYS {
        for d in render(overlay) {
            let name = d["metadata"]["name"].as_str().unwrap_or_default();
            assert!(
                !name.contains("node-maintenance-operator-node-maintenance-operator"),
                "{overlay}: {name}"
            );
        }
    }
    // Without cert-manager, no webhook is registered (one that cannot
    // answer would refuse every NodeMaintenance).
    let bare = kinds("no-cert-manager");
    assert!(!bare.contains("ValidatingWebhookConfiguration"));
    assert!(!bare.contains("Certificate"));
}

/// Waits (60 s at most) for the NodeMaintenance `name` to succeed.
async fn succeeded(c: &SimCluster, name: &str) {
    let started = Instant::now();
    while c
        .get(
            "nodemaintenance.medik8s.io/v1beta1",
            "NodeMaintenance",
            None,
            name,
        )
        .unwrap()["status"]["phase"]
        != "Succeeded"
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{name} did not succeed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn kubectl(kc: &std::path::Path, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    common::kubectl_in(kc, args, stdin).await
}

/// Applies `overlay` to a simulated cluster that has only the CRDs it
/// needs, runs the operator with its Deployment's args and env (ports on
/// loopback, the policies ConfigMap's files as the policy directory, the
/// webhook wired as cert-manager's CA injector would), and takes one
/// maintenance through it.
async fn one_maintenance_through(overlay: &str) {
    let mut docs = render(overlay);
    let kinds: BTreeSet<String> = docs
        .iter()
        .filter_map(|d| d["kind"].as_str().map(str::to_owned))
        .collect();
    let c = SimCluster::start(SimOptions {
        time_scale: 20.0,
        ..SimOptions::default()
    })
    .await
    .unwrap();
    for (group, kind, plural) in THIRD_PARTY.iter().filter(|t| kinds.contains(t.1)) {
        c.create(json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{group}")},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase()},
                     "versions": [{"name": "v1", "served": true, "storage": true,
                                   "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}}))
            .unwrap();
    }
    for n in ["worker-1", "worker-2"] {
        c.add_node(n).unwrap();
    }
    c.create(common::bare("app", "worker-1", json!({}), 30))
        .unwrap();
    // The webhook's certificate and caBundle, as cert-manager would issue
    // and inject them; the Service's port is where this test serves it.
    // Without cert-manager there is no certificate: none is made here.
    let (certs, ca) = common::webhook_cert();
    let with_cert_manager = kinds.contains("Certificate");
    if !with_cert_manager {
        std::fs::remove_file(certs.path().join("tls.crt")).unwrap();
        std::fs::remove_file(certs.path().join("tls.key")).unwrap();
    }
    let webhook_port = common::free_port();
    let registered = kinds.contains("ValidatingWebhookConfiguration");
    for d in docs
        .iter_mut()
        .filter(|d| with_cert_manager && d["kind"] == "ValidatingWebhookConfiguration")
    {
        for hook in d["webhooks"].as_array_mut().unwrap() {
            hook["clientConfig"]["caBundle"] = json!(ca);
            hook["clientConfig"]["service"]["port"] = json!(webhook_port);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kc");
    c.write_kubeconfig(&kc).unwrap();
    let rendered = docs
        .iter()
        .map(|d| nmo::yaml::to_string(d).unwrap())
        .collect::<Vec<_>>()
        .join("---\n");
    // Server-side: the policies ConfigMap is too big for client-side
    // apply's last-applied annotation (256 KiB), on a real API server as
    // on the simulated one.
    let (ok, out) = kubectl(&kc, &["apply", "--server-side", "-f", "-"], Some(&rendered)).await;
    assert!(ok, "{overlay}: apply: {out}");

    let ns = "node-maintenance-operator-system";
    let deployment = c
        .get(
            "apps/v1",
            "Deployment",
            Some(ns),
            "node-maintenance-operator-controller-manager",
        )
        .unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    // The policies ConfigMap, as the kubelet mounts it.
    let cm = c
        .get(
            "v1",
            "ConfigMap",
            Some(ns),
            "node-maintenance-operator-policies",
        )
        .unwrap();
    let policy_dir = dir.path().join("policies");
    std::fs::create_dir(&policy_dir).unwrap();
    for (name, value) in cm["binaryData"].as_object().into_iter().flatten() {
        let bytes = base64::Engine::decode(
            &base64::engine::general_purpose::STANDARD,
            value
                .as_str()
                .unwrap()
                .split_whitespace()
                .collect::<String>(),
        )
        .unwrap();
        std::fs::write(policy_dir.join(name), bytes).unwrap();
    }
    for (name, value) in cm["data"].as_object().into_iter().flatten() {
        std::fs::write(policy_dir.join(name), value.as_str().unwrap()).unwrap();
    }
    let probe_port = common::free_port();
    let mut operator = common::deployment_process(
        container,
        &common::LocalPorts {
            probe: probe_port,
            webhook: webhook_port,
        },
        &policy_dir,
        certs.path(),
        &kc,
        ns,
    );
    let mut operator = operator.spawn().unwrap();
    // The process is the pod of its Deployment: its real log is the pod's
    // (`kubectl logs deployment/...`).
    let container_name = container["name"].as_str().unwrap().to_owned();
    let find_pod = || {
        c.list("v1", "Pod").unwrap().into_iter().find(|p| {
            p["metadata"]["namespace"] == ns
                && p["metadata"]["labels"]["control-plane"] == "controller-manager"
        })
    };
    common::wait_until(
        &format!("{overlay}: the Deployment's pod"),
        Duration::from_secs(30),
        || async { find_pod().is_some() },
    )
    .await;
    let pod = find_pod().unwrap();
    let log = c
        .attach_log(
            ns,
            pod["metadata"]["name"].as_str().unwrap(),
            Some(&container_name),
            operator.stderr.take().unwrap(),
        )
        .unwrap();
    common::wait_until(
        &format!("{overlay}: ready"),
        Duration::from_secs(60),
        || async {
            tokio::net::TcpStream::connect(("127.0.0.1", probe_port))
                .await
                .is_ok()
                && common::ready_on(probe_port).await
        },
    )
    .await;

    let nm = |name: &str| {
        format!(
            "apiVersion: nodemaintenance.medik8s.io/v1beta1\nkind: NodeMaintenance\nmetadata: {{name: {name}}}\nspec: {{nodeName: worker-1, reason: deploy test}}\n"
        )
    };
    let (ok, out) = kubectl(&kc, &["create", "-f", "-"], Some(&nm("nm-1"))).await;
    assert!(ok, "{overlay}: {out}");
    if registered {
        // The webhook answers (as the operator's): a second maintenance
        // for the node is refused.
        let (ok, out) = kubectl(&kc, &["create", "-f", "-"], Some(&nm("nm-2"))).await;
        assert!(
            !ok && out.contains("denied the request"),
            "{overlay}: {out}"
        );
    }
    succeeded(&c, "nm-1").await;
    let (ok, out) = kubectl(
        &kc,
        &["delete", "nm", "nm-1", "--wait=true", "--timeout=60s"],
        None,
    )
    .await;
    assert!(ok, "{overlay}: {out}");
    let node = c.get("v1", "Node", None, "worker-1").unwrap();
    assert_ne!(node["spec"]["unschedulable"], true, "{overlay}: restored");
    operator.kill().await.unwrap();
    log.await.unwrap();
    // What `kubectl logs` shows is the operator's own JSON log.
    let deployment_name = format!(
        "deployment/{}",
        deployment["metadata"]["name"].as_str().unwrap()
    );
    let (ok, out) = kubectl(
        &kc,
        &["logs", "-n", ns, &deployment_name, "-c", &container_name],
        None,
    )
    .await;
    assert!(ok, "{overlay}: {out}");
    let lines: Vec<Value> = out
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        lines.iter().any(|l| l["msg"] == "became leader"),
        "{overlay}: no leadership line in the pod's log:\n{out}"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_overlay_works_as_applied() {
    // Each on its own simulated cluster and ports: all at once.
    futures::future::join_all(OVERLAYS.map(one_maintenance_through)).await;
}

/// Whether `rules` allow `verb` on `group`/`resource`.
fn allowed(rules: &[Value], verb: &str, group: &str, resource: &str) -> bool {
    rules.iter().any(|r| {
        let has = |field: &str, v: &str| {
            r[field]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == v || x == "*"))
        };
        has("verbs", verb) && has("apiGroups", group) && has("resources", resource)
    })
}

/// The rules of the ClusterRoles and Roles an overlay ships.
/// Whether a role is one of `--metrics-secure`'s (the reviews it asks for,
/// the reader role a scraper is bound to): what they grant is shown needed
/// by [`metrics_are_secure_by_default_and_open_only_in_their_overlay`] and
/// servers.rs's secure-metrics test, not by the controller's scenario.
fn metrics_role(d: &Value) -> bool {
    d["metadata"]["name"]
        .as_str()
        .is_some_and(|n| n.ends_with("-metrics-auth-role") || n.ends_with("-metrics-reader"))
}

fn shipped_rules(docs: &[Value]) -> Vec<Value> {
    docs.iter()
        .filter(|d| matches!(d["kind"].as_str(), Some("ClusterRole" | "Role")))
        .filter(|d| !metrics_role(d))
        .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// A simulated cluster with the CRD, three nodes, a workload and two pods
/// that make the operator's work interesting; `authorization` switches
/// RBAC enforcement on.
async fn operator_cluster(authorization: bool) -> SimCluster {
    let c = SimCluster::start(SimOptions {
        time_scale: 20.0,
        ..SimOptions::default()
    })
    .await
    .unwrap();
    c.apply_yaml(&nmo::crd::crd_yaml()).unwrap();
    for n in ["worker-1", "worker-2", "worker-3"] {
        c.add_node(n).unwrap();
    }
    c.apply_yaml(common::WORKLOAD).unwrap();
    // The other tools' APIs the operator watches for admission.
    c.apply_yaml(common::TOOL_CRDS).unwrap();
    // Shipped by deploy/leases (applied with the rendered objects when
    // authorization is on): the operator never creates it.
    if !authorization {
        c.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "medik8s-leases"}}))
            .unwrap();
    }
    c.create(common::bare("extra", "worker-2", json!({}), 30))
        .unwrap();
    // A pod slower to stop than an attempt lasts: its maintenance takes a
    // second attempt, which reads the maintenance fresh before acting.
    c.create(common::bare(
        "slow",
        "worker-1",
        json!({"sim.nmo.medik8s.io/shutdown-seconds": "40"}),
        120,
    ))
    .unwrap();
    // What the webhook on OpenShift reads: the etcd guard PDB.
    c.apply_yaml("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: clusterversions.config.openshift.io}\nspec:\n  group: config.openshift.io\n  names: {kind: ClusterVersion, plural: clusterversions, singular: clusterversion}\n  scope: Cluster\n  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]\n").unwrap();
    let mut master = nmo_sim::node("master-0");
    master["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] = json!("");
    c.create(master).unwrap();
    c.create(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "openshift-etcd"}}),
    )
    .unwrap();
    c.create(
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "etcd-guard-pdb", "namespace": "openshift-etcd"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guard"}}}}),
    )
    .unwrap();
    c.set_authorization(authorization);
    tokio::time::sleep(Duration::from_millis(300)).await;
    c
}

/// Everything the operator does, on `client`: leadership (its lease in
/// `namespace`), two maintenances (evict, retried after an attempt that ran
/// out of time; and delete), their deletion, the webhook's checks.
async fn wait_removed(c: &SimCluster, names: &[&str]) {
    for name in names {
        let started = Instant::now();
        while c
            .get(
                "nodemaintenance.medik8s.io/v1beta1",
                "NodeMaintenance",
                None,
                name,
            )
            .is_ok()
        {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{name} not removed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

async fn operator_scenario(c: &SimCluster, client: kube::Client, namespace: &str) {
    let elector = nmo::controller::leader::Elector::new(
        client.clone(),
        namespace,
        "rbac-test",
        Default::default(),
    );
    assert!(elector.try_acquire_or_renew().await.unwrap());
    assert!(elector.try_acquire_or_renew().await.unwrap());
    let controller = common::start_controller(&client, common::HOSTILE);
    for (name, node, reason) in [
        ("nm-1", "worker-1", "tune:timeout=1000"),
        ("nm-2", "worker-2", "tune:delete"),
    ] {
        c.create(
            json!({"apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
            "metadata": {"name": name}, "spec": {"nodeName": node, "reason": reason}}),
        )
        .unwrap();
    }
    for name in ["nm-1", "nm-2"] {
        succeeded(c, name).await;
        c.delete(
            "nodemaintenance.medik8s.io/v1beta1",
            "NodeMaintenance",
            None,
            name,
        )
        .unwrap();
    }
    wait_removed(c, &["nm-1", "nm-2"]).await;
    // Contract 0.3's calls, once the other workers are back: a surge of
    // worker-3's web pod (the owner's replicas up and down, the pod's
    // deletion cost), a handshake with a bare pod, the volume wait.
    c.create(common::bare("asked", "worker-3", json!({}), 30))
        .unwrap();
    // A bare ReplicaSet's pod on worker-3 (its template pinned there until
    // the pod runs, then free: the replacement goes elsewhere).
    c.create(json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "cache", "namespace": "default"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "cache"}},
                 "template": {"metadata": {"labels": {"app": "cache"},
                                           // Its replacement takes 2 s to be Ready: the
                                           // surge watches the ReplicaSet meanwhile.
                                           "annotations": {"sim.nmo.medik8s.io/startup-seconds": "40"}},
                              "spec": {"nodeName": "worker-3", "containers": [{"name": "c", "image": "redis"}]}}}}))
    .unwrap();
    let started = Instant::now();
    while !c.list("v1", "Pod").unwrap().iter().any(|p| {
        p["metadata"]["labels"]["app"] == "cache"
            && p["spec"]["nodeName"] == "worker-3"
            && p["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
    }) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "cache pod not Ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.patch(
        "apps/v1",
        "ReplicaSet",
        Some("default"),
        "cache",
        &json!({"spec": {"template": {"spec": {"nodeName": null}}}}),
    )
    .unwrap();
    // A Deployment's pod on worker-3 too (placed while the other workers
    // and master-0 are cordoned, then they are not), whose replacement takes 2 s
    // to be Ready: its surge watches the Deployment meanwhile.
    let cordon = |node: &str, on: bool| {
        c.patch(
            "v1",
            "Node",
            None,
            node,
            &json!({"spec": {"unschedulable": on}}),
        )
        .unwrap();
    };
    for node in ["worker-1", "worker-2", "master-0"] {
        cordon(node, true);
    }
    c.create(json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "api", "namespace": "default"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "api"}},
                 "template": {"metadata": {"labels": {"app": "api"},
                                           "annotations": {"sim.nmo.medik8s.io/startup-seconds": "40"}},
                              "spec": {"containers": [{"name": "c", "image": "api"}]}}}}))
    .unwrap();
    let started = Instant::now();
    while !c
        .list("v1", "Pod")
        .unwrap()
        .iter()
        .any(|p| p["metadata"]["labels"]["app"] == "api" && p["spec"]["nodeName"] == "worker-3")
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "api pod not placed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for node in ["worker-1", "worker-2", "master-0"] {
        cordon(node, false);
    }
    // An attachment the volume wait watches go.
    c.create(
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": "csi-w3"},
        "spec": {"attacher": "csi.example.com", "nodeName": "worker-3",
                 "source": {"persistentVolumeName": "pv-w3"}}}),
    )
    .unwrap();
    c.create(
        json!({"apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
        "metadata": {"name": "nm-3"}, "spec": {"nodeName": "worker-3", "reason": "tune:surge,notify=300,volumes=30000"}}),
    )
    .unwrap();
    let started = Instant::now();
    while !c
        .list("nodemaintenance.medik8s.io/v1beta1", "NodeMaintenance")
        .unwrap()
        .iter()
        .any(|nm| {
            nm["metadata"]["name"] == "nm-3"
                && nm["status"]["lastError"]
                    .as_str()
                    .is_some_and(|e| e.contains("to detach: csi-w3"))
        })
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "nm-3 never waited for its volume"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.delete("storage.k8s.io/v1", "VolumeAttachment", None, "csi-w3")
        .unwrap();
    succeeded(c, "nm-3").await;
    c.delete(
        "nodemaintenance.medik8s.io/v1beta1",
        "NodeMaintenance",
        None,
        "nm-3",
    )
    .unwrap();
    wait_removed(c, &["nm-3"]).await;
    // One guard PDB, no Ready guard pod on the node: allowed.
    let validator = nmo::webhook::Validator::new(client.clone()).await;
    let nm = common::nm("m", "master-0");
    assert!(validator.validate_create(&nm).await.is_ok());
    controller.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_allows_every_call_the_operator_makes_and_nothing_unused() {
    let rules = shipped_rules(&render("default"));
    let c = operator_cluster(false).await;
    c.record_audit(true);
    let client = nmo::client::client_from_kubeconfig(&c.kubeconfig())
        .await
        .unwrap();
    operator_scenario(&c, client, "default").await;
    let calls: BTreeSet<(String, String, String)> = c
        .audit()
        .into_iter()
        .map(|a| {
            let resource = if a.subresource.is_empty() {
                a.resource
            } else {
                format!("{}/{}", a.resource, a.subresource)
            };
            (a.verb, a.group, resource)
        })
        .collect();
    for (verb, group, resource) in &calls {
        assert!(
            allowed(&rules, verb, group, resource),
            "the operator calls {verb} {group}/{resource}, which RBAC does not allow"
        );
    }
    for rule in &rules {
        for group in rule["apiGroups"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    let used = calls
                        .iter()
                        .any(|(v, g, r)| v == verb && g == group && r == resource);
                    assert!(
                        used,
                        "RBAC grants {verb} {group}/{resource}, which the operator never uses"
                    );
                }
            }
        }
    }
    c.stop().await;
}

/// The ServiceAccount the rendered Deployment runs as, and its namespace.
fn service_account(docs: &[Value]) -> (String, String) {
    let sa = docs
        .iter()
        .find(|d| d["kind"] == "ServiceAccount")
        .expect("a ServiceAccount");
    (
        sa["metadata"]["namespace"].as_str().unwrap().to_owned(),
        sa["metadata"]["name"].as_str().unwrap().to_owned(),
    )
}

/// The overlay's RBAC objects (with `drop`: one rule, by role and index,
/// taken out).
fn rbac_objects(docs: &[Value], drop: Option<(usize, usize)>) -> Vec<Value> {
    docs.iter()
        .enumerate()
        .filter(|(_, d)| {
            matches!(
                d["kind"].as_str(),
                Some(
                    "Namespace"
                        | "ServiceAccount"
                        | "ClusterRole"
                        | "ClusterRoleBinding"
                        | "Role"
                        | "RoleBinding"
                )
            )
        })
        .map(|(i, d)| {
            let mut d = d.clone();
            if let Some((doc, rule)) = drop
                && doc == i
                && let Some(rules) = d["rules"].as_array_mut()
            {
                rules.remove(rule);
            }
            d
        })
        .collect()
}

/// Runs the operator's scenario as the overlay's ServiceAccount on a
/// cluster that enforces RBAC; returns whether it went through, and the
/// requests RBAC refused it (it stops at the first refusal).
async fn as_service_account(docs: &[Value], drop: Option<(usize, usize)>) -> (bool, Vec<String>) {
    let (namespace, name) = service_account(docs);
    let user = format!("system:serviceaccount:{namespace}:{name}");
    let c = operator_cluster(true).await;
    for obj in rbac_objects(docs, drop) {
        c.create(obj).unwrap();
    }
    c.record_audit(true);
    let kubeconfig = c.kubeconfig_with_token(&format!("serviceaccount:{namespace}:{name}"));
    let client = nmo::client::client_from_kubeconfig(&kubeconfig)
        .await
        .unwrap();
    // A refused call can fail one of the scenario's assertions: that is
    // an outcome here, not a test failure.
    let scenario = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(
        operator_scenario(&c, client, &namespace),
    ));
    let denials = || -> Vec<String> {
        c.audit()
            .into_iter()
            .filter(|a| a.denied && a.user == user)
            .map(|a| {
                let sub = if a.subresource.is_empty() {
                    String::new()
                } else {
                    format!("/{}", a.subresource)
                };
                format!("{} {}/{}{sub}", a.verb, a.group, a.resource)
            })
            .collect()
    };
    let first_denial = async {
        loop {
            if !denials().is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let through = tokio::select! {
        r = scenario => r.is_ok(),
        _ = first_denial => false,
    };
    let found = denials();
    c.stop().await;
    (through, found)
}

/// With RBAC enforced, the operator running as its ServiceAccount takes
/// maintenances through with the shipped rules and nothing refused; and
/// without any one of those rules, something it does is refused (or
/// another shipped rule grants the same).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_rbac_is_enough_and_every_rule_is_needed() {
    let docs = render("default");
    let (through, refused) = as_service_account(&docs, None).await;
    assert!(refused.is_empty(), "the shipped RBAC refused: {refused:?}");
    assert!(through, "the operator's scenario did not go through");
    let variants: Vec<(usize, usize, String)> = docs
        .iter()
        .enumerate()
        .filter(|(_, d)| matches!(d["kind"].as_str(), Some("ClusterRole" | "Role")))
        .filter(|(_, d)| !metrics_role(d))
        .flat_map(|(i, d)| {
            let role = d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            d["rules"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .enumerate()
                .map(move |(r, rule)| (i, r, format!("{role}: {rule}")))
        })
        .collect();
    assert!(variants.len() >= 5, "{variants:?}");
    let results = futures::future::join_all(
        variants
            .iter()
            .map(|(doc, rule, _)| as_service_account(&docs, Some((*doc, *rule)))),
    )
    .await;
    for ((doc, index, rule), (_, refused)) in variants.iter().zip(results) {
        if !refused.is_empty() {
            continue;
        }
        // Nothing refused: only right if the other rules grant the same.
        let removed = &docs[*doc]["rules"][*index];
        let others: Vec<Value> = rbac_objects(&docs, Some((*doc, *index)))
            .iter()
            .filter(|d| matches!(d["kind"].as_str(), Some("ClusterRole" | "Role")))
            .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let strings = |f: &str| -> Vec<String> {
            removed[f]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        };
        for group in strings("apiGroups") {
            for resource in strings("resources") {
                for verb in strings("verbs") {
                    assert!(
                        allowed(&others, &verb, &group, &resource),
                        "without the rule {rule} nothing the operator does is refused, yet no other rule grants {verb} {group}/{resource}"
                    );
                }
            }
        }
    }
}

/// deploy/policies holds the policies of this repository as built, and its
/// ConfigMap, once mounted, is a policy directory the operator loads.
#[test]
fn the_policies_configmap_is_the_built_policies_and_loads() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/policies");
    let built = std::path::Path::new(env!("NMO_POLICY_WASM_DIR"));
    let mut shipped = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "wasm") {
            continue;
        }
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let fresh = built.join(format!("nmo_policy_{}.wasm", stem.replace('-', "_")));
        assert!(
            std::fs::read(&path).unwrap() == std::fs::read(&fresh).unwrap(),
            "deploy/policies/{stem}.wasm is not the built policy; refresh it: cp {} {}",
            fresh.display(),
            path.display()
        );
        shipped.push(stem);
    }
    shipped.sort();
    assert_eq!(
        shipped,
        [
            "default",
            "give-up",
            "never-force",
            "opt-out",
            "stateful-last"
        ]
    );

    // The rendered ConfigMap, written out as the kubelet would, loads.
    let docs = render("default");
    let cm = docs
        .iter()
        .find(|d| {
            d["kind"] == "ConfigMap"
                && d["metadata"]["name"] == "node-maintenance-operator-policies"
        })
        .expect("the policies ConfigMap");
    let mount = tempfile::tempdir().unwrap();
    use base64::Engine as _;
    for (k, v) in cm["binaryData"].as_object().unwrap() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap().replace('\n', ""))
            .unwrap();
        std::fs::write(mount.path().join(k), bytes).unwrap();
    }
    for (k, v) in cm["data"].as_object().unwrap() {
        std::fs::write(mount.path().join(k), v.as_str().unwrap()).unwrap();
    }
    let engine = nmo::policy::PolicyEngine::new(Default::default()).unwrap();
    let snap = nmo::policy::set::Snapshot::read(mount.path()).unwrap();
    let set = nmo::policy::PolicySet::load(&engine, &snap, None).unwrap();
    assert_eq!(set.default_name(), "default");
    assert_eq!(set.names().len(), 6, "{}", set.summary());

    // The Deployment mounts it where its --policy-dir points.
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let policy_dir = args
        .iter()
        .find_map(|a| a.strip_prefix("--policy-dir="))
        .expect("--policy-dir");
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == policy_dir)
        .expect("a volume at the policy dir");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(
        volume["configMap"]["name"],
        "node-maintenance-operator-policies"
    );
    let cache_dir = args
        .iter()
        .find_map(|a| a.strip_prefix("--policy-cache-dir="))
        .expect("--policy-cache-dir");
    assert!(
        container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["mountPath"].as_str().is_some_and(|mount| cache_dir
                .strip_prefix(mount)
                .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1))),
        "the cache is a directory inside a writable volume (the root filesystem is read-only; \
         an emptyDir is writable by every user, so the operator makes its own private \
         directory in it)"
    );
}

/// Metrics are protected by default: deploy/default's manager serves them
/// with --metrics-secure on :8443 (args nmo accepts), the ServiceMonitor of
/// deploy/with-prometheus scrapes over HTTPS with a token, and the RBAC does
/// what the mode needs on the simulated cluster's authorizer: the operator
/// may create TokenReviews and SubjectAccessReviews, a scraper bound to the
/// reader role may read /metrics, and one not bound may not. deploy/
/// metrics-open serves them over plain HTTP on :8080, without that RBAC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_secure_by_default_and_open_only_in_their_overlay() {
    let args_of = |docs: &[Value]| -> Vec<String> {
        let deployment = docs
            .iter()
            .find(|d| {
                d["kind"] == "Deployment"
                    && d["metadata"]["name"] == "node-maintenance-operator-controller-manager"
            })
            .expect("the Deployment");
        deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect()
    };
    let open = render("metrics-open");
    let open_args = args_of(&open);
    assert!(
        open_args.contains(&"--metrics-secure=false".to_owned()),
        "{open_args:?}"
    );
    assert!(
        open_args.contains(&"--metrics-bind-address=:8080".to_owned()),
        "{open_args:?}"
    );
    assert!(
        !open.iter().any(|d| d["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.contains("metrics-auth"))),
        "open metrics need no review rights"
    );
    let open_monitor = open.iter().find(|d| d["kind"] == "ServiceMonitor").unwrap();
    assert_eq!(open_monitor["spec"]["endpoints"][0]["port"], "metrics");

    let docs = render("with-prometheus");
    let args = args_of(&docs);
    assert_eq!(args, args_of(&render("default")));
    assert!(
        args.contains(&"--metrics-secure=true".to_owned()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--metrics-bind-address=:8443".to_owned()),
        "{args:?}"
    );
    for args in [&args, &open_args] {
        let help = std::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
            .args(args)
            .arg("--help")
            .output()
            .unwrap();
        assert!(help.status.success(), "nmo refuses {args:?}");
    }
    let monitor = docs.iter().find(|d| d["kind"] == "ServiceMonitor").unwrap();
    assert_eq!(monitor["spec"]["endpoints"][0]["scheme"], "https");
    assert!(monitor["spec"]["endpoints"][0]["bearerTokenFile"].is_string());

    let c = SimCluster::start(SimOptions::default()).await.unwrap();
    for doc in docs.iter().filter(|d| {
        matches!(
            d["kind"].as_str(),
            Some("ClusterRole" | "ClusterRoleBinding" | "ServiceAccount" | "Namespace")
        )
    }) {
        c.create(doc.clone()).unwrap();
    }
    c.create(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "prometheus", "namespace": "node-maintenance-operator-system"}})).unwrap();
    c.create(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "prometheus-reads-nmo"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "node-maintenance-operator-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "node-maintenance-operator-system"}]}))
        .unwrap();
    overlay_rbac_holds(&c);
    c.stop().await;
}

/// The checks of [`metrics_are_secure_by_default_and_open_only_in_their_overlay`]
/// against the simulated cluster's authorizer (holding its store's lock).
fn overlay_rbac_holds(c: &SimCluster) {
    let store = c.sim().store();
    let who = |sa: &str| {
        nmo_sim::auth::authenticate(
            &store,
            &format!("serviceaccount:node-maintenance-operator-system:{sa}"),
        )
        .unwrap()
    };
    let operator = who("node-maintenance-operator-controller-manager");
    for (group, resource) in [
        ("authentication.k8s.io", "tokenreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
    ] {
        let access = nmo_sim::auth::Access {
            verb: "create".into(),
            group: group.into(),
            resource: resource.into(),
            ..Default::default()
        };
        assert!(
            nmo_sim::auth::authorize(&store, &operator, &access),
            "{resource}"
        );
    }
    let metrics = nmo_sim::auth::Access {
        verb: "get".into(),
        path: Some("/metrics".into()),
        ..Default::default()
    };
    assert!(nmo_sim::auth::authorize(
        &store,
        &who("prometheus"),
        &metrics
    ));
    assert!(
        !nmo_sim::auth::authorize(&store, &operator, &metrics),
        "only readers read"
    );
}

/// The operator built without the `demo` feature (as the Dockerfile builds
/// it) does not link the simulated cluster.
#[test]
fn the_release_build_does_not_link_the_simulated_cluster() {
    let tree = |features: &[&str]| {
        let out = std::process::Command::new(env!("CARGO"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args([
                "tree",
                "--offline",
                "-p",
                "nmo",
                "-e",
                "normal",
                "--prefix",
                "none",
            ])
            .args(features)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(tree(&[]).contains("nmo-sim"), "the demo (default) links it");
    let release = tree(&["--no-default-features"]);
    assert!(!release.contains("nmo-sim"), "{release}");
    let dockerfile =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Dockerfile")).unwrap();
    assert!(dockerfile.contains("--no-default-features"));
}
