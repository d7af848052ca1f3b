//! How a pass ends: the drain succeeded, a step failed (the policy says
//! what then), or the policy could not decide. Methods of the [`Pass`],
//! beside its steps (`reconcile.rs`).

use k8s_openapi::jiff::Timestamp;

use super::reconcile::Pass;
use super::restore::{record_end, release_surges, restore_unless_wanted};
use super::status::{now, set_pending};
use crate::controller::drain::Outcome;
use crate::controller::events::{EventType, reasons};
use crate::controller::next::{Next, backoff};
use crate::crd::{MaintenancePhase, PodReference};
use crate::error::{Error, Result};
use crate::policy::Decision;
use crate::policy::Verdict;
use crate::policy::types::{self, DrainReport, Failure};

/// The soonest a parked maintenance is looked at again.
const MIN_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

impl Pass {
    /// The drain is complete: Succeeded (once), then looked at again to renew
    /// the lease. lastError is cleared: what an earlier attempt failed on, or
    /// what the drain waited for, is over (the Go operator leaves the last
    /// failed attempt's text on a Succeeded maintenance: docs/drop-in.md).
    pub(in crate::controller) async fn succeeded(&self) -> Result<Next> {
        let old = self
            .writer
            .update(|s| {
                s.last_error = None;
                if s.phase != Some(MaintenancePhase::Succeeded) {
                    s.last_update = Some(now());
                }
                s.phase = Some(MaintenancePhase::Succeeded);
                s.parked = None;
                s.drain_progress = 100;
                s.pending_pods = None;
                s.pending_pods_refs = None;
            })
            .await?;
        if old.phase != Some(MaintenancePhase::Succeeded) {
            let nm = self.writer.current().await;
            if let Some(created) = &nm.metadata.creation_timestamp {
                let ms = Timestamp::now()
                    .as_millisecond()
                    .saturating_sub(created.0.as_millisecond())
                    .max(0);
                self.ctx.metrics().drain_duration.observe(ms as f64 / 1e3);
            }
            let (reason, message) = reasons::SUCCEEDED;
            self.event(EventType::Normal, reason, message).await;
        }
        self.ctx.memory.succeeded(&self.uid);
        tracing::info!("Maintenance was completed - all pods were evicted");
        Ok(Next::Done(self.ctx.settings().renew_interval))
    }

    /// The drain attempt ended with pods left: recorded, then the policy's
    /// verdict.
    pub(in crate::controller) async fn drain_incomplete(&self, outcome: Outcome) -> Result<Next> {
        let message = outcome.message.clone();
        let waited: Vec<PodReference> = outcome
            .pending
            .iter()
            .chain(&outcome.blocked)
            .chain(&outcome.waited)
            .cloned()
            .collect();
        // lastUpdate says when the status last changed; a retry that finds
        // the same pods left with the same error renews it at most once per
        // interval, however soon the policy retries (the throttle every
        // reason a policy gives shares).
        let renew = self.ctx.memory.may_say(&self.uid, "a failed attempt", "");
        self.writer
            .update(|s| {
                let before = s.clone();
                set_pending(s, &waited);
                s.last_error = Some(message.clone());
                if renew || *s != before {
                    s.last_update = Some(now());
                }
            })
            .await?;
        let to_wit = |v: &[PodReference]| {
            v.iter()
                .map(|r| types::PodRef {
                    namespace: r.namespace.clone(),
                    name: r.name.clone(),
                })
                .collect()
        };
        let report = DrainReport {
            pending: to_wit(&outcome.pending),
            pdb_blocked: to_wit(&outcome.pdb_blocked),
            blocked: to_wit(&outcome.blocked),
            waited: to_wit(&outcome.waited),
            timed_out: outcome.timed_out,
            message: outcome.message.clone(),
        };
        self.failed(Failure::DrainIncomplete(report), outcome.message)
            .await
    }

    /// Asks the policy what to do after a failure and does it.
    pub(in crate::controller) async fn failed(
        &self,
        failure: Failure,
        last_error: String,
    ) -> Result<Next> {
        let attempt = self.ctx.memory.failed(&self.uid);
        let verdict = match self.on_failure(failure.clone(), attempt).await {
            Ok(v) => v,
            Err(e) => return self.policy_failed(e).await,
        };
        if let Failure::DrainIncomplete(report) = &failure {
            // The Go operator's lines, which its e2e suite looks for.
            tracing::warn!(error = %report.message, "Not all pods evicted");
        }
        tracing::warn!(error = %last_error, verdict = %verdict, "maintenance step failed");
        let delay = match verdict {
            Verdict::RetryAfter(d) => {
                tracing::info!(requeueAfter = %crate::text::duration(d), "Reconciling with fixed duration");
                d
            }
            Verdict::RetryWithBackoff => backoff(attempt),
            Verdict::Fail(message) => return self.give_up(&failure, message).await,
            Verdict::Park {
                reason,
                recheck_after,
            } => return self.park(reason, recheck_after, last_error).await,
        };
        self.ctx.memory.hold(&self.uid, delay);
        self.writer
            .update(|s| {
                s.last_error = Some(last_error.clone());
                s.parked = None;
            })
            .await?;
        Ok(Next::After(delay))
    }

    /// The policy's verdict is to park: the node stays cordoned and tainted,
    /// the status and a `ParkedMaintenance` event say why, and nothing is
    /// tried again until `recheck_after` or until the NodeMaintenance changes.
    async fn park(
        &self,
        reason: String,
        recheck_after: Option<std::time::Duration>,
        last_error: String,
    ) -> Result<Next> {
        // A recheck sooner than a second would call the policy in a loop.
        let recheck_after = recheck_after.map(|d| d.max(MIN_RECHECK));
        let recheck_at = recheck_after.map(super::status::after);
        // Every reason a policy gives is written, and said in an event, at
        // most once per interval (as a waiting reason is): a policy whose
        // reason changes at every call (naming the time) does not flood the
        // status and the event stream. The first park is always said.
        let was = self.writer.current().await.status.and_then(|s| s.parked);
        let reason = match &was {
            Some(p) if p.reason != reason && !self.ctx.memory.may_write_reason(&self.uid) => {
                p.reason.clone()
            }
            Some(_) => reason,
            None => {
                self.ctx.memory.may_write_reason(&self.uid);
                reason
            }
        };
        let old = self
            .writer
            .update(|s| {
                let since = s
                    .parked
                    .as_ref()
                    .and_then(|p| p.since.clone())
                    .unwrap_or_else(now);
                s.last_error = Some(last_error.clone());
                s.parked = Some(crate::crd::Parked {
                    reason: reason.clone(),
                    failure: Some(last_error.clone()),
                    since: Some(since),
                    recheck_at: recheck_at.clone(),
                });
            })
            .await?;
        let nm = self.writer.current().await;
        self.ctx.memory.park(&nm, recheck_after);
        if old.parked.as_ref().map(|p| &p.reason) != Some(&reason) {
            self.event(EventType::Warning, reasons::PARKED, &reason)
                .await;
        }
        tracing::warn!(reason = %reason, recheck = %recheck_after.map_or_else(|| "when it changes".to_owned(), crate::text::duration), "the policy parked the maintenance; the node stays cordoned");
        Ok(match recheck_after {
            Some(d) => Next::After(d),
            None => Next::Change,
        })
    }

    /// The policy's verdict is to fail: the node is restored and the
    /// maintenance stays Failed until deleted.
    async fn give_up(&self, failure: &Failure, message: String) -> Result<Next> {
        let nm = self.writer.current().await;
        if !matches!(failure, Failure::NodeNotFound) {
            restore_unless_wanted(&self.ctx, &nm, &self.node_name).await?;
        }
        release_surges(&self.ctx, &nm).await?;
        self.mark_failed(message).await
    }

    /// Phase Failed with `message` as `lastError`, and the Go operator's
    /// `FailedMaintenance` event the first time.
    pub(in crate::controller) async fn mark_failed(&self, message: String) -> Result<Next> {
        let old = self
            .writer
            .update(|s| {
                s.phase = Some(MaintenancePhase::Failed);
                s.last_error = Some(message.clone());
                s.last_update = Some(now());
            })
            .await?;
        if old.phase != Some(MaintenancePhase::Failed) {
            let (reason, msg) = reasons::FAILED;
            self.event(EventType::Warning, reason, msg).await;
            let mut was = self.writer.current().await;
            was.status = Some(old);
            record_end(&self.ctx, &was, "Failed").await;
        }
        Ok(Next::Change)
    }

    /// Asks the maintenance's policy what to do after a failure (on the
    /// blocking pool, as a plan).
    async fn on_failure(&self, failure: Failure, attempt: u32) -> Result<Verdict> {
        let nm = self.writer.current().await;
        let selected = self.ctx.policy_for(&nm, None)?;
        let record = crate::policy::convert::maintenance(&nm, attempt, Timestamp::now());
        crate::policy::decide(Decision::OnFailure, move || {
            selected.policy.on_failure(&record, &failure)
        })
        .await
        .map_err(Error::from)
    }

    /// A policy could not decide: record it and wait; never act.
    pub(in crate::controller) async fn policy_failed(&self, e: Error) -> Result<Next> {
        let message = e.to_string();
        tracing::error!(category = e.category(), "{message}");
        // Before the policy admitted the maintenance nothing has started: the
        // phase stays unset.
        let record =
            |s: &mut crate::crd::NodeMaintenanceStatus| s.last_error = Some(message.clone());
        let old = if crate::crd::is_admitted(&self.writer.current().await) {
            self.writer.update(record).await?
        } else {
            self.writer.update_before_admission(record).await?
        };
        if old.last_error.as_deref() != Some(message.as_str()) {
            self.event(EventType::Warning, reasons::POLICY_ERROR, &message)
                .await;
        }
        Ok(Next::After(self.ctx.settings().policy_error_retry))
    }
}
