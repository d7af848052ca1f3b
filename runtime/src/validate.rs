//! Checks a policy's answers before the operator acts on them.
//!
//! A plan must name every pod it was given exactly once, and nothing else;
//! it may not evict or delete a mirror pod (the kubelet recreates it at once)
//! or a DaemonSet pod (its controller puts it straight back on the node);
//! every number must be possible. Anything else is
//! [`Error::InvalidDecision`], and nothing in the plan is acted on.

use std::num::NonZeroU32;
use std::time::Duration;

use super::convert;
use super::error::{Error, Result};
use crate::bindings::types::{self, DrainPlan, PodAction};
use crate::decision::Decision;
use k8s_openapi::api::core::v1 as k8s;

/// Longest attempt timeout or retry delay a policy may ask for.
pub(crate) const MAX_DURATION_MS: u64 = 24 * 60 * 60 * 1000;
/// Longest grace period a policy may give a pod (one day, in seconds).
pub(crate) const MAX_GRACE_PERIOD_SECONDS: i64 = 24 * 60 * 60;
/// Longest skip / block reason or failure message, in bytes.
pub(crate) const MAX_MESSAGE_BYTES: usize = 1024;
/// Shortest delay before a retry, whatever the policy asks: a policy that
/// answers `retry-after-ms: 0` (or a backoff's first few milliseconds)
/// cannot drive the operator to hammer the API server. Shorter delays are
/// raised to this.
pub const MIN_RETRY: Duration = Duration::from_secs(1);

/// A checked drain plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// One step per pod given, ordered by wave (`order`), then by the
    /// position of the pod in the input.
    pub steps: Vec<Step>,
    /// How long one drain attempt may take.
    pub attempt_timeout: Duration,
    /// At most this many removals in flight; `None`: no policy limit.
    pub max_concurrent_evictions: Option<NonZeroU32>,
    /// How long to wait for the node's VolumeAttachments to go once the
    /// pods are gone; `None`: do not wait.
    pub volume_detach_timeout: Option<Duration>,
}

/// What to do with one pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Index of the pod in the list the policy was given.
    pub pod: usize,
    pub namespace: String,
    pub name: String,
    pub action: Action,
    /// The wave.
    pub order: u32,
}

/// A checked pod action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Evict through the Eviction API.
    Evict(Removal),
    /// Delete directly (a forced removal).
    Delete(Removal),
    /// Leave the pod; the drain may finish without it.
    Skip { reason: String },
    /// Leave the pod; the drain may not finish while it is there.
    Block { reason: String },
    /// Make-before-break: a Ready replacement through the owning
    /// ReplicaSet (or its Deployment) first, then the owner removes this
    /// pod.
    Surge(Removal),
    /// The application handshake, then `then` with `removal`.
    Notify(Notice),
    /// Leave the pod until it completes, at most `timeout` from the
    /// attempt's start.
    Wait { timeout: Duration, reason: String },
}

/// How a pod is removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removal {
    /// `None`: the pod's own grace period.
    pub grace_period_seconds: Option<i64>,
    /// The policy's rule behind it ("" when it gave none).
    pub rule: String,
}

impl Removal {
    /// A removal that bypasses what a normal eviction keeps: a delete,
    /// or a grace period of 0.
    pub fn forced(&self, delete: bool) -> bool {
        delete || self.grace_period_seconds == Some(0)
    }
}

/// A checked handshake (`notify`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub timeout: Duration,
    pub heartbeat: Option<Duration>,
    /// Delete (true) or evict (false) once the handshake is over.
    pub then_delete: bool,
    pub removal: Removal,
}

impl Action {
    /// Whether the host is to take the pod off the node (evict, delete,
    /// surge, notify).
    pub fn removes(&self) -> bool {
        matches!(
            self,
            Action::Evict(_) | Action::Delete(_) | Action::Surge(_) | Action::Notify(_)
        )
    }

    /// Whether the drain waits for the pod to be gone (or, for `wait`,
    /// completed) before it finishes: everything but `skip`.
    pub fn awaited(&self) -> bool {
        !matches!(self, Action::Skip { .. })
    }

    /// The removal's grace period, for the actions that remove.
    pub fn grace(&self) -> Option<i64> {
        self.removal().and_then(|r| r.grace_period_seconds)
    }

    /// How the pod is removed, for the actions that remove.
    pub fn removal(&self) -> Option<&Removal> {
        match self {
            Action::Evict(r) | Action::Delete(r) | Action::Surge(r) => Some(r),
            Action::Notify(n) => Some(&n.removal),
            _ => None,
        }
    }

    /// How long the action may hold the pod: a wait's timeout, a
    /// handshake's.
    pub fn timeout(&self) -> Option<Duration> {
        match self {
            Action::Wait { timeout, .. } => Some(*timeout),
            Action::Notify(n) => Some(n.timeout),
            _ => None,
        }
    }

    /// The reason the policy gave (skip, block, wait).
    pub fn reason(&self) -> Option<&str> {
        match self {
            Action::Skip { reason } | Action::Block { reason } | Action::Wait { reason, .. } => {
                Some(reason)
            }
            _ => None,
        }
    }

    /// The word the contract uses for the action.
    pub fn verb(&self) -> &'static str {
        match self {
            Action::Evict(_) => "evict",
            Action::Delete(_) => "delete",
            Action::Skip { .. } => "skip",
            Action::Block { .. } => "block",
            Action::Surge(_) => "surge",
            Action::Notify(_) => "notify",
            Action::Wait { .. } => "wait",
        }
    }
}

impl Plan {
    /// The steps that remove a pod (evict or delete).
    pub fn removals(&self) -> impl Iterator<Item = &Step> {
        self.steps.iter().filter(|s| s.action.removes())
    }

    /// The steps grouped by wave, lowest wave first.
    pub fn waves(&self) -> impl Iterator<Item = (u32, &[Step])> {
        self.steps
            .chunk_by(|a, b| a.order == b.order)
            .map(|chunk| (chunk[0].order, chunk))
    }
}

/// A checked answer to `on-failure`; displayed in words for logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Try again after this long.
    RetryAfter(Duration),
    /// Try again after the host's exponential backoff.
    RetryWithBackoff,
    /// Give up with this message.
    Fail(String),
    /// Park: keep the node cordoned, stop retrying (or retry after
    /// `recheck_after`).
    Park {
        reason: String,
        recheck_after: Option<Duration>,
    },
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::RetryAfter(d) => write!(f, "retry after {}", crate::text::duration(*d)),
            Verdict::RetryWithBackoff => write!(f, "retry with backoff"),
            Verdict::Fail(m) => write!(f, "fail: {m}"),
            Verdict::Park {
                reason,
                recheck_after: Some(d),
            } => write!(f, "park ({reason}; again in {})", crate::text::duration(*d)),
            Verdict::Park { reason, .. } => write!(f, "park ({reason})"),
        }
    }
}

struct Check<'a> {
    policy: &'a str,
    function: Decision,
}

impl Check<'_> {
    fn invalid(&self, reason: String) -> Error {
        Error::InvalidDecision {
            policy: self.policy.to_owned(),
            function: self.function.name(),
            reason,
        }
    }

    fn message(&self, what: &str, text: &str) -> Result<()> {
        if text.trim().is_empty() {
            return Err(self.invalid(format!("{what} is empty")));
        }
        if text.len() > MAX_MESSAGE_BYTES {
            return Err(self.invalid(format!(
                "{what} is {} bytes long, more than the {MAX_MESSAGE_BYTES} allowed",
                text.len()
            )));
        }
        Ok(())
    }

    fn duration(&self, what: &str, ms: u64) -> Result<Duration> {
        if ms == 0 || ms > MAX_DURATION_MS {
            return Err(self.invalid(format!("{what} {ms} is outside 1..={MAX_DURATION_MS}")));
        }
        Ok(Duration::from_millis(ms))
    }

    fn removal(&self, key: &dyn Fn() -> String, raw: types::Removal) -> Result<Removal> {
        self.grace(key, raw.grace_period_seconds)?;
        if raw.rule.len() > MAX_MESSAGE_BYTES {
            return Err(self.invalid(format!(
                "the rule for pod {} is {} bytes long, more than the {MAX_MESSAGE_BYTES} allowed",
                key(),
                raw.rule.len()
            )));
        }
        Ok(Removal {
            grace_period_seconds: raw.grace_period_seconds,
            rule: crate::text::clean(&raw.rule, MAX_MESSAGE_BYTES),
        })
    }

    fn grace(&self, key: &dyn Fn() -> String, grace: Option<i64>) -> Result<()> {
        match grace {
            Some(g) if !(0..=MAX_GRACE_PERIOD_SECONDS).contains(&g) => Err(self.invalid(format!(
                "grace period {g} s for pod {} is outside 0..={MAX_GRACE_PERIOD_SECONDS}",
                key()
            ))),
            _ => Ok(()),
        }
    }
}

/// Checks a plan against the pods the policy was given.
pub fn plan(policy: &str, pods: &[k8s::Pod], raw: DrainPlan) -> Result<Plan> {
    let check = Check {
        policy,
        function: Decision::PlanDrain,
    };
    if raw.attempt_timeout_ms == 0 || raw.attempt_timeout_ms > MAX_DURATION_MS {
        return Err(check.invalid(format!(
            "attempt-timeout-ms {} is outside 1..={MAX_DURATION_MS}",
            raw.attempt_timeout_ms
        )));
    }
    let max_concurrent_evictions = match raw.max_concurrent_evictions {
        None => None,
        Some(n) => Some(NonZeroU32::new(n).ok_or_else(|| {
            check.invalid("max-concurrent-evictions is 0: nothing could ever be evicted".into())
        })?),
    };
    let mut seen = vec![false; pods.len()];
    let mut steps = Vec::with_capacity(raw.decisions.len());
    for d in raw.decisions {
        let i = d.pod as usize;
        let Some(pod) = pods.get(i) else {
            return Err(check.invalid(format!(
                "decision for pod #{} but only {} pod(s) were given (positions 0 to {})",
                d.pod,
                pods.len(),
                pods.len().saturating_sub(1)
            )));
        };
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let key = || format!("{namespace}/{name}");
        if std::mem::replace(&mut seen[i], true) {
            return Err(check.invalid(format!("pod {} is decided more than once", key())));
        }
        let action = check.action(pod, &key, d.action)?;
        steps.push(Step {
            pod: i,
            namespace,
            name,
            action,
            order: d.order,
        });
    }
    if let Some(missing) = seen.iter().position(|s| !s) {
        let p = &pods[missing].metadata;
        let count = seen.iter().filter(|s| !**s).count();
        return Err(check.invalid(format!(
            "no decision for pod {}/{} ({count} pod(s) left out)",
            p.namespace.as_deref().unwrap_or_default(),
            p.name.as_deref().unwrap_or_default()
        )));
    }
    steps.sort_by_key(|s| (s.order, s.pod));
    let volume_detach_timeout = raw
        .volume_detach_timeout_ms
        .map(|ms| check.duration("volume-detach-timeout-ms", ms))
        .transpose()?;
    Ok(Plan {
        steps,
        attempt_timeout: Duration::from_millis(raw.attempt_timeout_ms),
        max_concurrent_evictions,
        volume_detach_timeout,
    })
}

impl Check<'_> {
    /// One pod's action, checked: what the pod allows (a mirror or a
    /// DaemonSet's pod is never removed, only a ReplicaSet's pod surges)
    /// and the numbers and words it carries.
    fn action(
        &self,
        pod: &k8s::Pod,
        key: &dyn Fn() -> String,
        action: PodAction,
    ) -> Result<Action> {
        let removes = matches!(
            action,
            PodAction::Evict(_) | PodAction::Delete(_) | PodAction::Surge(_) | PodAction::Notify(_)
        );
        if removes && convert::is_mirror(pod) {
            return Err(self.invalid(format!(
                "pod {} is a mirror (static) pod: the kubelet recreates it at once, \
                 so it cannot be evicted or deleted; skip it",
                key()
            )));
        }
        if removes && convert::is_daemonset_managed(pod) {
            return Err(self.invalid(format!(
                "pod {} is managed by a DaemonSet, which puts it straight back on \
                 this node; skip it",
                key()
            )));
        }
        Ok(match action {
            PodAction::Evict(r) => Action::Evict(self.removal(&key, r)?),
            PodAction::Delete(r) => Action::Delete(self.removal(&key, r)?),
            PodAction::Surge(r) => {
                if convert::controller_kind(pod) != Some("ReplicaSet") {
                    return Err(self.invalid(format!(
                        "pod {} cannot surge: only a pod a ReplicaSet controls (a \
                         Deployment's) has an owner that can bring up a replacement \
                         first; its controller is {}",
                        key(),
                        convert::controller_kind(pod).unwrap_or("none (a bare pod)")
                    )));
                }
                Action::Surge(self.removal(&key, r)?)
            }
            PodAction::Notify(n) => {
                let timeout = self.duration(
                    &format!("notify timeout-ms for pod {}", key()),
                    n.timeout_ms,
                )?;
                let heartbeat = n
                    .heartbeat_ms
                    .map(|ms| self.duration(&format!("notify heartbeat-ms for pod {}", key()), ms))
                    .transpose()?;
                Action::Notify(Notice {
                    timeout,
                    heartbeat,
                    then_delete: matches!(n.then, types::RemovalMethod::Delete),
                    removal: self.removal(&key, n.removal)?,
                })
            }
            PodAction::Wait(c) => {
                let timeout =
                    self.duration(&format!("wait timeout-ms for pod {}", key()), c.timeout_ms)?;
                self.message(&format!("the wait reason for pod {}", key()), &c.reason)?;
                Action::Wait {
                    timeout,
                    reason: crate::text::clean(&c.reason, MAX_MESSAGE_BYTES),
                }
            }
            PodAction::Skip(reason) => {
                self.message(&format!("the skip reason for pod {}", key()), &reason)?;
                Action::Skip {
                    reason: crate::text::clean(&reason, MAX_MESSAGE_BYTES),
                }
            }
            PodAction::Block(reason) => {
                self.message(&format!("the block reason for pod {}", key()), &reason)?;
                Action::Block {
                    reason: crate::text::clean(&reason, MAX_MESSAGE_BYTES),
                }
            }
        })
    }
}

/// Checks an `on-failure` verdict.
pub fn verdict(policy: &str, raw: types::Verdict) -> Result<Verdict> {
    let check = Check {
        policy,
        function: Decision::OnFailure,
    };
    match raw {
        types::Verdict::RetryAfterMs(ms) if ms > MAX_DURATION_MS => Err(check.invalid(format!(
            "retry-after-ms {ms} is more than the {MAX_DURATION_MS} allowed"
        ))),
        types::Verdict::RetryAfterMs(ms) => Ok(Verdict::RetryAfter(
            Duration::from_millis(ms).max(MIN_RETRY),
        )),
        types::Verdict::RetryWithBackoff => Ok(Verdict::RetryWithBackoff),
        types::Verdict::Fail(message) => {
            check.message("the failure message", &message)?;
            Ok(Verdict::Fail(crate::text::clean(
                &message,
                MAX_MESSAGE_BYTES,
            )))
        }
        types::Verdict::Park(p) => {
            check.message("the park reason", &p.reason)?;
            let recheck_after = match p.recheck_after_ms {
                Some(ms) => Some(check.duration("park recheck-after-ms", ms)?.max(MIN_RETRY)),
                None => None,
            };
            Ok(Verdict::Park {
                reason: crate::text::clean(&p.reason, MAX_MESSAGE_BYTES),
                recheck_after,
            })
        }
    }
}

/// A checked answer to `admit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Start now.
    Admit,
    /// Not yet: ask again when the fleet changes, or after `recheck_after`.
    Wait {
        reason: String,
        recheck_after: Option<Duration>,
    },
    /// Never: refuse (the webhook) or fail (a maintenance that exists).
    Deny(String),
}

impl std::fmt::Display for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Admission::Admit => write!(f, "admit"),
            Admission::Wait {
                reason,
                recheck_after: Some(d),
            } => write!(f, "wait ({reason}; again in {})", crate::text::duration(*d)),
            Admission::Wait { reason, .. } => write!(f, "wait ({reason})"),
            Admission::Deny(m) => write!(f, "deny: {m}"),
        }
    }
}

/// Checks an `admit` answer.
pub fn admission(policy: &str, raw: types::Admission) -> Result<Admission> {
    let check = Check {
        policy,
        function: Decision::Admit,
    };
    match raw {
        types::Admission::Admit => Ok(Admission::Admit),
        types::Admission::Wait(w) => {
            check.message("the wait reason", &w.reason)?;
            let recheck_after = match w.recheck_after_ms {
                Some(ms) if ms == 0 || ms > MAX_DURATION_MS => {
                    return Err(check.invalid(format!(
                        "recheck-after-ms {ms} is outside 1..={MAX_DURATION_MS}"
                    )));
                }
                Some(ms) => Some(Duration::from_millis(ms).max(MIN_RETRY)),
                None => None,
            };
            Ok(Admission::Wait {
                reason: crate::text::clean(&w.reason, MAX_MESSAGE_BYTES),
                recheck_after,
            })
        }
        types::Admission::Deny(message) => {
            check.message("the deny message", &message)?;
            Ok(Admission::Deny(crate::text::clean(
                &message,
                MAX_MESSAGE_BYTES,
            )))
        }
    }
}

/// Checks a `validate-settings` answer: an error is the policy refusing
/// its settings, with its own message.
pub fn settings(policy: &str, raw: std::result::Result<(), String>) -> Result<()> {
    raw.map_err(|reason| {
        let reason = if reason.trim().is_empty() {
            "(no reason given)".to_owned()
        } else {
            crate::text::clean(&reason, MAX_MESSAGE_BYTES)
        };
        Error::Settings {
            policy: policy.to_owned(),
            reason,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use types::{Completion, Notice as RawNotice, Parking, PodDecision, RemovalMethod, Waiting};

    fn pod(name: &str, extra: serde_json::Value) -> k8s::Pod {
        let mut v = json!({"metadata": {"namespace": "ns", "name": name}});
        if let (Some(meta), Some(more)) = (v["metadata"].as_object_mut(), extra.as_object()) {
            meta.extend(more.clone());
        }
        serde_json::from_value(v).unwrap()
    }

    fn owned_by(kind: &str) -> serde_json::Value {
        json!({"ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u", "controller": true}]})
    }

    fn evict() -> PodAction {
        PodAction::Evict(types::Removal {
            grace_period_seconds: None,
            rule: String::new(),
        })
    }

    fn decide(pod: u32, action: PodAction, order: u32) -> PodDecision {
        PodDecision { pod, action, order }
    }

    fn raw(decisions: Vec<PodDecision>) -> DrainPlan {
        DrainPlan {
            decisions,
            attempt_timeout_ms: 60_000,
            max_concurrent_evictions: None,
            volume_detach_timeout_ms: None,
        }
    }

    /// The reason an answer was refused for.
    fn refused<T: std::fmt::Debug>(r: Result<T>) -> String {
        match r {
            Err(Error::InvalidDecision { reason, .. }) => reason,
            other => panic!("not refused as invalid: {other:?}"),
        }
    }

    fn two() -> Vec<k8s::Pod> {
        vec![pod("a", json!({})), pod("b", json!({}))]
    }

    #[test]
    fn a_plan_names_every_pod_once_and_is_ordered_by_wave_then_position() {
        let plan = plan(
            "p",
            &two(),
            raw(vec![decide(1, evict(), 0), decide(0, evict(), 1)]),
        )
        .unwrap();
        let order: Vec<_> = plan
            .steps
            .iter()
            .map(|s| (s.order, s.name.as_str()))
            .collect();
        assert_eq!(order, [(0, "b"), (1, "a")]);
        assert_eq!(plan.waves().count(), 2);
        let twice = raw(vec![decide(0, evict(), 0), decide(0, evict(), 0)]);
        assert_eq!(
            refused(super::plan("p", &two(), twice)),
            "pod ns/a is decided more than once"
        );
        assert_eq!(
            refused(super::plan("p", &two(), raw(vec![decide(0, evict(), 0)]))),
            "no decision for pod ns/b (1 pod(s) left out)"
        );
        assert!(
            refused(super::plan("p", &two(), raw(vec![decide(7, evict(), 0)])))
                .starts_with("decision for pod #7 but only 2 pod(s) were given")
        );
    }

    #[test]
    fn what_the_kubelet_or_a_daemonset_puts_back_is_never_removed_and_only_a_replicaset_pod_surges()
    {
        let mirror = vec![pod(
            "m",
            json!({"annotations": {"kubernetes.io/config.mirror": "x"}}),
        )];
        assert!(refused(plan("p", &mirror, raw(vec![decide(0, evict(), 0)]))).contains("mirror"));
        let skip = PodAction::Skip("static".into());
        assert!(plan("p", &mirror, raw(vec![decide(0, skip, 0)])).is_ok());
        let ds = vec![pod("d", owned_by("DaemonSet"))];
        let delete = PodAction::Delete(types::Removal {
            grace_period_seconds: None,
            rule: String::new(),
        });
        assert!(refused(plan("p", &ds, raw(vec![decide(0, delete, 0)]))).contains("DaemonSet"));
        let surge = || {
            PodAction::Surge(types::Removal {
                grace_period_seconds: None,
                rule: String::new(),
            })
        };
        let bare = vec![pod("b", json!({}))];
        assert!(
            refused(plan("p", &bare, raw(vec![decide(0, surge(), 0)])))
                .contains("none (a bare pod)")
        );
        let rs = vec![pod("r", owned_by("ReplicaSet"))];
        let plan = plan("p", &rs, raw(vec![decide(0, surge(), 0)])).unwrap();
        assert_eq!(plan.steps[0].action.verb(), "surge");
    }

    #[test]
    fn every_number_must_be_possible() {
        let one = vec![pod("a", json!({}))];
        let with = |f: &dyn Fn(&mut DrainPlan)| {
            let mut r = raw(vec![decide(0, evict(), 0)]);
            f(&mut r);
            plan("p", &one, r)
        };
        assert!(refused(with(&|r| r.attempt_timeout_ms = 0)).contains("attempt-timeout-ms 0"));
        assert!(
            refused(with(&|r| r.attempt_timeout_ms = MAX_DURATION_MS + 1)).contains("outside 1..=")
        );
        assert!(refused(with(&|r| r.max_concurrent_evictions = Some(0))).contains("is 0"));
        assert!(
            refused(with(&|r| r.volume_detach_timeout_ms = Some(0)))
                .contains("volume-detach-timeout-ms")
        );
        let grace = |g: i64| {
            let action = PodAction::Evict(types::Removal {
                grace_period_seconds: Some(g),
                rule: String::new(),
            });
            plan("p", &one, raw(vec![decide(0, action, 0)]))
        };
        assert!(refused(grace(-1)).contains("grace period -1 s"));
        assert!(refused(grace(MAX_GRACE_PERIOD_SECONDS + 1)).contains("grace period"));
        let forced = grace(0).unwrap();
        assert!(forced.steps[0].action.removal().unwrap().forced(false));
        let notify = |timeout_ms: u64, heartbeat_ms: Option<u64>| {
            let action = PodAction::Notify(RawNotice {
                timeout_ms,
                heartbeat_ms,
                then: RemovalMethod::Delete,
                removal: types::Removal {
                    grace_period_seconds: None,
                    rule: "r".into(),
                },
            });
            plan("p", &one, raw(vec![decide(0, action, 0)]))
        };
        assert!(refused(notify(0, None)).contains("notify timeout-ms"));
        assert!(refused(notify(1000, Some(0))).contains("notify heartbeat-ms"));
        let ok = notify(1000, Some(100)).unwrap();
        assert_eq!(ok.steps[0].action.timeout(), Some(Duration::from_secs(1)));
        let wait = |timeout_ms: u64, reason: &str| {
            let action = PodAction::Wait(Completion {
                timeout_ms,
                reason: reason.into(),
            });
            plan("p", &one, raw(vec![decide(0, action, 0)]))
        };
        assert!(refused(wait(0, "job")).contains("wait timeout-ms"));
        assert!(refused(wait(1000, " ")).contains("the wait reason for pod ns/a is empty"));
    }

    #[test]
    fn words_are_bounded_and_cleaned() {
        let one = vec![pod("a", json!({}))];
        let long = "x".repeat(MAX_MESSAGE_BYTES + 1);
        let skip = |reason: &str| {
            plan(
                "p",
                &one,
                raw(vec![decide(0, PodAction::Skip(reason.into()), 0)]),
            )
        };
        assert!(refused(skip("")).contains("empty"));
        assert!(refused(skip(&long)).contains("more than the 1024 allowed"));
        let rule = PodAction::Evict(types::Removal {
            grace_period_seconds: None,
            rule: long.clone(),
        });
        assert!(
            refused(plan("p", &one, raw(vec![decide(0, rule, 0)])))
                .contains("the rule for pod ns/a")
        );
        let cleaned = skip("two\nlines\u{7}").unwrap();
        let reason = cleaned.steps[0].action.reason().unwrap();
        assert!(
            !reason.contains('\n') && !reason.contains('\u{7}'),
            "{reason:?}"
        );
    }

    #[test]
    fn a_verdict_cannot_hammer_or_say_nothing() {
        assert_eq!(
            verdict("p", types::Verdict::RetryAfterMs(0)).unwrap(),
            Verdict::RetryAfter(MIN_RETRY)
        );
        assert!(
            refused(verdict(
                "p",
                types::Verdict::RetryAfterMs(MAX_DURATION_MS + 1)
            ))
            .contains("retry-after-ms")
        );
        assert!(refused(verdict("p", types::Verdict::Fail("  ".into()))).contains("empty"));
        let park = |recheck: Option<u64>| {
            verdict(
                "p",
                types::Verdict::Park(Parking {
                    reason: "held".into(),
                    recheck_after_ms: recheck,
                }),
            )
        };
        assert_eq!(
            park(Some(5)).unwrap(),
            Verdict::Park {
                reason: "held".into(),
                recheck_after: Some(MIN_RETRY)
            }
        );
        assert!(refused(park(Some(0))).contains("park recheck-after-ms"));
    }

    #[test]
    fn an_admission_waits_at_least_a_second_and_a_refusal_says_why() {
        let wait = |recheck: Option<u64>, reason: &str| {
            admission(
                "p",
                types::Admission::Wait(Waiting {
                    reason: reason.into(),
                    recheck_after_ms: recheck,
                }),
            )
        };
        assert_eq!(
            wait(Some(10), "busy").unwrap(),
            Admission::Wait {
                reason: "busy".into(),
                recheck_after: Some(MIN_RETRY)
            }
        );
        assert!(refused(wait(Some(0), "busy")).contains("recheck-after-ms 0"));
        assert!(refused(wait(None, "")).contains("the wait reason is empty"));
        assert!(
            refused(admission("p", types::Admission::Deny(String::new())))
                .contains("the deny message is empty")
        );
        match settings("p", Err(" ".into())) {
            Err(Error::Settings { reason, .. }) => assert_eq!(reason, "(no reason given)"),
            other => panic!("{other:?}"),
        }
    }
}
