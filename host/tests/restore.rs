//! Restore is idempotent: a node a human had cordoned, tainted and
//! excluded from remediation before a maintenance is left exactly so when
//! the maintenance ends, whichever request of the restore fails (and is
//! retried), and whichever order two maintenances of one node end in; the
//! node lease never outlives the maintenance.

use crate::common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};
use nmo::crd::MaintenancePhase;
use nmo_sim::OneShot;

fn in_maintenance(node: &Node) -> bool {
    taint_keys(node).iter().any(|k| k == "medik8s.io/drain")
}

async fn lease(env: &Env, node: &str) -> Option<Lease> {
    Api::<Lease>::namespaced(env.client.clone(), "medik8s-leases")
        .get_opt(&format!("node-{node}"))
        .await
        .unwrap()
}

async fn start_and_succeed(env: &Env, name: &str, node: &str) {
    env.create_nm(name, node).await;
    env.wait_phase(name, MaintenancePhase::Succeeded).await;
    assert!(in_maintenance(&env.node(node).await));
    assert!(lease(env, node).await.is_some(), "{name}: lease taken");
}

async fn delete(env: &Env, name: &str) {
    env.nms()
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

/// One failed request at every step of the restore, each answered 500,
/// 429 or 503: the list of maintenances, the node's read and its restore
/// patch, the lease's read and delete, the record's removal (the second
/// read and patch of the node) and the finalizer's removal. Each is
/// retried and ends with the node as the human left it and no lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_at_any_request_of_the_restore_keeps_the_humans_state() {
    let env = Env::start(2).await;
    cordon_by_hand(&env.client, "worker-1").await;
    let points: [(&str, &str, u32); 8] = [
        ("list", "nodemaintenances", 0),
        ("get", "nodes", 0),
        ("patch", "nodes", 0),
        ("get", "leases", 0),
        ("delete", "leases", 0),
        ("get", "nodes", 1),
        ("patch", "nodes", 1),
        ("patch", "nodemaintenances", 0),
    ];
    let mut tried = 0;
    for (i, (verb, resource, after)) in points.iter().enumerate() {
        for code in [500, 429, 503] {
            let name = format!("fault-{i}-{code}");
            start_and_succeed(&env, &name, "worker-1").await;
            env.cluster.set_faults(|f| {
                f.next = vec![OneShot::new(verb, resource, *after, code)];
            });
            delete(&env, &name).await;
            env.wait_gone(&name).await;
            let left = env.cluster.sim().faults().next.len();
            env.cluster.set_faults(|f| f.next.clear());
            assert_eq!(left, 0, "{name}: the {verb} {resource} #{after} was made");
            let node = env.node("worker-1").await;
            if let Err(e) = as_the_human_left_it(&node) {
                panic!("{name} ({code} on {verb} {resource} #{after}): {e}");
            }
            assert!(
                lease(&env, "worker-1").await.is_none(),
                "{name}: the lease outlived the maintenance"
            );
            tried += 1;
        }
    }
    println!("a fault at each request of the restore: {tried} tried, {tried} held");
    env.stop().await;
}

/// Two NodeMaintenances of one node (possible with the webhook off) end in
/// every order: together, one after the other either way, and one whose
/// finalizer removal fails once together with the other. The node stays in
/// maintenance while one remains, and ends as the human left it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_maintenances_of_one_node_end_in_any_order_as_the_human_left_it() {
    let env = Env::start(2).await;
    cordon_by_hand(&env.client, "worker-1").await;
    let orders = ["together", "a-then-b", "b-then-a", "together-a-fails"];
    for order in orders {
        let (a, b) = (format!("{order}-a"), format!("{order}-b"));
        start_and_succeed(&env, &a, "worker-1").await;
        start_and_succeed(&env, &b, "worker-1").await;
        let (first, second) = match order {
            "b-then-a" => (&b, &a),
            _ => (&a, &b),
        };
        match order {
            "together" | "together-a-fails" => {
                if order == "together-a-fails" {
                    env.cluster.set_faults(|f| {
                        f.next = vec![OneShot::new("patch", "nodemaintenances", 0, 500)];
                    });
                }
                delete(&env, first).await;
                delete(&env, second).await;
                env.wait_gone(first).await;
                env.wait_gone(second).await;
            }
            _ => {
                delete(&env, first).await;
                env.wait_gone(first).await;
                let node = env.node("worker-1").await;
                assert!(
                    in_maintenance(&node),
                    "{order}: the node stays in maintenance for {second}"
                );
                assert!(
                    lease(&env, "worker-1").await.is_some(),
                    "{order}: lease kept"
                );
                delete(&env, second).await;
                env.wait_gone(second).await;
            }
        }
        env.cluster.set_faults(|f| f.next.clear());
        if let Err(e) = as_the_human_left_it(&env.node("worker-1").await) {
            panic!("{order}: {e}");
        }
        assert!(
            lease(&env, "worker-1").await.is_none(),
            "{order}: lease gone"
        );
    }
    println!(
        "two maintenances of one node: {} orders tried, {} held",
        orders.len(),
        orders.len()
    );
    env.stop().await;
}

/// A maintenance deleted before it ever touched the node (its policy
/// could not run yet, or it was deleted at once) changes nothing a human
/// did to the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_maintenance_that_never_started_leaves_a_human_cordon_alone() {
    let env = Env::start(2).await;
    cordon_by_hand(&env.client, "worker-1").await;
    // The lease cannot be taken: the maintenance never marks the node.
    env.cluster.set_faults(|f| {
        f.rules = vec![nmo_sim::FaultRule {
            verb: Some("get".into()),
            resource: Some("leases".into()),
            rate: 1.0,
            code: 500,
        }];
    });
    env.create_nm("never", "worker-1").await;
    wait_until("the lease failure", Duration::from_secs(30), || async {
        env.nms()
            .get("never")
            .await
            .unwrap()
            .status
            .and_then(|s| s.last_error)
            .is_some()
    })
    .await;
    assert!(!in_maintenance(&env.node("worker-1").await));
    env.cluster.set_faults(|f| f.rules.clear());
    // Deleted before the next attempt could mark it (the held retry).
    delete(&env, "never").await;
    env.wait_gone("never").await;
    if let Err(e) = as_the_human_left_it(&env.node("worker-1").await) {
        panic!("{e}");
    }
    env.stop().await;
}

/// A node named with the longest name a Node may have (253 characters)
/// gets a lease too (a cut name ending in a hash): its maintenance
/// succeeds and ends like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_253_character_name_is_maintained_and_restored() {
    let env = Env::start(1).await;
    let node = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    env.cluster.add_node(&node).unwrap();
    env.create_nm("long", &node).await;
    env.wait_phase("long", MaintenancePhase::Succeeded).await;
    let leases = Api::<Lease>::namespaced(env.client.clone(), "medik8s-leases");
    let name = nmo::controller::node::lease::lease_name(&node);
    assert!(
        leases.get_opt(&name).await.unwrap().is_some(),
        "lease {name}"
    );
    delete(&env, "long").await;
    env.wait_gone("long").await;
    assert!(!in_maintenance(&env.node(&node).await));
    assert!(leases.get_opt(&name).await.unwrap().is_none());
    env.stop().await;
}
