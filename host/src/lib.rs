//! nmo: the Node Maintenance Operator, with WebAssembly drain policies.
//!
//! This crate is the operator's library; the `nmo` binary is a thin shell
//! around it. Modules by concern:
//! - [`crd`]: the NodeMaintenance resource.
//! - [`client`]: the Kubernetes client as the operator configures it.
//! - [`controller`]: the reconcile loop, drain executor, lease, node marks, events.
//! - [`fleet`]: the fleet a maintenance's admission sees (nodes, the other
//!   maintenances, the etcd guard), and asking the policy's `admit` about it.
//! - [`policy`]: the WebAssembly policy engine (wasmtime sandbox, WIT
//!   bindings, conversion from Kubernetes objects, validation of answers).
//! - [`plan`]: `nmo plan`, what a maintenance would do, changing nothing.
//! - [`server`], [`webhook`]: probes, the metrics endpoint, the validating webhook;
//!   [`metrics`]: how each component registers its metrics, and
//!   [`registry`]: all of them on the one registry the operator serves;
//!   [`tls`]: the certificates and TLS configuration of the HTTPS servers.
//! - [`telemetry`]: JSON logs in the Go operator's shape.
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
pub mod registry;
pub mod secure_metrics;
pub mod server;
pub mod task;
pub mod telemetry;
pub mod text;
pub mod tls;
pub mod webhook;
pub mod yaml;

pub use error::{Error, Result};
