//! nmo's WebAssembly policy runtime.
//!
//! Every drain, failure and admission decision of the operator is made by a
//! policy: a WebAssembly component of the world
//! `medik8s:node-maintenance/drain-policy` (see `wit/node-maintenance.wit`).
//! This crate runs policies in a wasmtime sandbox and hands its caller
//! answers it can trust. It knows nothing of a Kubernetes client, of where
//! policies come from (a folder, a ConfigMap, a registry) or of the tools
//! policy authors use: the operator (`nmo`) builds those on top of it.
//!
//! - [`PolicyEngine`]: one wasmtime `Engine` (component model, epoch
//!   interruption driven by a ticker thread) and one `Linker` with WASI
//!   linked and nothing granted (no files, environment, arguments or
//!   network), shared by every policy.
//! - [`Policy`]: a compiled, pre-linked policy (`InstancePre`). Each decision
//!   instantiates it into a fresh `Store` with a memory limit and an epoch
//!   deadline, so no state survives from one decision to the next and a
//!   runaway call is stopped.
//! - [`validate`]: every answer is checked before the caller sees it; a
//!   bad answer is an [`Error::InvalidDecision`], never an action.
//! - [`convert`]: Kubernetes objects (pods, nodes) to the policy's records.
//! - [`selfcheck`]: the canned decisions every policy answers before use.
//! - [`Observer`]: where the caller counts decisions (the operator's
//!   Prometheus metrics).
//! - [`PolicyCache`], [`CompileLimits`]: compiled artifacts kept on disk,
//!   and compilation in a child process under limits.
//! - `native` (feature `native`): the default policy's rules written
//!   directly in Rust, as the reference the embedded default policy is
//!   checked and benchmarked against.

mod bindings;
mod cache;
mod compat;
mod compile;
mod contract;
pub mod convert;
mod decision;
pub mod digest;
mod engine;
mod error;
mod exports;
mod inputs;
#[cfg(feature = "native")]
pub mod native;
mod observe;
mod output;
pub mod selfcheck;
pub mod text;
pub mod validate;
pub mod workloads;

pub use bindings::types;
pub use cache::PolicyCache;
pub use compile::{CompileLimits, worker_main as compile_worker_main};
pub use contract::{
    CONTRACT_VERSION, DEFAULT_POLICY_NAME, DEFAULT_POLICY_WASM, SERVED_CONTRACTS, WORLD,
};
pub use decision::{Decision, decide};
pub use engine::{EngineConfig, Interface, Policy, PolicyEngine};
pub use error::{Error, Result};
pub use inputs::{
    Fleet, FleetNodes, HISTORY_WINDOW, HISTORY_WINDOW_SETTING, History, MAX_HISTORY_WINDOW,
    Settings, fleet_nodes, hash_as_seen, recent,
};
pub use observe::Observer;
pub use validate::{Action, Admission, Notice, Plan, Removal, Step, Verdict};
pub use workloads::{Owners, Workloads};
