//! When a pass wants its maintenance looked at again: [`Next`], what a
//! pass answers and the maintenance's memory keeps, and [`backoff`], the
//! wait before a retry.

use std::time::Duration;

use kube::runtime::controller::Action;

use super::metrics::ReconcileResult;

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
    pub(crate) fn result_label(self) -> ReconcileResult {
        match self {
            Next::After(_) => ReconcileResult::RequeueAfter,
            Next::Done(_) | Next::Change => ReconcileResult::Success,
        }
    }

    /// `self` with what is left of its wait, `since` it was wished for;
    /// `None` when the wait is over.
    pub(crate) fn left(self, since: std::time::Instant) -> Option<Next> {
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

/// controller-runtime's default per-item backoff (5 ms doubling, at most
/// 1000 s), never shorter than [`MIN_RETRY`](crate::policy::validate::MIN_RETRY):
/// the first retries wait 1 s, then it doubles as controller-runtime's does.
pub fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(30);
    Duration::from_millis(5u64.saturating_mul(1 << exp)).clamp(
        crate::policy::validate::MIN_RETRY,
        Duration::from_secs(1000),
    )
}
