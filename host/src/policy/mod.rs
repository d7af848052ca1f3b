//! The policies as the operator has them, on top of the policy runtime
//! (the `nmo-policy-runtime` crate: the wasmtime sandbox, the WIT
//! bindings, the records and the checks of every answer).
//!
//! Three layers, each with its own error type, each depending on the
//! runtime and never the other way:
//!
//! - The policy set: [`set`] (which policy a maintenance uses, from
//!   `policies.yaml`), [`store`] (the set in use, reloaded when its folder
//!   changes), [`access`] (who may name which policy), [`metrics`] (the
//!   runtime's [`Observer`] as Prometheus families, and the reloads), and
//!   [`convert`]'s NodeMaintenance record. Errors: [`Error`].
//! - Distribution: [`oci`], policies pulled from and pushed to OCI
//!   registries.
//! - The authors' tools: [`harness`] (`nmo policy test`) and [`scaffold`]
//!   (`nmo policy new`). Errors: [`ToolError`].
//!
//! What the runtime exports that the operator uses is re-exported here, so
//! the rest of the operator names one `policy` module.

pub mod access;
pub mod convert;
mod error;
pub mod harness;
pub mod metrics;
pub mod oci;
pub mod scaffold;
mod selector;
pub mod set;
pub mod store;

pub use access::POLICY_ANNOTATION;
pub use error::{Error, Result, ToolError};
pub use metrics::PolicyMetrics;
pub use set::{PolicySet, Selected};
pub use store::{PolicyStore, Reload};

#[cfg(feature = "test-support")]
pub use nmo_policy_runtime::native;
pub use nmo_policy_runtime::{
    Action, Admission, CONTRACT_VERSION, CompileLimits, DEFAULT_POLICY_NAME, DEFAULT_POLICY_WASM,
    Decision, EngineConfig, Fleet, FleetNodes, HISTORY_WINDOW, HISTORY_WINDOW_SETTING, History,
    Interface, MAX_HISTORY_WINDOW, Notice, Observer, Owners, Plan, Policy, PolicyCache,
    PolicyEngine, Removal, SERVED_CONTRACTS, Settings, Step, Verdict, WORLD, Workloads,
    compile_worker_main, decide, fleet_nodes, hash_as_seen, recent, selfcheck, types, validate,
    workloads,
};
