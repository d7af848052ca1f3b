//! The WebAssembly policy engine.
//!
//! Every drain and failure decision of the operator is made by a policy: a
//! WebAssembly component of the world `medik8s:node-maintenance/drain-policy`
//! (see `wit/node-maintenance.wit`). This module runs policies in a wasmtime
//! sandbox and hands the operator answers it can trust:
//!
//! - [`PolicyEngine`]: one wasmtime `Engine` (component model, epoch
//!   interruption driven by a ticker thread) and one `Linker` with WASI
//!   linked and nothing granted (no files, environment, arguments or
//!   network), shared by every policy.
//! - [`Policy`]: a compiled, pre-linked policy (`InstancePre`). Each decision
//!   instantiates it into a fresh `Store` with a memory limit and an epoch
//!   deadline, so no state survives from one decision to the next and a
//!   runaway call is stopped.
//! - [`validate`]: every answer is checked before the operator sees it; a
//!   bad answer is an [`Error::InvalidDecision`], never
//!   an action.
//! - [`convert`]: Kubernetes objects to the policy's records.
//! - `native` (feature `test-support`): the default policy's rules written
//!   directly in Rust, as the reference the embedded default policy is
//!   checked and benchmarked against.

pub mod access;
mod cache;
mod compile;
mod decision;
mod digest;
mod engine;
mod error;
mod inputs;
pub mod metrics;
pub mod oci;
mod output;

mod compat;
pub mod convert;
pub mod harness;
#[cfg(feature = "test-support")]
pub mod native;
pub mod scaffold;
mod selector;
pub mod selfcheck;
pub mod set;
pub mod store;
pub mod validate;
pub mod workloads;

/// Host bindings generated from `wit/node-maintenance.wit`.
#[allow(missing_docs, clippy::all)]
pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "drain-policy",
        // The decisions run under the engine's async support (the
        // deadline's timer, WASI's sleeps); the imports answer at once.
        exports: { default: async },
    });
}

/// Host bindings for contract 0.3.0 (`host/wit-compat`), a contract 0.4
/// extends: only its `types` interface is linked, answered by the 0.4
/// host's own accessors on the same resources, so a 0.3 policy loads and
/// sees what it always saw.
#[allow(missing_docs, clippy::all)]
pub(crate) mod bindings_0_3 {
    wasmtime::component::bindgen!({
        path: "wit-compat/node-maintenance-0.3.0.wit",
        world: "drain-policy",
        exports: { default: async },
        with: {
            "medik8s:node-maintenance/types.pod": super::bindings::medik8s::node_maintenance::types::Pod,
            "medik8s:node-maintenance/types.node": super::bindings::medik8s::node_maintenance::types::Node,
        },
    });
}

/// The records a policy receives and answers with, as generated from the WIT
/// package.
pub mod types {
    pub use super::bindings::medik8s::node_maintenance::types::*;
}

pub use cache::PolicyCache;
pub use compile::{CompileLimits, worker_main as compile_worker_main};
pub use decision::{Decision, decide};
pub use engine::{EngineConfig, Interface, Policy, PolicyEngine};
pub use error::{Error, Result};
pub use inputs::{
    Fleet, FleetNodes, HISTORY_WINDOW, HISTORY_WINDOW_SETTING, History, MAX_HISTORY_WINDOW,
    Settings, fleet_nodes, hash_as_seen, recent,
};
pub use metrics::PolicyMetrics;
pub use set::{POLICY_ANNOTATION, PolicySet, Selected};
pub use store::{PolicyStore, Reload};
pub use validate::{Action, Admission, Notice, Plan, Removal, Step, Verdict};
pub use workloads::{Owners, Workloads};

/// The default policy, built from `policies/default` by the host's build
/// script and embedded so the operator works with no policy directory.
pub const DEFAULT_POLICY_WASM: &[u8] = include_bytes!(concat!(
    env!("NMO_POLICY_WASM_DIR"),
    "/nmo_policy_default.wasm"
));

/// The name the embedded default policy goes by in logs, metrics and status.
pub const DEFAULT_POLICY_NAME: &str = "default";

/// The WIT world a policy must implement, for messages.
pub const WORLD: &str = "medik8s:node-maintenance/drain-policy@0.4.0";

/// The contract version this host implements; policies built against
/// another minor version, but for those of [`SERVED_CONTRACTS`], are
/// refused.
pub const CONTRACT_VERSION: &str = "0.4.0";

/// The earlier contract versions this host still loads policies of: each
/// is a subset of [`CONTRACT_VERSION`] (0.4 added a pod's `workload`).
pub const SERVED_CONTRACTS: &[&str] = &["0.3.0"];
