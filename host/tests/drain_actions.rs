//! Contract 0.3's drain actions end to end (`common/drain_actions.rs`):
//! each on the simulated cluster and on the real control plane
//! (kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kwok).

use crate::common;

use common::drain_actions as scenario;
use common::drain_actions::{real, sim};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn surge_keeps_a_single_replica_serving_on_nmo_sim() {
    let (_dir, env) = sim(3).await;
    scenario::surge_keeps_a_single_replica_serving(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn surge_keeps_a_single_replica_serving_on_the_real_control_plane() {
    let (_dir, env) = real(3).await;
    scenario::surge_keeps_a_single_replica_serving(&env).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handshake_asks_the_application_first_on_nmo_sim() {
    let (_dir, env) = sim(2).await;
    scenario::the_handshake_asks_the_application_first(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handshake_asks_the_application_first_on_the_real_control_plane() {
    let (_dir, env) = real(2).await;
    scenario::the_handshake_asks_the_application_first(&env).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_pod_is_waited_for_on_nmo_sim() {
    let (_dir, env) = sim(2).await;
    // 20x time: 100 simulated seconds are 5 real ones.
    scenario::a_jobs_pod_is_waited_for(&env, json!({"sim.nmo.medik8s.io/run-seconds": "100"}))
        .await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_pod_is_waited_for_on_the_real_control_plane() {
    let (_dir, env) = real(2).await;
    // kwok completes a Job's pod once it runs; it runs 5 s after placing.
    scenario::a_jobs_pod_is_waited_for(&env, json!({"pod-ready.stage.kwok.x-k8s.io/delay": "5s"}))
        .await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalation_deletes_where_the_policy_allows_on_nmo_sim() {
    let (_dir, env) = sim(2).await;
    scenario::escalation_deletes_where_the_policy_allows(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalation_deletes_where_the_policy_allows_on_the_real_control_plane() {
    let (_dir, env) = real(2).await;
    scenario::escalation_deletes_where_the_policy_allows(&env).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undrainable_node_is_parked_on_nmo_sim() {
    let (dir, env) = sim(2).await;
    let ctx = env.ctx.clone().expect("the controller's context");
    let registry = env.metrics.registry.clone();
    let parked = move || {
        // As at a scrape: the gauges from the controller's cache.
        ctx.refresh_gauges();
        let families = registry.gather();
        let family = families
            .iter()
            .find(|f| f.name() == "nmo_node_maintenances")?;
        family
            .get_metric()
            .iter()
            .find(|m| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == "phase" && l.value() == "Parked")
            })
            .map(|m| m.get_gauge().get_value())
    };
    scenario::an_undrainable_node_is_parked(&env, dir.path(), parked).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undrainable_node_is_parked_on_the_real_control_plane() {
    let (dir, env) = real(2).await;
    scenario::an_undrainable_node_is_parked(&env, dir.path(), || None).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn succeeded_waits_for_volumes_to_detach_on_nmo_sim() {
    let (_dir, env) = sim(1).await;
    scenario::succeeded_waits_for_volumes_to_detach(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn succeeded_waits_for_volumes_to_detach_on_the_real_control_plane() {
    let (_dir, env) = real(1).await;
    scenario::succeeded_waits_for_volumes_to_detach(&env).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_wait_ends_when_the_maintenance_is_deleted_on_nmo_sim() {
    let (_dir, env) = sim(1).await;
    scenario::a_volume_wait_ends_when_the_maintenance_is_deleted(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_wait_ends_when_the_maintenance_is_deleted_on_the_real_control_plane() {
    let (_dir, env) = real(1).await;
    scenario::a_volume_wait_ends_when_the_maintenance_is_deleted(&env).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surge_the_replicas_are_set_back_on_falls_back_on_nmo_sim() {
    let (_dir, env) = sim(2).await;
    scenario::a_surge_the_replicas_are_set_back_on_falls_back(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surge_the_replicas_are_set_back_on_falls_back_on_the_real_control_plane() {
    let (_dir, env) = real(2).await;
    scenario::a_surge_the_replicas_are_set_back_on_falls_back(&env).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_single_replica_workloads_surge_on_nmo_sim() {
    let (_dir, env) = sim(2).await;
    scenario::only_single_replica_workloads_surge(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_single_replica_workloads_surge_on_the_real_control_plane() {
    let (_dir, env) = real(2).await;
    scenario::only_single_replica_workloads_surge(&env).await;
    env.stop();
}
