//! The errors of the layers above the runtime: the policy set (reading a
//! policy folder, pulling what it names, choosing a maintenance's policy)
//! and the authors' tools. The controller wraps the set's
//! (`crate::Error::Policy`).
//!
//! Every error has a fixed category ([`Error::category`]) used as a metric
//! label, never a formatted string.

/// What can go wrong with the policy set: a policy itself (the runtime's
/// error), or the set around it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A policy could not be loaded or run.
    #[error(transparent)]
    Runtime(#[from] nmo_policy_runtime::Error),

    /// A NodeMaintenance asked (by annotation) for a policy the operator
    /// does not have.
    #[error("policy {name:?} is not loaded (loaded: {available})")]
    NotFound { name: String, available: String },

    /// A policy directory (or its `policies.yaml`) that cannot be used as
    /// a set.
    #[error("{0}")]
    Set(String),

    /// A policy named by an OCI reference could not be pulled, or what was
    /// pulled is not what the reference pins.
    #[error("policy {reference}: {why}")]
    Pull { reference: String, why: String },
}

impl Error {
    /// A fixed, bounded label for metrics (`nmo_policy_errors_total{category}`).
    pub fn category(&self) -> &'static str {
        match self {
            Error::Runtime(e) => e.category(),
            Error::NotFound { .. } => "not_found",
            Error::Pull { .. } => "pull",
            Error::Set(_) => "config",
        }
    }
}

/// The policy set's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in the authors' tools (`nmo policy test`, `nmo policy
/// new`).
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The policy under test could not be loaded or run.
    #[error(transparent)]
    Policy(#[from] Error),

    /// A scenario file of `nmo policy test` that cannot be read.
    #[error("{0}")]
    Scenario(String),

    /// `nmo policy new` could not write the crate.
    #[error("{0}")]
    Scaffold(String),
}

impl From<nmo_policy_runtime::Error> for ToolError {
    fn from(e: nmo_policy_runtime::Error) -> Self {
        ToolError::Policy(e.into())
    }
}
