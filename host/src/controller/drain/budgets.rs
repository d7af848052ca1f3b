//! PodDisruptionBudgets as the drain sees them: a watch on every budget,
//! so that an eviction behind a budget goes out when the budget can allow
//! it, not on a fixed timer.
//!
//! `kubectl drain` and the Go operator send every eviction at once and
//! retry each refused one (HTTP 429) every 5 s, whatever the budget does in
//! between. Here every drain of the process shares one view of the budgets
//! (kube-runtime's watcher on `policy/v1` PodDisruptionBudgets):
//!
//! - an eviction of a pod a budget covers is sent only while the budget
//!   has room: its `status.disruptionsAllowed` minus our own evictions in
//!   flight and those the API server accepted but whose effect the watch
//!   has not shown yet (the pod in the budget's `status.disruptedPods`);
//! - when it has none, one eviction at a time still goes out as a probe,
//!   at most once per fallback interval (5 s, kubectl's), so the drain's
//!   `lastError` is the API server's own refusal and a stale view costs at
//!   most that interval;
//! - a budget that refused is asked again when its status changes (a
//!   replacement turned Ready, a covered pod went away), never sooner than
//!   the minimum interval after the refusal, and at the latest after the
//!   fallback interval, doubling with each refusal no change came
//!   between, up to six fallbacks (5, 10, 20, 30 s): the watch says when
//!   the budget changes, the probe only guards against a stale view;
//! - a budget that will get room by itself (a disruption still counted, a
//!   replacement on its way) is not probed before the fallback; the pod it
//!   refused asks again first, so the drain's message stays put.
//!
//! Without the watch (no `watch` right on the budgets, or the watch
//! failing), every eviction is sent as before and a refusal retried after
//! the fallback interval.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::cluster::covers;
use crate::sync::Locked;

/// How long an accepted eviction counts against its budget while the
/// watch has not shown it (the API server writes the budget in the same
/// request; a watch that lags longer than this is not waited for).
const UNSEEN_LIMIT: Duration = Duration::from_secs(5);

/// One budget as the drains see it.
struct Entry {
    pdb: PodDisruptionBudget,
    /// Our evictions of pods it covers, sent and not answered yet.
    in_flight: u32,
    /// Pods whose eviction the API server accepted, not yet in the
    /// budget's `status.disruptedPods`, and since when.
    unseen: HashMap<String, Instant>,
    /// When it last refused one of our evictions, and whether its status
    /// changed since.
    refused: Option<(Instant, bool)>,
    /// The pod of that refusal: it asks again first, so the drain's
    /// message stays the same while the budget holds.
    refused_pod: Option<String>,
    /// Refusals in a row with no change of the budget in between.
    quiet_refusals: u32,
    /// Since when an eviction behind it has been kept waiting.
    blocked_since: Option<Instant>,
    /// How many versions of it the watch has shown.
    version: u64,
}

impl Entry {
    fn new(pdb: PodDisruptionBudget) -> Self {
        Entry {
            pdb,
            in_flight: 0,
            unseen: HashMap::new(),
            refused: None,
            refused_pod: None,
            quiet_refusals: 0,
            blocked_since: None,
            version: 0,
        }
    }

    /// Takes a changed budget from the watch.
    fn update(&mut self, pdb: PodDisruptionBudget) {
        let disrupted = pdb.status.as_ref().and_then(|s| s.disrupted_pods.as_ref());
        let now = Instant::now();
        self.unseen.retain(|pod, at| {
            !disrupted.is_some_and(|d| d.contains_key(pod)) && now - *at < UNSEEN_LIMIT
        });
        if let Some((_, changed)) = &mut self.refused {
            *changed = true;
        }
        self.quiet_refusals = 0;
        self.pdb = pdb;
        self.version += 1;
    }

    /// How long after a refusal the budget is asked again when the watch
    /// shows no change: the fallback, doubling with each refusal in a row
    /// that no change came between, up to six fallbacks (5 s, 10 s, 20 s,
    /// 30 s): the watch says when it changes, the probe only guards
    /// against a view gone stale.
    fn probe_interval(&self, timings: &Timings) -> Duration {
        let doublings = self.quiet_refusals.saturating_sub(1).min(3);
        (timings.fallback * 2u32.pow(doublings)).min(timings.fallback * 6)
    }

    /// Disruptions it allows that none of our evictions has taken yet.
    fn room(&self) -> i64 {
        let now = Instant::now();
        let allowed = self
            .pdb
            .status
            .as_ref()
            .map_or(0, |s| i64::from(s.disruptions_allowed));
        let unseen = self
            .unseen
            .values()
            .filter(|at| now - **at < UNSEEN_LIMIT)
            .count() as i64;
        allowed - i64::from(self.in_flight) - unseen
    }

    /// Whether it will get room by itself: a disruption is still counted
    /// (ours not shown yet, or a pod in `status.disruptedPods`), or fewer
    /// of its pods are healthy than expected (a replacement on its way).
    fn recovering(&self) -> bool {
        let status = self.pdb.status.as_ref();
        !self.unseen.is_empty()
            || status.is_some_and(|s| {
                s.disrupted_pods.as_ref().is_some_and(|d| !d.is_empty())
                    || s.current_healthy < s.expected_pods
            })
    }

    /// When an eviction behind it may go out: now (`None`), or not before
    /// the instant given (`Some(None)`: not until something changes).
    fn blocked_until(&self, pod: &str, timings: &Timings) -> Option<Option<Instant>> {
        let now = Instant::now();
        if let Some((at, changed)) = self.refused {
            if now < at + timings.min_interval {
                return Some(Some(at + timings.min_interval));
            }
            let fallback = at + self.probe_interval(timings);
            if now >= fallback {
                // The fallback is due: one probe, whatever the view says;
                // by the pod refused last, unless it has not come back
                // within the minimum interval (it went).
                if self.in_flight > 0 {
                    return Some(None);
                }
                let head_start = fallback + timings.min_interval;
                return match &self.refused_pod {
                    Some(last) if last != pod && now < head_start => Some(Some(head_start)),
                    _ => None,
                };
            }
            if !changed {
                return Some(Some(fallback));
            }
        }
        if self.room() > 0 {
            return None;
        }
        if self.in_flight > 0 {
            return Some(None);
        }
        // No room. A budget that gets room by itself is waited for (a
        // probe only once the fallback has passed); one that does not is
        // probed now, so the drain shows the API server's refusal, then
        // once a fallback.
        let next = match (self.refused, self.recovering()) {
            (Some((at, _)), _) => Some(at + self.probe_interval(timings)),
            (None, true) => Some(self.blocked_since.unwrap_or(now) + timings.fallback),
            (None, false) => None,
        };
        next.filter(|next| now < *next).map(Some)
    }
}

/// How a removal is asked of the pod's budgets: every way a pod leaves a
/// node takes a [`Permit`] through [`Budgets::permit`] first, so every
/// removal is counted against the budgets as a disruption to come until
/// its answer is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Via {
    /// An eviction: the API server checks the budget again, so when the
    /// view shows no room, one still goes out now and then as a probe
    /// (the view may be stale; the server's refusal is what the drain
    /// then shows).
    Eviction,
    /// A removal nobody else checks against the budget (a surge's
    /// hand-over: the owner removes the pod): only while the view shows
    /// room, never as a probe, and never without the view (the budgets'
    /// watch not synced: it waits for it).
    HandOver,
    /// A removal the policy forces past the budgets (a deletion): never
    /// waits, but counted against them like any other, so the evictions
    /// beside it do not take the same room.
    Forced,
}

/// How budget-gated evictions are paced.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// After a refusal, the longest wait before asking again (kubectl's
    /// 5 s): the drain never waits longer on a budget whatever the watch
    /// shows.
    pub fallback: Duration,
    /// After a refusal, the shortest wait before asking again, however
    /// soon the budget changes.
    pub min_interval: Duration,
}

/// Every PodDisruptionBudget, watched; shared by every drain of the
/// process.
#[derive(Default)]
pub(crate) struct Budgets {
    entries: Mutex<HashMap<(String, String), Entry>>,
    /// The watch has listed every budget and is not failing.
    synced: AtomicBool,
    /// A budget changed, or a permit was given back.
    changed: Notify,
}

impl std::fmt::Debug for Budgets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budgets")
            .field("synced", &self.synced.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Budgets {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Entry>> {
        self.entries.locked()
    }

    /// Whether drains are paced by the budgets now.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// Watches every budget until dropped (kube-runtime's watcher, which
    /// relists after a lost watch). While the watch fails, drains are not
    /// paced by it.
    pub async fn watch(&self, client: Client) {
        let api: Api<PodDisruptionBudget> = Api::all(client);
        let mut events = watcher(
            api,
            watcher::Config::default().timeout(crate::client::WATCH_TIMEOUT_SECS),
        )
        .default_backoff()
        .boxed();
        let mut listing: Vec<PodDisruptionBudget> = Vec::new();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => listing.clear(),
                Ok(watcher::Event::InitApply(pdb)) => listing.push(pdb),
                Ok(watcher::Event::InitDone) => {
                    self.relisted(std::mem::take(&mut listing));
                    if !self.synced.swap(true, Ordering::Relaxed) {
                        tracing::debug!("pacing evictions by the PodDisruptionBudgets' watch");
                    }
                }
                Ok(watcher::Event::Apply(pdb)) => self.applied(pdb),
                Ok(watcher::Event::Delete(pdb)) => {
                    self.entries().remove(&key(&pdb));
                }
                Err(e) => {
                    if self.synced.swap(false, Ordering::Relaxed) {
                        tracing::warn!(error = %e, "the PodDisruptionBudget watch fails; refused evictions are retried every 5 s until it works");
                    }
                }
            }
            self.changed.notify_waiters();
        }
    }

    fn relisted(&self, listed: Vec<PodDisruptionBudget>) {
        let mut entries = self.entries();
        let mut fresh = HashMap::new();
        for pdb in listed {
            let k = key(&pdb);
            let entry = match entries.remove(&k) {
                Some(mut e) => {
                    e.update(pdb);
                    e
                }
                None => Entry::new(pdb),
            };
            fresh.insert(k, entry);
        }
        *entries = fresh;
    }

    fn applied(&self, pdb: PodDisruptionBudget) {
        let mut entries = self.entries();
        match entries.get_mut(&key(&pdb)) {
            Some(e) => e.update(pdb),
            None => {
                entries.insert(key(&pdb), Entry::new(pdb));
            }
        }
    }

    /// Waits until a removal (`via`) of the pod `name` in `namespace`
    /// with `labels` may go out, or `deadline`. The permit counts the
    /// removal against its budgets until it is told the answer.
    pub(crate) async fn permit(
        &self,
        via: Via,
        namespace: &str,
        name: &str,
        labels: &BTreeMap<String, String>,
        timings: Timings,
        deadline: Instant,
    ) -> Option<Permit<'_>> {
        loop {
            let changed = self.changed.notified();
            let wake = match self.try_take(via, namespace, name, labels, &timings) {
                Ok(permit) => return Some(permit),
                Err(wake) => wake,
            };
            // At the latest after the fallback: the view may be stale.
            let wake = wake
                .unwrap_or_else(|| Instant::now() + timings.fallback)
                .min(deadline);
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(wake) => {}
            }
            if Instant::now() >= deadline {
                return None;
            }
        }
    }

    /// A permit now, if the pod's budgets allow one.
    pub(crate) fn try_permit(
        &self,
        via: Via,
        namespace: &str,
        name: &str,
        labels: &BTreeMap<String, String>,
        timings: Timings,
    ) -> Option<Permit<'_>> {
        self.try_take(via, namespace, name, labels, &timings).ok()
    }

    /// What holds a hand-over of a pod with `labels` in `namespace` back
    /// now, if anything: the first budget covering it without room, or
    /// the budgets' view not being there; for the status while it waits.
    pub(crate) fn holding(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Option<String> {
        if !self.synced() {
            return Some(
                "the PodDisruptionBudgets are not known yet (their watch has not listed them)"
                    .into(),
            );
        }
        let entries = self.entries();
        let mut held: Vec<(&(String, String), &Entry)> = entries
            .iter()
            .filter(|((ns, _), e)| ns == namespace && covers(&e.pdb, labels) && e.room() <= 0)
            .collect();
        held.sort_by(|a, b| a.0.cmp(b.0));
        held.first().map(|((ns, name), e)| {
            let allowed = e.pdb.status.as_ref().map_or(0, |s| s.disruptions_allowed);
            format!("PodDisruptionBudget {ns}/{name} allows no disruption now (disruptionsAllowed {allowed}, {} of ours to come)", e.in_flight as usize + e.unseen.len())
        })
    }

    /// A permit now, or when to look again (`None`: when something
    /// changes).
    fn try_take(
        &self,
        via: Via,
        namespace: &str,
        name: &str,
        labels: &BTreeMap<String, String>,
        timings: &Timings,
    ) -> Result<Permit<'_>, Option<Instant>> {
        if !self.synced() {
            return match via {
                // Asked again once the watch lists the budgets, and at the
                // latest after the fallback.
                Via::HandOver => Err(Some(Instant::now() + timings.fallback)),
                Via::Eviction | Via::Forced => Ok(Permit::ungated(self, name)),
            };
        }
        let mut entries = self.entries();
        let covering: Vec<(String, String)> = entries
            .iter()
            .filter(|((ns, _), e)| ns == namespace && covers(&e.pdb, labels))
            .map(|(k, _)| k.clone())
            .collect();
        let mut wake: Option<Option<Instant>> = None;
        for k in &covering {
            let Some(e) = entries.get_mut(k) else {
                continue;
            };
            let until = match via {
                Via::Forced => None,
                // Only room the view shows: no probe.
                Via::HandOver => (e.room() <= 0).then_some(None),
                Via::Eviction => e.blocked_until(name, timings),
            };
            if let Some(until) = until {
                e.blocked_since.get_or_insert_with(Instant::now);
                wake = Some(match (wake.flatten(), until) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                });
            }
        }
        if let Some(wake) = wake {
            return Err(wake);
        }
        let mut keys = Vec::with_capacity(covering.len());
        for k in covering {
            if let Some(e) = entries.get_mut(&k) {
                e.in_flight += 1;
                e.blocked_since = None;
                keys.push((k, e.version));
            }
        }
        Ok(Permit {
            budgets: self,
            pod: name.to_owned(),
            keys,
            settled: false,
        })
    }

    fn settle(&self, keys: &[((String, String), u64)], pod: &str, answer: Answer) {
        let mut entries = self.entries();
        for (k, sent_at) in keys {
            if let Some(e) = entries.get_mut(k) {
                e.in_flight = e.in_flight.saturating_sub(1);
                match answer {
                    // The watch may show the budget the eviction wrote
                    // before its answer arrives: a budget changed since
                    // the eviction went out is taken to count it.
                    Answer::Accepted => {
                        if e.version == *sent_at {
                            e.unseen.insert(pod.to_owned(), Instant::now());
                        }
                        e.refused = None;
                        e.quiet_refusals = 0;
                    }
                    Answer::Replaced => {
                        e.refused = None;
                        e.quiet_refusals = 0;
                    }
                    Answer::Refused => {
                        let quiet = e.refused.is_some_and(|(_, changed)| !changed);
                        e.quiet_refusals = if quiet { e.quiet_refusals + 1 } else { 1 };
                        e.refused = Some((Instant::now(), false));
                        e.refused_pod = Some(pod.to_owned());
                    }
                    Answer::Other => {}
                }
            }
        }
        drop(entries);
        self.changed.notify_waiters();
    }
}

fn key(pdb: &PodDisruptionBudget) -> (String, String) {
    (pdb.namespace().unwrap_or_default(), pdb.name_any())
}

#[derive(Clone, Copy)]
enum Answer {
    Accepted,
    Replaced,
    Refused,
    Other,
}

/// An eviction allowed out, counted against the budgets that cover its
/// pod until its answer is told (or it is dropped unanswered).
pub(crate) struct Permit<'a> {
    budgets: &'a Budgets,
    pod: String,
    /// The budgets that cover the pod, and the version of each the
    /// eviction went out under.
    keys: Vec<((String, String), u64)>,
    settled: bool,
}

impl Permit<'_> {
    fn ungated<'b>(budgets: &'b Budgets, pod: &str) -> Permit<'b> {
        Permit {
            budgets,
            pod: pod.to_owned(),
            keys: Vec::new(),
            settled: false,
        }
    }

    /// Whether a budget the watch knows covers the pod: a refusal is
    /// then waited out on the budget, not on a timer.
    pub fn gated(&self) -> bool {
        !self.keys.is_empty()
    }

    fn settle(mut self, answer: Answer) {
        self.settled = true;
        self.budgets.settle(&self.keys, &self.pod, answer);
    }

    /// The API server accepted the eviction.
    pub fn accepted(self) {
        self.settle(Answer::Accepted);
    }

    /// A surge handed its pod over: the owner removes it, and a Ready
    /// replacement already stands for it, so the budget's healthy pods
    /// never drop for it and it is not counted as a disruption to come
    /// (as an accepted eviction is, until the budget lists it).
    pub fn replaced(self) {
        self.settle(Answer::Replaced);
    }

    /// A budget refused it (HTTP 429).
    pub fn refused(self) {
        self.settle(Answer::Refused);
    }

    /// It failed otherwise.
    pub fn failed(self) {
        self.settle(Answer::Other);
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.budgets.settle(&self.keys, &self.pod, Answer::Other);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pdb(name: &str, allowed: i32, disrupted: &[&str]) -> PodDisruptionBudget {
        let disrupted: serde_json::Map<String, serde_json::Value> = disrupted
            .iter()
            .map(|p| ((*p).to_owned(), json!("2026-12-03T09:00:00Z")))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 3,
                "desiredHealthy": 2, "expectedPods": 3, "disruptedPods": disrupted},
        }))
        .unwrap()
    }

    fn web() -> BTreeMap<String, String> {
        BTreeMap::from([("app".to_owned(), "web".to_owned())])
    }

    const T: Timings = Timings {
        fallback: Duration::from_secs(5),
        min_interval: Duration::from_millis(200),
    };

    fn synced(pdbs: Vec<PodDisruptionBudget>) -> Budgets {
        let b = Budgets::default();
        b.relisted(pdbs);
        b.synced.store(true, Ordering::Relaxed);
        b
    }

    /// A surge's hand-over takes a permit while it claims the pod, and
    /// gives it back as no disruption to come: the pod's replacement is
    /// Ready already, so the next pod of a budget allowing one may be
    /// handed over at once. (Before, it counted as an eviction the watch
    /// had not shown yet, for 5 s: the budget never lists a pod the owner
    /// removes, so a surged Deployment behind a budget allowing one lost
    /// one pod every 5 s.)
    #[tokio::test(start_paused = true)]
    async fn a_surge_hand_over_is_no_disruption_to_come() {
        let b = synced(vec![pdb("web", 1, &[])]);
        let first = b
            .try_permit(Via::HandOver, "shop", "web-a", &web(), T)
            .unwrap();
        // While it is claimed, it holds the budget's one disruption.
        assert!(
            b.try_permit(Via::Eviction, "shop", "web-b", &web(), T)
                .is_none()
        );
        first.replaced();
        let second = b
            .try_permit(Via::Eviction, "shop", "web-b", &web(), T)
            .unwrap();
        second.accepted();
        // An eviction accepted is one to come until the watch shows it.
        assert!(
            b.try_permit(Via::Eviction, "shop", "web-c", &web(), T)
                .is_none()
        );
    }

    /// A budget allowing one: one eviction goes out, the others wait for
    /// the replacement (no burst of certain refusals, no probe while the
    /// budget is getting room by itself).
    #[tokio::test(start_paused = true)]
    async fn a_budget_allowing_one_lets_one_out_at_a_time() {
        let b = synced(vec![pdb("web", 1, &[])]);
        let first = b
            .try_take(Via::Eviction, "shop", "web-a", &web(), &T)
            .ok()
            .unwrap();
        assert!(first.gated());
        assert!(
            b.try_take(Via::Eviction, "shop", "web-b", &web(), &T)
                .is_err()
        );
        first.accepted();
        // Accepted, not yet shown by the watch: still no room.
        assert!(
            b.try_take(Via::Eviction, "shop", "web-b", &web(), &T)
                .is_err()
        );
        // The watch shows it (disrupted, nothing allowed now): the budget
        // gets room by itself once the replacement is Ready; no probe.
        b.applied(pdb("web", 0, &["web-a"]));
        assert!(
            b.try_take(Via::Eviction, "shop", "web-b", &web(), &T)
                .is_err()
        );
        b.applied(pdb("web", 1, &[]));
        let second = b
            .try_take(Via::Eviction, "shop", "web-b", &web(), &T)
            .ok()
            .unwrap();
        assert!(
            b.try_take(Via::Eviction, "shop", "web-c", &web(), &T)
                .is_err()
        );
        second.accepted();
        // A replacement that never comes: a probe once the fallback has
        // passed, then the refusal is asked again only when the budget
        // changes, and not before the minimum interval.
        b.applied(pdb("web", 0, &["web-b"]));
        assert!(
            b.try_take(Via::Eviction, "shop", "web-c", &web(), &T)
                .is_err()
        );
        tokio::time::advance(T.fallback).await;
        let probe = b
            .try_take(Via::Eviction, "shop", "web-c", &web(), &T)
            .ok()
            .unwrap();
        probe.refused();
        assert!(
            b.try_take(Via::Eviction, "shop", "web-c", &web(), &T)
                .is_err()
        );
        b.applied(pdb("web", 1, &[]));
        assert!(
            b.try_take(Via::Eviction, "shop", "web-c", &web(), &T)
                .is_err()
        );
        tokio::time::advance(T.min_interval).await;
        assert!(
            b.try_take(Via::Eviction, "shop", "web-c", &web(), &T)
                .is_ok()
        );
    }

    /// The watch may show the budget the eviction wrote before the
    /// eviction's answer arrives: the disruption is not counted twice.
    #[tokio::test(start_paused = true)]
    async fn a_budget_shown_before_the_answer_counts_the_eviction_once() {
        let b = synced(vec![pdb("web", 1, &[])]);
        let first = b
            .try_take(Via::Eviction, "shop", "web-a", &web(), &T)
            .ok()
            .unwrap();
        b.applied(pdb("web", 0, &["web-a"]));
        b.applied(pdb("web", 1, &[]));
        first.accepted();
        assert!(
            b.try_take(Via::Eviction, "shop", "web-b", &web(), &T)
                .is_ok()
        );
    }

    /// A budget that never allows and never changes is asked after 5 s,
    /// then 10, 20 and every 30 s; a change brings the 5 s back.
    #[tokio::test(start_paused = true)]
    async fn a_budget_that_never_allows_is_probed_less_and_less() {
        let b = synced(vec![pdb("web", 0, &[])]);
        b.try_take(Via::Eviction, "shop", "web-a", &web(), &T)
            .ok()
            .unwrap()
            .refused();
        let started = Instant::now();
        let deadline = started + Duration::from_secs(60);
        let mut probes = vec![0];
        while let Some(p) = b
            .permit(Via::Eviction, "shop", "web-a", &web(), T, deadline)
            .await
        {
            probes.push((Instant::now() - started).as_secs());
            p.refused();
        }
        assert_eq!(probes, [0, 5, 15, 35], "probes over a minute");
        // A change: asked at once (the last ask is older than 5 s), then
        // 5 s after.
        b.applied(pdb("web", 0, &[]));
        b.try_take(Via::Eviction, "shop", "web-a", &web(), &T)
            .ok()
            .unwrap()
            .refused();
        let again = Instant::now();
        let p = b
            .permit(
                Via::Eviction,
                "shop",
                "web-a",
                &web(),
                T,
                again + Duration::from_secs(60),
            )
            .await;
        assert_eq!((Instant::now() - again).as_secs(), 5);
        drop(p);
    }

    /// While a budget holds, the pod it refused asks again first (the
    /// drain's message does not flip between pods); another pod asks
    /// when that one does not come back.
    #[tokio::test(start_paused = true)]
    async fn the_refused_pod_asks_again_first() {
        let b = synced(vec![pdb("web", 0, &[])]);
        b.try_take(Via::Eviction, "shop", "web-a", &web(), &T)
            .ok()
            .unwrap()
            .refused();
        tokio::time::advance(T.fallback).await;
        assert!(
            b.try_take(Via::Eviction, "shop", "web-b", &web(), &T)
                .is_err()
        );
        b.try_take(Via::Eviction, "shop", "web-a", &web(), &T)
            .ok()
            .unwrap()
            .refused();
        // Asked again 10 s after (a second refusal with no change).
        tokio::time::advance(2 * T.fallback + T.min_interval).await;
        assert!(
            b.try_take(Via::Eviction, "shop", "web-b", &web(), &T)
                .is_ok()
        );
    }

    /// Pods no budget covers, and every pod while the watch is not
    /// synced, go out at once.
    #[tokio::test(start_paused = true)]
    async fn uncovered_pods_and_an_unsynced_view_are_not_gated() {
        let b = synced(vec![pdb("web", 0, &[])]);
        let other = BTreeMap::from([("app".to_owned(), "api".to_owned())]);
        assert!(
            !b.try_take(Via::Eviction, "shop", "api-a", &other, &T)
                .ok()
                .unwrap()
                .gated()
        );
        let unsynced = Budgets::default();
        unsynced.relisted(vec![pdb("web", 0, &[])]);
        assert!(
            !unsynced
                .try_take(Via::Eviction, "shop", "web-a", &web(), &T)
                .ok()
                .unwrap()
                .gated()
        );
    }

    /// A hand-over is a disruption nobody but this gate checks: a budget
    /// that allows nothing holds it for good (no probe once the fallback
    /// passes, as an eviction gets, since no API server would refuse it),
    /// and the budget holding it is named.
    #[tokio::test(start_paused = true)]
    async fn a_budget_that_allows_nothing_holds_a_hand_over_for_good() {
        let b = synced(vec![pdb("web", 0, &[])]);
        assert!(
            b.try_take(Via::HandOver, "shop", "web-a", &web(), &T)
                .is_err()
        );
        // An eviction goes out as a probe: the API server decides.
        b.try_take(Via::Eviction, "shop", "web-a", &web(), &T)
            .ok()
            .unwrap()
            .refused();
        let deadline = Instant::now() + Duration::from_secs(120);
        assert!(
            b.permit(Via::HandOver, "shop", "web-a", &web(), T, deadline)
                .await
                .is_none(),
            "handed over past a budget allowing nothing"
        );
        assert!(
            b.holding("shop", &web())
                .is_some_and(|w| w.contains("PodDisruptionBudget shop/web")),
            "{:?}",
            b.holding("shop", &web())
        );
        // Room shown: it goes.
        b.applied(pdb("web", 1, &[]));
        assert!(
            b.try_take(Via::HandOver, "shop", "web-a", &web(), &T)
                .is_ok()
        );
        assert_eq!(b.holding("shop", &web()), None);
    }

    /// Without the budgets' view a hand-over waits for it (an eviction
    /// goes, and the API server checks it).
    #[tokio::test(start_paused = true)]
    async fn a_hand_over_waits_for_the_budgets_view() {
        let unsynced = Budgets::default();
        assert!(
            unsynced
                .try_take(Via::HandOver, "shop", "web-a", &web(), &T)
                .is_err()
        );
        assert!(unsynced.holding("shop", &web()).is_some());
    }

    /// A deletion the policy forces is never held, but it takes the
    /// budget's room like any disruption: the eviction beside it waits.
    #[tokio::test(start_paused = true)]
    async fn a_forced_removal_is_counted_against_the_budget() {
        let b = synced(vec![pdb("web", 1, &[])]);
        b.try_take(Via::Forced, "shop", "web-a", &web(), &T)
            .ok()
            .unwrap()
            .accepted();
        assert!(
            b.try_take(Via::Eviction, "shop", "web-b", &web(), &T)
                .is_err()
        );
        assert!(
            b.try_take(Via::HandOver, "shop", "web-b", &web(), &T)
                .is_err()
        );
        let none = synced(vec![pdb("web", 0, &[])]);
        assert!(
            none.try_take(Via::Forced, "shop", "web-a", &web(), &T)
                .is_ok()
        );
    }
}
