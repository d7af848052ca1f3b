//! The promises the hostile rounds broke (`common/promises.rs`), each on
//! nmo-sim and, where the real API server's own behaviour matters
//! (owner references it accepts, the ReplicaSet controller's hand-over,
//! its disruption controller's budgets), on the real control plane.

use crate::common;

use common::drain_actions::{real, sim};
use common::promises as scenario;
use common::real::RealEnv;
use common::start_controller_with;
use nmo_control_plane::Options;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_owners_hold_no_drain_on_nmo_sim() {
    let (_dir, env) = sim(2).await;
    scenario::unreadable_owners_hold_no_drain(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_owners_hold_no_drain_on_the_real_control_plane() {
    let (_dir, env) = real(2).await;
    scenario::unreadable_owners_hold_no_drain(&env).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_allowing_nothing_holds_a_hand_over_on_nmo_sim() {
    let (_dir, env) = sim(2).await;
    scenario::a_budget_allowing_nothing_holds_a_hand_over(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_allowing_nothing_holds_a_hand_over_on_the_real_control_plane() {
    let (_dir, env) = real(2).await;
    scenario::a_budget_allowing_nothing_holds_a_hand_over(&env).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_of_the_surge_record_leave_no_replica_raised_on_nmo_sim() {
    let (_dir, env) = sim(3).await;
    scenario::edits_of_the_surge_record_leave_no_replica_raised(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_of_the_surge_record_leave_no_replica_raised_on_the_real_control_plane() {
    let (_dir, env) = real(3).await;
    scenario::edits_of_the_surge_record_leave_no_replica_raised(&env).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_surge_record_is_not_read_on_nmo_sim() {
    let (_dir, env) = sim(2).await;
    scenario::a_forged_surge_record_is_not_read(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_token_changes_only_what_it_must_on_the_real_control_plane() {
    let env = RealEnv::start_without_operator(Options::workers(1)).await;
    scenario::the_operators_token_changes_only_what_it_must(&env, &env.operator.clone()).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_surge_record_is_not_read_on_the_real_control_plane() {
    let (_dir, env) = real(2).await;
    scenario::a_forged_surge_record_is_not_read(&env).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surge_resumes_after_a_restart_on_nmo_sim() {
    let (dir, mut env) = sim(2).await;
    scenario::a_surge_is_running(&env).await;
    env.controller.abort();
    let _ = (&mut env.controller).await;
    let store = nmo::policy::PolicyStore::from_dir(
        nmo::policy::PolicyEngine::new(nmo::policy::EngineConfig::default()).unwrap(),
        dir.path(),
        None,
    )
    .unwrap();
    env.controller = start_controller_with(&env.client, store);
    scenario::a_surge_resumes_after_a_restart(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surge_resumes_after_a_restart_on_the_real_control_plane() {
    let (dir, mut env) = real(2).await;
    scenario::a_surge_is_running(&env).await;
    if let Some(c) = env.controller.take() {
        c.abort();
        let _ = c.await;
    }
    let store = nmo::policy::PolicyStore::from_dir(
        nmo::policy::PolicyEngine::new(nmo::policy::EngineConfig::default()).unwrap(),
        dir.path(),
        None,
    )
    .unwrap();
    env.controller = Some(start_controller_with(&env.operator, store));
    scenario::a_surge_resumes_after_a_restart(&env).await;
    env.stop();
}
