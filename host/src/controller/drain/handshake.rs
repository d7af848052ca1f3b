//! The application handshake before a removal (`notify`), after
//! KEP-4563's EvictionRequest: the host asks, the application answers.
//!
//! The host writes three annotations on the pod: [`REQUESTED`] (when),
//! [`DEADLINE`] (until when it waits) and [`REQUESTER`] (`nmo/<the
//! maintenance>`). The application then
//! - leaves by itself (its pod goes: nothing more to do), or
//! - answers [`READY`]`: "true"`: the host removes it at once, or
//! - writes [`HEARTBEAT`] (an RFC 3339 time): with the policy's
//!   `heartbeat-ms` the deadline moves to the heartbeat plus that, at most
//!   ten times the first timeout from the request (the host writes the new
//!   deadline back), or
//! - lets the deadline run out: the host removes it.
//!
//! Removal is then what the policy said (`evict`, PodDisruptionBudgets
//! respected, or `delete`). The request is made once per maintenance: a
//! later attempt, or a restarted operator, keeps the first request time
//! (from the annotation), so a deadline never starts over.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::time::Instant;

use super::attempt::{Attempt, Note, Removal, Target};
use super::ledger::now_ms;
use crate::policy::Notice;
use crate::sync::Locked;

/// When the host asked (RFC 3339).
pub(crate) const REQUESTED: &str = "nmo.medik8s.io/eviction-requested";
/// Until when it waits (RFC 3339).
pub const DEADLINE: &str = "nmo.medik8s.io/eviction-deadline";
/// Who asked: `nmo/<maintenance>`.
pub(crate) const REQUESTER: &str = "nmo.medik8s.io/eviction-requester";
/// Written by the application: `"true"` when it may be removed now.
pub const READY: &str = "nmo.medik8s.io/eviction-ready";
/// Written by the application: it is still handing over (RFC 3339).
pub(crate) const HEARTBEAT: &str = "nmo.medik8s.io/eviction-heartbeat";
/// How much further than its first timeout heartbeats may push a
/// deadline.
const MAX_EXTENSION: u32 = 10;

fn rfc3339(ms: u64) -> String {
    Timestamp::from_millisecond(i64::try_from(ms).unwrap_or(i64::MAX))
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn parse_ms(text: &str) -> Option<u64> {
    let t: Timestamp = text.parse().ok()?;
    u64::try_from(t.as_millisecond()).ok()
}

/// Asks the application of `t` to leave and waits for its answer, its
/// departure or the deadline. `true`: remove it now; `false`: it is gone,
/// or the attempt ran out first.
pub(in crate::controller) async fn ask(
    how: Removal<'_>,
    t: &Target,
    state: &Attempt,
    n: &Notice,
) -> bool {
    let requester = format!("nmo/{}", how.maintenance);
    let pods: Api<Pod> = Api::namespaced(how.client.clone(), &t.namespace);
    let ours =
        |a: &std::collections::BTreeMap<String, String>| a.get(REQUESTER) == Some(&requester);
    let seen = annotations(state, &t.uid);
    // The first request stands: from the pod (a restarted operator) or the
    // ledger (an earlier attempt of this process).
    // What the pod says is the workload's to write too: a request time
    // it claims is never later than now (a forged or skewed one in the
    // future would push the deadline out), so the deadline stays within
    // the timeout, and heartbeats within ten times it, of now.
    let timeout_ms = n.timeout.as_millis() as u64;
    let now = now_ms();
    let requested_ms = match seen.get(REQUESTED).and_then(|v| parse_ms(v)) {
        Some(ms) if ours(&seen) => how.ledger.notified(&t.uid, ms.min(now)),
        _ => how.ledger.notified(&t.uid, now),
    };
    let latest_ms = requested_ms.saturating_add(timeout_ms.saturating_mul(MAX_EXTENSION.into()));
    let mut deadline_ms = requested_ms.saturating_add(timeout_ms);
    let mut written_deadline = seen.get(DEADLINE).and_then(|v| parse_ms(v));
    // A request the pod claims whose deadline is missing, or later than
    // any this request allows, is not ours: it is written again.
    let forged = ours(&seen) && written_deadline.is_none_or(|w| w > latest_ms);
    if !ours(&seen) || forged {
        let asked = (requested_ms, deadline_ms);
        if !write_request(how, &pods, t, state, asked, &requester).await {
            return false;
        }
        written_deadline = Some(deadline_ms);
        tracing::info!(pod = %t.key(), deadline = %rfc3339(deadline_ms), "asked the application to leave");
        let _ = how.notes.send(Note::Notified {
            pod: t.reference(),
            deadline: rfc3339(deadline_ms),
        });
    }
    let mut shown = String::new();
    loop {
        let changed = state.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if !state.has(&t.uid).await {
            return false;
        }
        let seen = annotations(state, &t.uid);
        if seen.get(READY).is_some_and(|v| v == "true") {
            tracing::info!(pod = %t.key(), "the application is ready to go");
            return true;
        }
        if let (Some(extension), Some(beat_ms)) =
            (n.heartbeat, seen.get(HEARTBEAT).and_then(|b| parse_ms(b)))
        {
            // A heartbeat dated in the future counts as now.
            let extended = beat_ms
                .min(now_ms())
                .saturating_add(extension.as_millis() as u64);
            deadline_ms = deadline_ms.max(extended).min(latest_ms);
        }
        // Written back once it has moved by half an extension (at least a
        // second): a pod heartbeating ten times a second costs two writes
        // an extension, not ten a second.
        let step_ms = n
            .heartbeat
            .map_or(1_000, |h| (h.as_millis() as u64 / 2).max(1_000));
        if written_deadline.is_some_and(|w| deadline_ms >= w.saturating_add(step_ms)) {
            let patch = json!({"metadata": {"annotations": {DEADLINE: rfc3339(deadline_ms)}}});
            if pods
                .patch(&t.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .is_ok()
            {
                written_deadline = Some(deadline_ms);
            }
        }
        let now = now_ms();
        if now >= deadline_ms {
            tracing::info!(pod = %t.key(), "the application's deadline ran out");
            return true;
        }
        if Instant::now() >= how.deadline {
            return false;
        }
        // Said once per change of the deadline written on the pod (not of
        // every heartbeat): saying it wakes every waiter of this attempt,
        // this one included, and writes the status.
        let waiting = format!(
            "waiting for pod {} to leave or answer {READY} (until {})",
            t.key(),
            rfc3339(written_deadline.unwrap_or(deadline_ms).min(deadline_ms))
        );
        if waiting != shown {
            state.waiting_for(t, waiting.clone()).await;
            shown = waiting;
        }
        // At most a second between looks: a change missed is seen soon.
        let left = Duration::from_millis(deadline_ms - now).min(Duration::from_secs(1));
        tokio::select! {
            () = changed => {}
            () = tokio::time::sleep(left) => {}
            () = tokio::time::sleep_until(how.deadline) => {}
        }
    }
}

/// Writes the request on the pod (when it was asked, `asked.0`; its
/// deadline, `asked.1`; who asks), retrying an API error until the
/// attempt's deadline. `false`: the pod is gone, or the attempt ran out
/// first.
async fn write_request(
    how: Removal<'_>,
    pods: &Api<Pod>,
    t: &Target,
    state: &Attempt,
    (requested_ms, deadline_ms): (u64, u64),
    requester: &str,
) -> bool {
    let patch = json!({"metadata": {"annotations": {
        REQUESTED: rfc3339(requested_ms),
        DEADLINE: rfc3339(deadline_ms),
        REQUESTER: requester,
    }}});
    loop {
        match pods
            .patch(&t.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return true,
            Err(kube::Error::Api(e)) if e.code == 404 => return false,
            Err(e) => {
                state
                    .waiting_for(t, format!("asking pod {} to leave: {e}", t.key()))
                    .await;
                if Instant::now() + how.retries.api_error >= how.deadline {
                    return false;
                }
                tokio::time::sleep(how.retries.api_error).await;
            }
        }
    }
}

fn annotations(state: &Attempt, uid: &str) -> std::collections::BTreeMap<String, String> {
    state
        .annotations
        .locked()
        .get(uid)
        .cloned()
        .unwrap_or_default()
}
