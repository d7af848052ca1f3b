//! The integration suites, one test binary: each file beside this one is a
//! module (`cargo test -p nmo --test suite <file>::` runs one). One binary
//! rather than one per file: every test binary links the whole operator
//! (wasmtime, cranelift, kube), and thirty of them took 8 GB of disk and
//! most of a cold build's link time. `servers.rs` and `sandbox_memory.rs`
//! stay binaries of their own: they measure their own process's memory.

mod common;

mod crd;
mod deploy;
mod differential;
mod drain_actions;
mod economy;
mod fleet;
mod go_compat;
mod guide;
mod helm;
mod hostile_api;
mod hunter;
mod image;
mod kube_state_metrics;
mod layers;
mod leader;
mod migration;
mod oci;
mod olm;
mod olm_install;
mod operator;
mod orphans;
mod plan;
mod policy_default;
mod policy_dir;
mod policy_examples;
mod policy_sandbox;
mod prometheus;
mod prometheus_operator;
mod promises;
mod readme;
mod real_cluster;
mod real_deploy;
mod real_node;
mod reliability;
mod restore;
mod surfaces;
mod waits;
