//! The operator's error type: the controller's and servers' errors, with
//! the policy layer's wrapped whole ([`Error::Policy`]).
//!
//! Every error has a fixed category ([`Error::category`]) used as a metric
//! label, never a formatted string.

use crate::policy;

/// Everything that can go wrong in the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A policy could not be loaded or could not decide.
    #[error(transparent)]
    Policy(#[from] policy::Error),

    /// A Kubernetes API call failed. Its message is the API server's own
    /// (`nodes "worker-9" not found (NotFound)`), once: the client's error
    /// is not repeated as a source.
    #[error("{op}: {}", describe_kube(.error))]
    Kube {
        op: &'static str,
        error: kube::Error,
    },

    /// A watch (kube-runtime's watcher) failed.
    #[error("{op}: {source}")]
    Watch {
        op: &'static str,
        #[source]
        source: kube::runtime::watcher::Error,
    },

    /// The node lease is held, and valid, by someone else (the text of
    /// medik8s/common's `AlreadyHeldError`, which the Go operator's
    /// lastError carries).
    #[error("can't update or invalidate the lease because it is held by different owner: {holder}")]
    LeaseHeld { holder: String },

    /// An event could not be queued for writing (events came faster than
    /// the API server took them, or the writer stopped): it was dropped.
    #[error("event dropped: {0}")]
    EventDropped(&'static str),

    /// A change kept conflicting with concurrent writers.
    #[error("{0}: gave up after repeated conflicts")]
    Conflict(&'static str),

    /// This replica is no longer the leader.
    #[error("leader election lost: {0}")]
    LeadershipLost(&'static str),

    /// A reconcile panicked; the process and the other maintenances go on.
    #[error("reconcile panicked: {0}")]
    Panic(String),

    /// A task the operator waited for did not finish (it panicked or was
    /// cancelled).
    #[error("{what} did not finish")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },

    /// Bad configuration (flags, kubeconfig, certificates).
    #[error("configuration: {0}")]
    Config(String),

    /// The operator's pods did not go within the wait of a clean-up after
    /// an uninstall: nothing is removed under them.
    #[error(
        "{left} operator pod(s) still in {namespace} after {waited:?}: not cleaning up under them"
    )]
    PodsRemain {
        left: usize,
        namespace: String,
        waited: std::time::Duration,
    },
}

/// A policy's own error (loading it, or a decision) is the policy layer's.
impl From<nmo_policy_runtime::Error> for Error {
    fn from(e: nmo_policy_runtime::Error) -> Self {
        Error::Policy(e.into())
    }
}

impl Error {
    /// A fixed, bounded label for metrics and logs.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Policy(e) => e.category(),
            Error::Kube { .. } | Error::Watch { .. } | Error::EventDropped(_) => "api",
            Error::LeaseHeld { .. } => "lease_held",
            Error::Conflict(_) => "conflict",
            Error::LeadershipLost(_) => "leadership_lost",
            Error::Panic(_) | Error::Task { .. } => "panic",
            Error::Config(_) => "config",
            Error::PodsRemain { .. } => "pods_remain",
        }
    }

    /// Wraps a kube error with what was being done.
    pub fn kube(op: &'static str) -> impl FnOnce(kube::Error) -> Error {
        move |error| Error::Kube { op, error }
    }

    /// The API server's answer, when this is an error it sent.
    pub fn api_status(&self) -> Option<&kube::core::Status> {
        match self {
            Error::Kube {
                error: kube::Error::Api(status),
                ..
            } => Some(status),
            _ => None,
        }
    }
}

/// A client error in words: the API server's message and reason for an
/// error it sent, the client's own text otherwise.
pub(crate) fn describe_kube(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.reason.is_empty() => format!("{} ({})", s.message, s.code),
        kube::Error::Api(s) => format!("{} ({})", s.message, s.reason),
        other => other.to_string(),
    }
}

/// The operator's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
