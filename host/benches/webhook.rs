//! NodeMaintenances created at once through the webhook, on nmo-sim:
//! `cargo bench -p nmo --bench webhook`. `NMO_BENCH_NODES` nodes (default
//! 2,000) and as many maintenances (`NMO_BENCH_MAINTENANCES`, at most one
//! a node), created by `NMO_BENCH_CLIENTS` clients at once (default 5, as
//! the audit's), every create admitted by the `nmo` binary's webhook (the
//! API server calls it) while its controller drains them. Prints the
//! creates refused, the time until all are created and all Succeeded, the
//! operator's lists of nodes and NodeMaintenances (the simulated server's
//! audit, by the operator's User-Agent), and its peak resident memory.
//!
//! `NMO_BENCH_BINARY=<path>` runs another build of `nmo` (an older
//! release) in its place, for a side-by-side figure.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

mod common;

use common::{free_port, proc_status_kib, start_binary, stop_binary};
use futures::{StreamExt, stream};
use kube::Api;
use kube::api::PostParams;
use nmo::crd::{MaintenancePhase, NodeMaintenance, NodeMaintenanceSpec};
use nmo_sim::{SimCluster, SimOptions};
use serde_json::json;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let nodes = env_usize("NMO_BENCH_NODES", 2000);
    let count = env_usize("NMO_BENCH_MAINTENANCES", nodes).min(nodes);
    let clients = env_usize("NMO_BENCH_CLIENTS", 5).max(1);
    let cluster = SimCluster::start(SimOptions::default()).await.unwrap();
    for i in 0..nodes {
        cluster.add_node(&format!("node-{i:05}")).unwrap();
    }
    let work = tempfile::tempdir().unwrap();
    let kubeconfig = work.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig).unwrap();
    cluster.apply_yaml(&nmo::crd::crd_yaml()).expect("the CRD");
    // The webhook's certificate, and the configuration that sends every
    // create to it (failurePolicy Fail, as shipped).
    let certs = work.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    std::fs::write(certs.join("tls.crt"), cert.cert.pem()).unwrap();
    std::fs::write(certs.join("tls.key"), cert.signing_key.serialize_pem()).unwrap();
    let port = free_port();
    let (child, ready) = start_binary(
        &kubeconfig,
        &work.path().join("cache"),
        &[
            format!("--webhook-bind-address=127.0.0.1:{port}"),
            format!("--webhook-cert-dir={}", certs.display()),
        ],
    )
    .await;
    let pid = child.id().unwrap();
    let ca = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, cert.cert.pem());
    cluster
        .create(json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "vnodemaintenance"},
            "webhooks": [{"name": "vnodemaintenance.kb.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Fail", "timeoutSeconds": 15,
                "clientConfig": {"url": format!("https://127.0.0.1:{port}{}", nmo::webhook::PATH), "caBundle": ca},
                "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["nodemaintenance.medik8s.io"],
                           "apiVersions": ["v1beta1"], "resources": ["nodemaintenances"]}]}],
        }))
        .unwrap();
    let idle_kib = proc_status_kib(pid, "VmRSS:");
    cluster.record_audit(true);

    let client = nmo::client::client_from_kubeconfig(&cluster.kubeconfig())
        .await
        .unwrap();
    let api: Api<NodeMaintenance> = Api::all(client);
    let refused = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    stream::iter(0..count)
        .for_each_concurrent(clients, |i| {
            let (api, refused) = (api.clone(), refused.clone());
            async move {
                let nm = NodeMaintenance::new(
                    &format!("nm-{i:05}"),
                    NodeMaintenanceSpec {
                        node_name: format!("node-{i:05}"),
                        reason: None,
                    },
                );
                if let Err(e) = api.create(&PostParams::default(), &nm).await
                    && refused.fetch_add(1, Ordering::Relaxed) == 0
                {
                    eprintln!("first refusal: {e}");
                }
            }
        })
        .await;
    let created = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(1800);
    let mut peak_kib = 0;
    loop {
        peak_kib = peak_kib.max(proc_status_kib(pid, "VmRSS:"));
        let all = api.list(&Default::default()).await.unwrap().items;
        let done = all
            .iter()
            .filter(|nm| {
                nm.status.as_ref().and_then(|s| s.phase) == Some(MaintenancePhase::Succeeded)
            })
            .count();
        if done + refused.load(Ordering::Relaxed) >= count {
            break;
        }
        assert!(Instant::now() < deadline, "{done} of {count} Succeeded");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let succeeded = started.elapsed();
    let hwm_kib = proc_status_kib(pid, "VmHWM:");
    let lists = |resource: &str| {
        cluster
            .audit()
            .iter()
            .filter(|r| {
                r.user_agent == nmo::client::USER_AGENT
                    && r.verb == "list"
                    && r.resource == resource
            })
            .count()
    };
    let (node_lists, nm_lists) = (lists("nodes"), lists("nodemaintenances"));
    stop_binary(child).await;
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "{count} NodeMaintenances through the webhook ({nodes} nodes, {clients} clients at once; nmo ready in {:.1} s)",
        ready.as_secs_f64()
    );
    println!(
        "  refused {} · all created {:.1} s · all Succeeded {:.1} s",
        refused.load(Ordering::Relaxed),
        created.as_secs_f64(),
        succeeded.as_secs_f64()
    );
    println!("  operator lists: nodes {node_lists}, NodeMaintenances {nm_lists}");
    println!(
        "  operator memory: idle {:.1} MiB, peak (VmHWM) {:.1} MiB, sampled peak {:.1} MiB; {:.1} KiB a maintenance above idle",
        mib(idle_kib),
        mib(hwm_kib),
        mib(peak_kib),
        (hwm_kib.saturating_sub(idle_kib)) as f64 / count.max(1) as f64
    );
}
