//! What a maintenance's drain has done to each pod so far (the contract's
//! `drain-history`): since when a plan wanted it gone, how many of its
//! evictions were refused, how many attempts ended with it still there,
//! and when its application was asked to leave. Kept per maintenance in
//! the controller's memory, so it lasts as long as the process: a
//! restarted operator starts every count at zero, and a ladder built on it
//! can only climb later, never sooner.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::policy::{History, Plan, types::PodHistory};
use crate::sync::Locked;

/// One pod's entry.
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    /// When a plan first wanted it gone (ms since the Unix epoch).
    wanted_since_ms: u64,
    refused: u32,
    attempts: u32,
    notified_ms: Option<u64>,
}

/// The ledger of one maintenance, by pod uid.
#[derive(Debug, Default)]
pub(crate) struct Ledger(Mutex<HashMap<String, Entry>>, std::sync::atomic::AtomicBool);

impl Ledger {
    /// Whether a plan of this maintenance (in this process) surged a pod.
    pub fn surged(&self) -> bool {
        self.1.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Entry>) -> T) -> T {
        f(&mut self.0.locked())
    }

    /// Every pod's history as the policy sees it at `now_ms`.
    pub fn history(&self, now_ms: u64) -> History {
        self.with(|all| {
            History::new(
                all.iter()
                    .map(|(uid, e)| {
                        let h = PodHistory {
                            pending_ms: now_ms.saturating_sub(e.wanted_since_ms),
                            refused_evictions: e.refused,
                            attempts: e.attempts,
                            notified_ms: e.notified_ms,
                        };
                        (uid.clone(), h)
                    })
                    .collect(),
            )
        })
    }

    /// A plan was made at `now_ms`: the pods it wants gone (or waits for)
    /// are pending from now on, unless they were already.
    pub fn planned(&self, plan: &Plan, uids: &[String], now_ms: u64) {
        if plan
            .steps
            .iter()
            .any(|s| matches!(s.action, crate::policy::Action::Surge(_)))
        {
            self.1.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.with(|all| {
            for step in plan.steps.iter().filter(|s| s.action.awaited()) {
                if let Some(uid) = uids.get(step.pod).filter(|u| !u.is_empty()) {
                    all.entry(uid.clone()).or_insert(Entry {
                        wanted_since_ms: now_ms,
                        ..Entry::default()
                    });
                }
            }
        });
    }

    /// An eviction of `uid` was refused.
    pub fn refused(&self, uid: &str) {
        self.with(|all| {
            if let Some(e) = all.get_mut(uid) {
                e.refused = e.refused.saturating_add(1);
            }
        });
    }

    /// The application of `uid` was asked to leave at `at_ms` (the first
    /// time counts).
    pub fn notified(&self, uid: &str, at_ms: u64) -> u64 {
        self.with(|all| {
            let e = all.entry(uid.to_owned()).or_default();
            *e.notified_ms.get_or_insert(at_ms)
        })
    }

    /// An attempt ended with these pods still there.
    pub(crate) fn attempt_ended<'a>(&self, left: impl Iterator<Item = &'a str>) {
        self.with(|all| {
            for uid in left {
                if let Some(e) = all.get_mut(uid) {
                    e.attempts = e.attempts.saturating_add(1);
                }
            }
        });
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    u64::try_from(k8s_openapi::jiff::Timestamp::now().as_millisecond()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Action, Removal, Step};
    use std::time::Duration;

    fn plan(actions: Vec<Action>) -> Plan {
        Plan {
            steps: actions
                .into_iter()
                .enumerate()
                .map(|(i, action)| Step {
                    pod: i,
                    namespace: "default".into(),
                    name: format!("p{i}"),
                    action,
                    order: 0,
                })
                .collect(),
            attempt_timeout: Duration::from_secs(30),
            max_concurrent_evictions: None,
            volume_detach_timeout: None,
        }
    }

    #[test]
    fn a_pod_is_pending_from_the_first_plan_that_wanted_it_gone() {
        let ledger = Ledger::default();
        let uids = vec!["a".to_owned(), "b".to_owned()];
        let p = plan(vec![
            Action::Evict(Removal::default()),
            Action::Skip {
                reason: "daemon".into(),
            },
        ]);
        ledger.planned(&p, &uids, 1_000);
        ledger.refused("a");
        ledger.refused("b");
        ledger.attempt_ended(["a", "b"].into_iter());
        // A later plan does not move the start.
        ledger.planned(&p, &uids, 5_000);
        let h = ledger.history(61_000);
        let a = h.of("a");
        assert_eq!(
            (a.pending_ms, a.refused_evictions, a.attempts),
            (60_000, 1, 1)
        );
        // A skipped pod has no history.
        let b = h.of("b");
        assert_eq!((b.pending_ms, b.refused_evictions, b.attempts), (0, 0, 0));
        assert_eq!(ledger.notified("a", 7_000), 7_000);
        assert_eq!(ledger.notified("a", 9_000), 7_000, "the first ask counts");
    }
}
