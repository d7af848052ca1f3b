//! The operator end to end on the real control plane (kube-apiserver, etcd,
//! kube-controller-manager, kube-scheduler, kwok; `nmo_control_plane`),
//! under the shipped ServiceAccount and RBAC: the scenarios `operator.rs`
//! runs on the simulated cluster, and what only a real API server can show.
//! The first run on a machine builds the control plane (a line says so).

mod common;

use common::real::RealEnv;
use common::*;
use nmo_control_plane::Options;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_cycle_on_a_worker_moves_the_workload_and_restores_the_node() {
    let env = RealEnv::start(Options::workers(3)).await;
    scenarios::full_cycle_on_a_worker_moves_the_workload_and_restores_the_node(&env).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_node_fails_the_maintenance() {
    let env = RealEnv::start(Options::workers(1)).await;
    scenarios::a_missing_node_fails_the_maintenance(&env).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdb_blocks_the_drain_until_it_allows() {
    let env = RealEnv::start(Options::workers(3)).await;
    scenarios::a_pdb_blocks_the_drain_until_it_allows(&env).await;
    env.stop();
}
