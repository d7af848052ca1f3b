//! nmo: the Node Maintenance Operator, with WebAssembly drain policies.
//!
//! This crate is the operator's library; the `nmo` binary is a thin shell
//! around it. The policy runtime (the wasmtime sandbox, the WIT bindings,
//! the checks of every answer) is its own crate, `nmo-policy-runtime`.
//! Modules by concern:
//! - [`crd`]: the NodeMaintenance resource.
//! - [`client`]: the Kubernetes client as the operator configures it.
//! - [`controller`]: the run loop, a pass over a maintenance, the drain
//!   executor, the node's marks and lease, events.
//! - [`admission`]: what a fleet-wide decision sees (nodes, leases, other
//!   tools' claims, the history), watched for the controller and listed
//!   for the webhook and `nmo plan`, and asking the policy's `admit`.
//! - [`cluster`]: what the drain and `nmo plan` read alike (workloads,
//!   budgets, the surge record).
//! - [`policy`]: the policy set (which policy decides, hot reload, who
//!   may choose), OCI distribution and the authors' tools, on the runtime.
//! - [`plan`]: `nmo plan`, what a maintenance would do, changing nothing.
//! - [`server`], [`webhook`], [`secure_metrics`]: probes (their checks:
//!   [`probes`]), the metrics
//!   endpoint, the validating webhook; [`metrics`]: how each component
//!   registers its metrics, and [`registry`]: all of them on the one
//!   registry the operator serves; [`tls`]: the certificates and TLS
//!   configuration of the HTTPS servers.
//! - [`telemetry`]: JSON logs in the Go operator's shape; [`task`]: tasks
//!   that end with their owner.
//! - `fixtures` (feature `test-support`): realistic pods and nodes for
//!   tests and benchmarks.
//! - [`error`]: the operator's error type (wrapping [`policy::Error`]), with
//!   metric categories.

pub mod admission;
pub mod client;
pub mod cluster;
pub mod controller;
pub mod crd;
pub mod error;
#[cfg(feature = "test-support")]
pub mod fixtures;
pub mod metrics;
pub mod node_lease;
pub mod plan;
pub mod policy;
pub mod probes;
pub mod registry;
pub mod secure_metrics;
pub mod server;
pub mod sync;
pub mod task;
pub mod telemetry;
pub mod text;
pub mod tls;
pub mod uninstall;
pub mod webhook;
pub mod yaml;

pub use error::{Error, Result};
