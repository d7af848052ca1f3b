//! A pass over one maintenance: `reconcile.rs` (the `Pass` and its steps),
//! `finish.rs` (the ways it ends), `status.rs` (its writes), `events.rs`;
//! here, what they share (`Next`, and two reads of a maintenance).

pub mod events;
pub(super) mod finish;
pub mod reconcile;
pub(super) use reconcile::Pass;
pub(super) mod status;

use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;

use crate::crd::{FINALIZER, MaintenancePhase, NodeMaintenance};

/// When a maintenance is next looked at, unless something changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Work is left: look again after this long.
    After(Duration),
    /// Done (the drain succeeded): looked at again after this long only to
    /// renew the node lease. Counted as a `success`, as the Go operator's
    /// reconcile of a finished maintenance is.
    Done(Duration),
    /// Nothing to do until the maintenance changes.
    Change,
}

impl Next {
    /// The `result` label of `controller_runtime_reconcile_total`, as
    /// controller-runtime counts the reconcile the Go operator would make.
    pub(crate) fn result_label(self) -> super::metrics::ReconcileResult {
        use super::metrics::ReconcileResult;
        match self {
            Next::After(_) => ReconcileResult::RequeueAfter,
            Next::Done(_) | Next::Change => ReconcileResult::Success,
        }
    }

    /// `self` with what is left of its wait, `since` it was wished for;
    /// `None` when the wait is over.
    pub(super) fn left(self, since: std::time::Instant) -> Option<Next> {
        let rest = |d: Duration| d.checked_sub(since.elapsed()).filter(|d| !d.is_zero());
        match self {
            Next::Change => Some(Next::Change),
            Next::After(d) => rest(d).map(Next::After),
            Next::Done(d) => rest(d).map(Next::Done),
        }
    }
}

impl From<Next> for Action {
    fn from(next: Next) -> Action {
        match next {
            Next::After(d) | Next::Done(d) => Action::requeue(d),
            Next::Change => Action::await_change(),
        }
    }
}

pub(super) fn has_finalizer(nm: &NodeMaintenance) -> bool {
    nm.finalizers().iter().any(|f| f == FINALIZER)
}

pub(super) fn phase(nm: &NodeMaintenance) -> Option<MaintenancePhase> {
    nm.status.as_ref().and_then(|s| s.phase)
}
