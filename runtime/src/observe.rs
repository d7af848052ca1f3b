//! Where a caller counts decisions. The runtime times every decision and
//! names how it failed ([`crate::Error::category`]); what is done with
//! that (the operator's Prometheus histogram and error counter) is the
//! caller's.

use std::any::Any;

use crate::decision::Decision;

/// Told of every decision a policy of the engine made.
///
/// `Any` lets the caller find its own observer again behind the engine's
/// `Arc<dyn Observer>` ([`crate::PolicyEngine::observer`]).
pub trait Observer: Any + Send + Sync {
    /// A decision answered (`category` `None`) or failed in `category`,
    /// after `seconds`.
    fn decided(&self, decision: Decision, seconds: f64, category: Option<&'static str>);
}
