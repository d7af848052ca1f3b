//! The concurrency model's claim, timed (docs/architecture.md): a default
//! maintenance beside 100 maintenances whose drains wait a day (an
//! application that never answers a handshake) succeeds as fast as alone.
//! On one simulated cluster, in one run: three default maintenances of 20
//! pods alone, then three beside the 100 waiting ones; prints each
//! median and their ratio.
//!
//! Run with `cargo bench -p nmo --bench waits`.

use std::time::{Duration, Instant};

mod common;

use common::wait_succeeded;

use kube::api::{Api, PostParams};
use nmo::controller::{self, Context, Settings};
use nmo::crd::{NodeMaintenance, NodeMaintenanceSpec};
use nmo_sim::{SimCluster, SimOptions};
use serde_json::json;

const WAITING: usize = 100;
const PODS: usize = 20;
const RUNS: usize = 3;

fn bare_pod(c: &SimCluster, name: &str, node: &str) {
    c.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
    }))
    .unwrap();
}

async fn create(api: &Api<NodeMaintenance>, name: &str, node: &str, reason: &str) {
    let nm = NodeMaintenance::new(
        name,
        NodeMaintenanceSpec {
            node_name: node.into(),
            reason: Some(reason.into()),
        },
    );
    api.create(&PostParams::default(), &nm).await.unwrap();
}

/// One default maintenance of `node` (its pods owned by a ReplicaSet-less
/// Deployment would add scheduling; bare pods keep it to the drain).
async fn timed(api: &Api<NodeMaintenance>, node: &str) -> Duration {
    let name = format!("nm-{node}");
    let t = Instant::now();
    create(api, &name, node, "plain").await;
    wait_succeeded(api, &[name]).await;
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let c = SimCluster::start(SimOptions {
        time_scale: 1.0,
        ..SimOptions::default()
    })
    .await
    .unwrap();
    c.apply_yaml(&nmo::crd::crd_yaml()).unwrap();
    c.add_node("spare").unwrap();
    for kind in ["alone", "beside"] {
        for r in 0..RUNS {
            let node = format!("{kind}-{r}");
            c.add_node(&node).unwrap();
            for p in 0..PODS {
                bare_pod(&c, &format!("{node}-p{p:02}"), &node);
            }
        }
    }
    for i in 0..WAITING {
        let node = format!("wait-{i:03}");
        c.add_node(&node).unwrap();
        bare_pod(&c, &format!("waiter-{i:03}"), &node);
    }
    let client = nmo::client::client_from_kubeconfig(&c.kubeconfig())
        .await
        .unwrap();
    let hostile = std::fs::read(format!(
        "{}/nmo_policy_hostile.wasm",
        env!("NMO_POLICY_WASM_DIR")
    ))
    .unwrap();
    let metrics = nmo::registry::OperatorMetrics::register().unwrap();
    let engine = nmo::policy::PolicyEngine::observed(
        nmo::policy::EngineConfig::default(),
        metrics.policy.observer(),
    )
    .unwrap();
    let policy = engine.load("hostile", &hostile).unwrap();
    let ctx = Context::new(
        client.clone(),
        nmo::policy::PolicyStore::single(policy),
        Settings::default(),
        metrics.controller.clone(),
    );
    tokio::spawn(controller::run(ctx));
    let api: Api<NodeMaintenance> = Api::all(client.clone());

    let mut alone = Vec::new();
    for r in 0..RUNS {
        alone.push(timed(&api, &format!("alone-{r}")).await);
    }
    // A day's wait each: the hostile policy asks every bare pod's
    // application first (notify) and waits 24 h for an answer.
    let t = Instant::now();
    for i in 0..WAITING {
        create(
            &api,
            &format!("nm-wait-{i:03}"),
            &format!("wait-{i:03}"),
            "tune:notify=86400000,timeout=86400000",
        )
        .await;
    }
    loop {
        let waiting = api
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|nm| {
                nm.status
                    .as_ref()
                    .and_then(|s| s.last_error.as_deref())
                    .is_some_and(|e| e.contains("to leave or answer"))
            })
            .count();
        if waiting == WAITING {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "only {waiting} of {WAITING} drains waiting after 300 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "{WAITING} drains waiting on a day-long handshake after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let mut beside = Vec::new();
    for r in 0..RUNS {
        beside.push(timed(&api, &format!("beside-{r}")).await);
    }
    let (a, b) = (median(alone.clone()), median(beside.clone()));
    println!("| a default maintenance ({PODS} pods) | median of {RUNS} | runs |");
    println!("|---|---|---|");
    println!("| alone | {:.3} s | {alone:?} |", a.as_secs_f64());
    println!(
        "| beside {WAITING} waiting drains (--max-concurrent-maintenances 10) | {:.3} s | {beside:?} |",
        b.as_secs_f64()
    );
    println!(
        "ratio beside/alone: {:.2}x",
        b.as_secs_f64() / a.as_secs_f64()
    );
}
