//! The library's one error type.
//!
//! Every error knows whether it is worth retrying ([`Error::is_transient`])
//! and has a fixed category ([`Error::category`]) used as a metric label,
//! never a formatted string.

use std::time::Duration;

/// Everything that can go wrong in the nmo library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The policy file could not be read or compiled (not WebAssembly,
    /// corrupt, unreadable).
    #[error("policy {policy}: cannot load: {reason}")]
    PolicyLoad { policy: String, reason: String },

    /// The file is WebAssembly but not a component of our world
    /// (`medik8s:node-maintenance/drain-policy@0.1.0`): a core module, other
    /// exports, or imports the host does not provide.
    #[error(
        "policy {policy}: not a medik8s:node-maintenance/drain-policy@0.1.0 component: {reason}"
    )]
    PolicyWrongWorld { policy: String, reason: String },

    /// Loading the policy went over a limit: its size, or the time or
    /// memory its compilation may take.
    #[error("policy {policy}: refused: {reason}")]
    PolicyCompileLimit { policy: String, reason: String },

    /// The policy was built against another minor version of the contract.
    #[error(
        "policy {policy}: built against medik8s:node-maintenance@{found}, but this operator \
         implements @{expected}; rebuild the policy against the WIT package (or SDK) of \
         version {expected}"
    )]
    PolicyContractVersion {
        policy: String,
        found: String,
        expected: &'static str,
    },

    /// The policy's answer was larger than the host copies out of a sandbox.
    #[error(
        "policy {policy} gave an answer in {function} larger than the {limit_bytes} bytes the \
         host accepts"
    )]
    PolicyOutputLimit {
        policy: String,
        function: &'static str,
        limit_bytes: usize,
    },

    /// The policy trapped (a panic, `unreachable`, an out-of-bounds access).
    #[error("policy {policy} trapped in {function}: {reason}")]
    PolicyTrap {
        policy: String,
        function: &'static str,
        reason: String,
    },

    /// The policy ran past its deadline and was stopped.
    #[error("policy {policy} ran past its deadline of {deadline:?} in {function} and was stopped")]
    PolicyDeadline {
        policy: String,
        function: &'static str,
        deadline: Duration,
    },

    /// The policy tried to grow its memory past the limit and was stopped.
    #[error("policy {policy} exceeded its memory limit of {limit_bytes} bytes in {function}")]
    PolicyMemoryLimit {
        policy: String,
        function: &'static str,
        limit_bytes: usize,
    },

    /// The policy answered, but the answer cannot be acted on.
    #[error("policy {policy} gave an invalid answer in {function}: {reason}")]
    PolicyInvalidDecision {
        policy: String,
        function: &'static str,
        reason: String,
    },

    /// A NodeMaintenance asked (by annotation) for a policy the operator
    /// does not have.
    #[error("policy {name:?} is not loaded (loaded: {available})")]
    PolicyNotFound { name: String, available: String },

    /// The WebAssembly engine itself could not be set up.
    #[error("policy engine: {0}")]
    Engine(String),

    /// A Kubernetes API call failed.
    #[error("{op}: {source}")]
    Kube {
        op: &'static str,
        #[source]
        source: kube::Error,
    },

    /// The node named by a NodeMaintenance does not exist.
    #[error("nodes \"{0}\" not found")]
    NodeNotFound(String),

    /// The node lease is held, and valid, by someone else.
    #[error("lease is already held by {holder}")]
    LeaseHeld { holder: String },

    /// A change kept conflicting with concurrent writers.
    #[error("{0}: gave up after repeated conflicts")]
    Conflict(&'static str),

    /// This replica is no longer the leader.
    #[error("leader election lost: {0}")]
    LeadershipLost(&'static str),

    /// A reconcile panicked; the process and the other maintenances go on.
    #[error("reconcile panicked: {0}")]
    Panic(String),

    /// Bad configuration (flags, kubeconfig).
    #[error("configuration: {0}")]
    Config(String),
}

impl Error {
    /// A fixed, bounded label for metrics (`nmo_policy_errors_total{category}`).
    pub fn category(&self) -> &'static str {
        match self {
            Error::PolicyLoad { .. } => "load",
            Error::PolicyWrongWorld { .. } => "wrong_world",
            Error::PolicyTrap { .. } => "trap",
            Error::PolicyCompileLimit { .. } => "compile_limit",
            Error::PolicyContractVersion { .. } => "contract_version",
            Error::PolicyOutputLimit { .. } => "output_limit",
            Error::PolicyDeadline { .. } => "deadline",
            Error::PolicyMemoryLimit { .. } => "memory_limit",
            Error::PolicyInvalidDecision { .. } => "invalid_decision",
            Error::PolicyNotFound { .. } => "not_found",
            Error::Engine(_) => "engine",
            Error::Kube { .. } => "api",
            Error::NodeNotFound(_) => "node_not_found",
            Error::LeaseHeld { .. } => "lease_held",
            Error::Conflict(_) => "conflict",
            Error::LeadershipLost(_) => "leadership_lost",
            Error::Panic(_) => "panic",
            Error::Config(_) => "config",
        }
    }

    /// Whether trying the same thing again may succeed without anyone
    /// changing anything. A policy is deterministic in what it is given, so
    /// its errors are not transient: the maintenance waits for a new policy
    /// (or for new input) instead of hammering a broken one.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Kube { .. } | Error::LeaseHeld { .. } | Error::Conflict(_)
        )
    }

    /// Whether this error came from a policy (as opposed to the host).
    pub fn is_policy_error(&self) -> bool {
        matches!(
            self,
            Error::PolicyLoad { .. }
                | Error::PolicyWrongWorld { .. }
                | Error::PolicyTrap { .. }
                | Error::PolicyCompileLimit { .. }
                | Error::PolicyContractVersion { .. }
                | Error::PolicyOutputLimit { .. }
                | Error::PolicyDeadline { .. }
                | Error::PolicyMemoryLimit { .. }
                | Error::PolicyInvalidDecision { .. }
                | Error::PolicyNotFound { .. }
        )
    }

    /// Wraps a kube error with what was being done.
    pub fn kube(op: &'static str) -> impl FnOnce(kube::Error) -> Error {
        move |source| Error::Kube { op, source }
    }

    /// The HTTP status of an API error, if this is one.
    pub fn api_code(&self) -> Option<u16> {
        match self {
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } => Some(s.code),
            _ => None,
        }
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
