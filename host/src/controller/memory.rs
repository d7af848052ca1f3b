//! What the controller remembers about each maintenance between passes:
//! one [`Memory`] per maintenance (by uid), in one map behind one lock.
//! Forgetting a maintenance is one removal: when its finalizer is removed,
//! when the watch sees it deleted, and at every orphan sweep for any uid
//! the cache no longer holds (a maintenance that vanished without a pass
//! of ours, its finalizer removed by hand).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::ResourceExt;

use super::next::Next;
use crate::crd::NodeMaintenance;
use crate::crd::is_admitted;
use crate::error::Result;
use crate::policy::Selected;
use crate::sync::Locked;

/// How many of our writes to one maintenance are remembered.
const OWN_WRITES_KEPT: usize = 64;

/// Everything remembered about one maintenance.
#[derive(Default)]
pub(super) struct Memory {
    /// Consecutive failures (the policy's `attempt` and the backoff's
    /// exponent).
    failures: u32,
    /// When a maintenance that failed may be tried again: the policy's
    /// verdict holds whatever wakes the reconcile earlier (our own status
    /// write, a watch event), so one attempt gets one `on-failure` and a
    /// retry never comes sooner than the verdict said.
    retry_at: Option<Instant>,
    /// The policy the maintenance started with: it finishes with it,
    /// whatever reloads happen meanwhile.
    pin: Option<Selected>,
    /// The resourceVersions our writes produced, newest last: a pass woken
    /// by one of these writes has nothing to do.
    own_versions: VecDeque<String>,
    /// When the last completed pass wanted the next one: `None` while a
    /// pass runs (or after one that failed).
    next: Option<(Instant, Next)>,
    /// This process admitted it (the cache may not show it admitted yet).
    admitted_here: bool,
    /// When each reason was last said, by what it is and its subject: the
    /// policy's waiting or park reason (status and event), and each per-pod
    /// event of its drain (a forced removal, a surge fallen back: the pod,
    /// and how it was removed). A reason said again within an interval is
    /// not said.
    said: std::collections::HashMap<(&'static str, String), Instant>,
    /// Its next pass must look even if woken by our own write (a place
    /// freed for a waiting maintenance).
    forced: bool,
    /// What its drain has done to each pod so far.
    ledger: std::sync::Arc<super::drain::ledger::Ledger>,
    /// This process has looked for its surges in the cluster once (and
    /// undone them): until then a surge of an earlier process (a restart
    /// mid-surge) may still be there, whatever this process's plans did.
    surges_checked: bool,
    /// Parked by its policy: the NodeMaintenance as it was then (its
    /// generation and metadata), and when to look again (`None`: only once
    /// it changes).
    parked: Option<(String, Option<Instant>)>,
    /// The fleet's fingerprint when its policy last said to wait with no
    /// `recheck-after`: while the fleet keeps that fingerprint, the answer
    /// stands and the policy is not asked again.
    waiting_on: Option<u64>,
}

/// What a person changes on a parked maintenance to have it tried again:
/// its spec (generation), labels or annotations.
fn parked_key(nm: &NodeMaintenance) -> String {
    format!(
        "{:?}/{:?}/{:?}",
        nm.metadata.generation, nm.metadata.labels, nm.metadata.annotations
    )
}

/// The memories of every maintenance, by uid.
pub(super) struct Memories(Mutex<HashMap<String, Memory>>, Duration);

impl Memories {
    /// Nothing remembered yet; a reason is said at most once every
    /// `say_every` ([`Settings::waiting_update_interval`](super::Settings::waiting_update_interval)).
    pub(super) fn new(say_every: Duration) -> Self {
        Memories(Mutex::default(), say_every)
    }

    /// Runs `f` on the memory of `uid`, made empty if there was none.
    fn with<T>(&self, uid: &str, f: impl FnOnce(&mut Memory) -> T) -> T {
        let mut all = self.0.locked();
        f(all.entry(uid.to_owned()).or_default())
    }

    /// Runs `f` on the memory of `uid` if there is one (nothing is made).
    fn existing<T>(&self, uid: &str, f: impl FnOnce(&mut Memory) -> T) -> Option<T> {
        let mut all = self.0.locked();
        all.get_mut(uid).map(f)
    }

    fn remove(&self, uid: &str) {
        self.0.locked().remove(uid);
    }

    /// Keeps only the memories of `uids`.
    pub(super) fn retain(&self, uids: &HashSet<String>) {
        self.0.locked().retain(|uid, _| uids.contains(uid));
    }

    /// Forgets every maintenance.
    fn clear(&self) {
        self.0.locked().clear();
    }

    pub(super) fn len(&self) -> usize {
        self.0.locked().len()
    }
}

impl Memories {
    /// The policy pinned for the maintenance `uid`, or, at its first
    /// decision, the one `choose` selects, pinned from then on.
    pub(super) fn pinned_or(
        &self,
        uid: &str,
        choose: impl FnOnce() -> Result<Selected>,
    ) -> Result<Selected> {
        self.with(uid, |m| {
            if let Some(s) = &m.pin {
                return Ok(s.clone());
            }
            let selected = choose()?;
            m.pin = Some(selected.clone());
            Ok(selected)
        })
    }

    /// Forgets everything about a maintenance that is gone.
    pub(super) fn forget(&self, uid: &str) {
        self.remove(uid);
    }

    /// Forgets every maintenance: what this process knew as leader may be
    /// stale by the time it leads again (another replica went on), so it
    /// starts as a restarted process would.
    pub(super) fn forget_all(&self) {
        self.clear();
    }

    /// Whether `nm` was admitted, by its status or by this process (whose
    /// write the cache may not have seen yet).
    pub fn admitted(&self, nm: &NodeMaintenance) -> bool {
        is_admitted(nm)
            || self
                .existing(&nm.uid().unwrap_or_default(), |m| m.admitted_here)
                .unwrap_or(false)
    }

    /// Records that this process admitted the maintenance `uid`.
    pub(crate) fn admitted_now(&self, uid: &str) {
        self.with(uid, |m| m.admitted_here = true);
    }

    /// The maintenance starts over (its node changed): admitted again, its
    /// policy chosen again, its failures forgotten.
    pub(super) fn start_over(&self, uid: &str) {
        self.existing(uid, |m| {
            m.admitted_here = false;
            m.pin = None;
            m.failures = 0;
            m.retry_at = None;
            m.ledger = Default::default();
            m.parked = None;
        });
    }

    /// Whether the maintenance `uid` may hold surges: a plan of it surged
    /// a pod, or this process has not looked yet (it restarted: a surge of
    /// the process before may be there).
    pub(super) fn may_hold_surges(&self, uid: &str) -> bool {
        self.existing(uid, |m| m.ledger.surged() || !m.surges_checked)
            .unwrap_or(true)
    }

    /// This process looked for the surges of `uid` and undid them.
    pub(super) fn surges_checked(&self, uid: &str) {
        self.with(uid, |m| m.surges_checked = true);
    }

    /// The ledger of the drain of `uid`.
    pub(super) fn ledger(&self, uid: &str) -> std::sync::Arc<super::drain::ledger::Ledger> {
        self.with(uid, |m| m.ledger.clone())
    }

    /// The policy parked `nm`: nothing is tried again until `recheck` (if
    /// any) or until it changes.
    pub(super) fn park(&self, nm: &NodeMaintenance, recheck: Option<Duration>) {
        let key = parked_key(nm);
        self.with(&nm.uid().unwrap_or_default(), |m| {
            m.parked = Some((key, recheck.map(|d| Instant::now() + d)));
        });
    }

    /// Whether `nm` is parked and should stay so now: it has not changed
    /// since, and its recheck (if any) is not due. A parked maintenance that
    /// changed, or whose recheck is due, is unparked here.
    pub(super) fn still_parked(&self, nm: &NodeMaintenance) -> Option<Option<Duration>> {
        let key = parked_key(nm);
        self.existing(&nm.uid().unwrap_or_default(), |m| {
            let (was, until) = m.parked.clone()?;
            let now = Instant::now();
            if was != key || until.is_some_and(|u| u <= now) {
                m.parked = None;
                return None;
            }
            Some(until.map(|u| u - now))
        })
        .flatten()
    }

    /// Whether the policy said to wait, with no `recheck-after`, in a
    /// fleet with this `fingerprint` (see `fleet::Around::fingerprint`).
    pub(super) fn waits_on(&self, uid: &str, fingerprint: u64) -> bool {
        self.existing(uid, |m| m.waiting_on == Some(fingerprint))
            .unwrap_or(false)
    }

    /// The policy said to wait: until the fleet changes from `fingerprint`
    /// (`None`: it gave a time to ask again, or the maintenance goes on).
    pub(super) fn wait_on(&self, uid: &str, fingerprint: Option<u64>) {
        self.with(uid, |m| m.waiting_on = fingerprint);
    }

    /// The next pass of `uid` looks, whatever woke it.
    pub(super) fn force(&self, uid: &str) {
        self.with(uid, |m| m.forced = true);
    }

    /// Whether the pass starting now was forced (and clears it).
    pub(super) fn take_forced(&self, uid: &str) -> bool {
        self.existing(uid, |m| std::mem::take(&mut m.forced))
            .unwrap_or(false)
    }

    /// Remembers that our write gave the maintenance `uid` the
    /// resourceVersion `rv`.
    pub(super) fn own_write(&self, uid: &str, rv: String) {
        self.with(uid, |m| {
            m.own_versions.push_back(rv);
            while m.own_versions.len() > OWN_WRITES_KEPT {
                m.own_versions.pop_front();
            }
        });
    }

    /// When the maintenance is at a version our own write made and the
    /// last pass's wish for the next one still stands: that wish (what is
    /// left of its wait). `None`: a pass has work to do.
    pub(super) fn after_own_write(&self, uid: &str, rv: Option<&str>) -> Option<Next> {
        let rv = rv?;
        self.existing(uid, |m| {
            if !m.own_versions.iter().any(|v| v == rv) {
                return None;
            }
            let (since, next) = m.next?;
            next.left(since)
        })
        .flatten()
    }

    /// A pass starts: the last one's wish no longer stands.
    pub(super) fn forget_next(&self, uid: &str) {
        self.existing(uid, |m| m.next = None);
    }

    /// A pass ended wanting `next`.
    pub(super) fn remember_next(&self, uid: &str, next: Next) {
        self.with(uid, |m| m.next = Some((Instant::now(), next)));
    }

    /// Whether a waiting or parked maintenance's new reason may be written
    /// now (and, if so, notes that it is): the first always, then at most
    /// one every [`Settings::waiting_update_interval`](super::Settings::waiting_update_interval)
    /// (the throttle every reason a policy gives shares, [`Self::may_say`]).
    pub(super) fn may_write_reason(&self, uid: &str) -> bool {
        self.may_say(uid, "the policy's reason", "")
    }

    /// Whether `reason` about `subject` may be said now (and, if so, notes
    /// that it is): the first always, then at most one every
    /// [`Settings::waiting_update_interval`](super::Settings::waiting_update_interval),
    /// whatever the policy's words are this time.
    pub(super) fn may_say(&self, uid: &str, reason: &'static str, subject: &str) -> bool {
        let interval = self.1;
        self.with(uid, |m| {
            let now = Instant::now();
            m.said.retain(|_, at| now.duration_since(*at) < interval);
            match m.said.entry((reason, subject.to_owned())) {
                std::collections::hash_map::Entry::Occupied(_) => false,
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(now);
                    true
                }
            }
        })
    }

    /// Counts a failure; returns how many in a row.
    pub(super) fn failed(&self, uid: &str) -> u32 {
        self.with(uid, |m| {
            m.failures = m.failures.saturating_add(1);
            m.failures
        })
    }

    /// How many failures in a row so far.
    pub(super) fn failures(&self, uid: &str) -> u32 {
        self.existing(uid, |m| m.failures).unwrap_or(0)
    }

    /// An attempt succeeded: its failures and any hold are forgotten.
    pub(super) fn succeeded(&self, uid: &str) {
        self.existing(uid, |m| {
            m.failures = 0;
            m.retry_at = None;
        });
    }

    /// Holds the maintenance's next attempt until `delay` from now.
    pub(super) fn hold(&self, uid: &str, delay: Duration) {
        self.with(uid, |m| m.retry_at = Some(Instant::now() + delay));
    }

    /// How long the maintenance's next attempt is still held, if it is.
    pub(super) fn held(&self, uid: &str) -> Option<Duration> {
        self.existing(uid, |m| {
            let left = m.retry_at?.saturating_duration_since(Instant::now());
            if left.is_zero() {
                m.retry_at = None;
                return None;
            }
            Some(left)
        })
        .flatten()
    }
}
