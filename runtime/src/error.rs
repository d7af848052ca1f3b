//! The runtime's errors: loading a policy and running it. The operator's
//! policy set wraps them (`nmo::policy::Error::Runtime`).
//!
//! Every error has a fixed category ([`Error::category`]) used as a metric
//! label, never a formatted string.

use std::time::Duration;

/// Everything that can go wrong with a policy.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The policy file could not be read or compiled (not WebAssembly,
    /// corrupt, unreadable).
    #[error("policy {policy}: cannot load: {reason}")]
    Load { policy: String, reason: String },

    /// The file is WebAssembly but not a component of our world
    /// (`medik8s:node-maintenance/drain-policy@0.3.0`): a core module, other
    /// exports, or imports the host does not provide.
    #[error(
        "policy {policy}: not a medik8s:node-maintenance/drain-policy@0.3.0 component: {reason}"
    )]
    WrongWorld { policy: String, reason: String },

    /// Loading the policy went over a limit: its size, or the time or
    /// memory its compilation may take.
    #[error("policy {policy}: refused: {reason}")]
    CompileLimit { policy: String, reason: String },

    /// The policy was built against another minor version of the contract.
    #[error(
        "policy {policy}: built against medik8s:node-maintenance@{found}, but this operator \
         implements @{expected} (and loads policies of @0.3.x); rebuild the policy against version {expected}: update its \
         nmo-policy-sdk (or the WIT package) to the one this operator ships (`nmo policy new` \
         writes a crate that has it), then `cargo build --target wasm32-wasip2 --release`"
    )]
    ContractVersion {
        policy: String,
        found: String,
        expected: &'static str,
    },

    /// The policy's answer was larger than the host copies out of a sandbox.
    #[error(
        "policy {policy} gave an answer in {function} larger than the {limit_bytes} bytes the \
         host accepts"
    )]
    OutputLimit {
        policy: String,
        function: &'static str,
        limit_bytes: usize,
    },

    /// The policy trapped (a panic, `unreachable`, an out-of-bounds access).
    #[error("policy {policy} trapped in {function}: {reason}")]
    Trap {
        policy: String,
        function: &'static str,
        reason: String,
    },

    /// The policy ran past its deadline and was stopped.
    #[error("policy {policy} ran past its deadline of {deadline:?} in {function} and was stopped")]
    Deadline {
        policy: String,
        function: &'static str,
        deadline: Duration,
    },

    /// The policy tried to grow its memory past the limit and was stopped.
    #[error("policy {policy} exceeded its memory limit of {limit_bytes} bytes in {function}")]
    MemoryLimit {
        policy: String,
        function: &'static str,
        limit_bytes: usize,
    },

    /// The policy answered, but the answer cannot be acted on.
    #[error("policy {policy} gave an invalid answer in {function}: {reason}")]
    InvalidDecision {
        policy: String,
        function: &'static str,
        reason: String,
    },

    /// The policy refused the settings `policies.yaml` gives it.
    #[error("policy {policy} refused its settings: {reason}")]
    Settings { policy: String, reason: String },

    /// The WebAssembly engine itself could not be set up or run.
    #[error("policy engine: {0}")]
    Engine(String),

    /// The compiled-policy cache directory cannot be used.
    #[error("{0}")]
    Cache(String),
}

impl Error {
    /// A fixed, bounded label for metrics (`nmo_policy_errors_total{category}`).
    pub fn category(&self) -> &'static str {
        match self {
            Error::Load { .. } => "load",
            Error::WrongWorld { .. } => "wrong_world",
            Error::Trap { .. } => "trap",
            Error::CompileLimit { .. } => "compile_limit",
            Error::ContractVersion { .. } => "contract_version",
            Error::OutputLimit { .. } => "output_limit",
            Error::Deadline { .. } => "deadline",
            Error::MemoryLimit { .. } => "memory_limit",
            Error::InvalidDecision { .. } => "invalid_decision",
            Error::Settings { .. } => "settings",
            Error::Engine(_) => "engine",
            Error::Cache(_) => "config",
        }
    }
}

/// The runtime's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
