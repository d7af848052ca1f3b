//! The one writer of a NodeMaintenance during a reconcile: its status (the
//! steps' changes, the drain's progress) and its metadata (finalizer, owner
//! reference), each write guarded by the resourceVersion last seen.
//!
//! It keeps the object as the last write returned it, so a write costs one
//! request (a second only after a conflict), and it tells the context each
//! resourceVersion it wrote: the watch event our own write causes then
//! wakes a reconcile that does nothing (see [`Context::own_write`]).

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::controller::context::Context;
use crate::crd::{MaintenancePhase, NodeMaintenance, NodeMaintenanceStatus, PodReference};
use crate::error::{Error, Result};

/// Writes after a conflict before giving up.
const ATTEMPTS: usize = 8;

/// What a maintenance's first status write sets, whichever step makes it
/// (the Go operator's status initialisation).
#[derive(Debug, Clone, Default)]
pub struct Init {
    /// The policy chosen (`name@sha256:…`), once known.
    pub policy: Option<String>,
    /// Every pod on the node, once listed.
    pub total_pods: i32,
    /// The pods the drain waits for (those the plan removes and those it
    /// blocks on), once planned.
    pub removals: Vec<PodReference>,
}

/// The time as the status records it.
pub fn now() -> Time {
    Time(Timestamp::now())
}

/// The time `after` from now, as the status records it.
pub fn after(after: std::time::Duration) -> Time {
    let now = Timestamp::now();
    Time(
        now.checked_add(k8s_openapi::jiff::SignedDuration::try_from(after).unwrap_or_default())
            .unwrap_or(now),
    )
}

/// `pendingPods` and `pendingPodsRefs` from a list of pods.
pub(crate) fn pod_refs(list: &[PodReference]) -> (Option<Vec<String>>, Option<Vec<PodReference>>) {
    if list.is_empty() {
        return (None, None);
    }
    (
        Some(list.iter().map(|p| p.name.clone()).collect()),
        Some(list.to_vec()),
    )
}

/// Sets `pendingPods`, `pendingPodsRefs` and `drainProgress` from the pods
/// the drain still waits for (those it removes and those it blocks on).
///
/// Everything here is recomputed from what the drain saw, never kept from
/// the status (which anyone with access to it may have written): progress
/// is the share of `evictionPods` gone, and a maintenance with pods still
/// to go is `Running`, whatever the status said before.
pub(crate) fn set_pending(s: &mut NodeMaintenanceStatus, pending: &[PodReference]) {
    let (names, refs) = pod_refs(pending);
    s.pending_pods = names;
    s.pending_pods_refs = refs;
    s.drain_progress = progress(s.eviction_pods, pending.len());
    if !pending.is_empty() && s.phase == Some(MaintenancePhase::Succeeded) {
        s.phase = Some(MaintenancePhase::Running);
    }
}

/// Whether the status claims more than the drain has done: Succeeded, or
/// all pods gone, while `pending` are still to go.
pub(crate) fn overstates(s: &NodeMaintenanceStatus, pending: &[PodReference]) -> bool {
    !pending.is_empty()
        && (s.phase == Some(MaintenancePhase::Succeeded)
            || s.drain_progress >= 100
            || s.pending_pods_refs.as_ref().is_none_or(Vec::is_empty))
}

/// The drain's progress in percent: the share of the pods to evict at the
/// start that are gone.
fn progress(eviction_pods: i32, pending: usize) -> i32 {
    if eviction_pods <= 0 {
        return 0;
    }
    // In i64: status values come from the API and may be anything.
    let total = i64::from(eviction_pods);
    let done = (total - pending as i64).max(0);
    (done * 100 / total).clamp(0, 100) as i32
}

/// The writer (shared with the drain's progress task).
pub(crate) struct Writer {
    api: Api<NodeMaintenance>,
    ctx: Arc<Context>,
    state: tokio::sync::Mutex<State>,
}

struct State {
    nm: NodeMaintenance,
    /// Set while the maintenance has no phase: applied by the first write.
    init: Option<Init>,
    /// A write of ours succeeded: `nm` is the server's current object.
    fresh: bool,
}

impl Writer {
    pub fn new(ctx: Arc<Context>, nm: NodeMaintenance) -> Arc<Self> {
        let init = nm
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .is_none()
            .then(Init::default);
        Arc::new(Writer {
            api: Api::all(ctx.client().clone()),
            ctx,
            state: tokio::sync::Mutex::new(State {
                nm,
                init,
                fresh: false,
            }),
        })
    }

    /// The object as last seen.
    pub async fn current(&self) -> NodeMaintenance {
        self.state.lock().await.nm.clone()
    }

    /// Whether the status still has to be initialised (the first pass).
    pub(crate) async fn initialising(&self) -> bool {
        self.state.lock().await.init.is_some()
    }

    /// Clears the status: the maintenance starts over (its node changed),
    /// and its next write initialises it again.
    pub(crate) async fn start_over(&self) -> Result<()> {
        self.update(|s| *s = NodeMaintenanceStatus::default())
            .await?;
        self.state.lock().await.init = Some(Init::default());
        Ok(())
    }

    /// Changes what the initialisation will write.
    /// Returns whether an initialisation was still due (and so took `f`).
    pub(crate) async fn plan_init(&self, f: impl FnOnce(&mut Init)) -> bool {
        match self.state.lock().await.init.as_mut() {
            Some(init) => {
                f(init);
                true
            }
            None => false,
        }
    }

    /// Changes the status with `f` (after the initialisation, if it is
    /// still due) and writes it; nothing is written when nothing changes.
    /// Returns the status before the change.
    pub async fn update(
        &self,
        f: impl Fn(&mut NodeMaintenanceStatus),
    ) -> Result<NodeMaintenanceStatus> {
        self.write(f, true).await
    }

    /// [`Writer::update`] for a maintenance that is not admitted yet: the
    /// initialisation (which sets the phase) is left for later.
    pub(crate) async fn update_before_admission(
        &self,
        f: impl Fn(&mut NodeMaintenanceStatus),
    ) -> Result<NodeMaintenanceStatus> {
        self.write(f, false).await
    }

    async fn write(
        &self,
        f: impl Fn(&mut NodeMaintenanceStatus),
        init_now: bool,
    ) -> Result<NodeMaintenanceStatus> {
        let mut state = self.state.lock().await;
        let name = state.nm.name_any();
        for _ in 0..ATTEMPTS {
            let old = state.nm.status.clone().unwrap_or_default();
            let mut new = old.clone();
            if let Some(init) = &state.init
                && new.phase.is_none()
                && init_now
            {
                apply_init(&mut new, init);
            }
            f(&mut new);
            if new == old {
                return Ok(old);
            }
            let mut nm = state.nm.clone();
            nm.status = Some(new);
            match self
                .api
                .replace_status(&name, &PostParams::default(), &nm)
                .await
            {
                Ok(updated) => {
                    self.wrote(&mut state, updated);
                    if init_now {
                        state.init = None;
                    }
                    return Ok(old);
                }
                Err(kube::Error::Api(e)) if e.code == 409 => self.reread(&mut state).await?,
                Err(e) => return Err(Error::kube("updating the NodeMaintenance status")(e)),
            }
        }
        Err(Error::Conflict("updating the NodeMaintenance status"))
    }

    /// A merge patch of metadata, guarded by the resourceVersion last
    /// seen: a concurrent change fails it (the next pass sees the change).
    pub(crate) async fn patch_metadata(
        &self,
        metadata: serde_json::Value,
        op: &'static str,
    ) -> Result<()> {
        let mut state = self.state.lock().await;
        let mut metadata = metadata;
        metadata["resourceVersion"] = json!(state.nm.resource_version());
        let updated = self
            .api
            .patch(
                &state.nm.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": metadata})),
            )
            .await
            .map_err(Error::kube(op))?;
        self.wrote(&mut state, updated);
        Ok(())
    }

    /// Reads the object from the server (not the cache) unless a write of
    /// this pass already proved it current. `None` when it is gone.
    pub(crate) async fn confirm(&self) -> Result<Option<NodeMaintenance>> {
        let mut state = self.state.lock().await;
        if state.fresh {
            return Ok(Some(state.nm.clone()));
        }
        let Some(nm) = self
            .api
            .get_opt(&state.nm.name_any())
            .await
            .map_err(Error::kube("reading the NodeMaintenance"))?
        else {
            return Ok(None);
        };
        let same = nm.uid() == state.nm.uid();
        if same {
            state.nm = nm.clone();
            state.fresh = true;
        }
        Ok(Some(nm))
    }

    fn wrote(&self, state: &mut State, updated: NodeMaintenance) {
        self.ctx.memory.own_write(
            &updated.uid().unwrap_or_default(),
            updated.resource_version().unwrap_or_default(),
        );
        state.nm = updated;
        state.fresh = true;
    }

    async fn reread(&self, state: &mut State) -> Result<()> {
        let nm = self
            .api
            .get(&state.nm.name_any())
            .await
            .map_err(Error::kube("reading the NodeMaintenance"))?;
        if nm.uid() != state.nm.uid() {
            return Err(Error::Conflict("updating the NodeMaintenance status"));
        }
        state.nm = nm;
        Ok(())
    }
}

fn apply_init(s: &mut NodeMaintenanceStatus, init: &Init) {
    let (names, refs) = pod_refs(&init.removals);
    s.phase = Some(MaintenancePhase::Running);
    s.waiting = None;
    s.policy = init.policy.clone();
    s.last_update = Some(now());
    s.pending_pods = names;
    s.pending_pods_refs = refs;
    s.eviction_pods = i32::try_from(init.removals.len()).unwrap_or(i32::MAX);
    s.total_pods = init.total_pods;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(names: &[&str]) -> Vec<PodReference> {
        names
            .iter()
            .map(|n| PodReference {
                namespace: "default".into(),
                name: (*n).into(),
            })
            .collect()
    }

    #[test]
    fn a_status_written_by_someone_else_is_recomputed() {
        let mut s = NodeMaintenanceStatus {
            phase: Some(MaintenancePhase::Succeeded),
            drain_progress: 100,
            eviction_pods: 4,
            ..Default::default()
        };
        assert!(overstates(&s, &pods(&["a", "b"])));
        set_pending(&mut s, &pods(&["a", "b"]));
        assert_eq!(s.phase, Some(MaintenancePhase::Running));
        assert_eq!(s.drain_progress, 50);
        assert!(!overstates(&s, &pods(&["a", "b"])));
        assert!(!overstates(&s, &[]));
    }

    #[test]
    fn progress_never_goes_back_unless_pods_came_back() {
        let mut s = NodeMaintenanceStatus {
            eviction_pods: 4,
            ..Default::default()
        };
        set_pending(&mut s, &pods(&["a", "b", "c", "d"]));
        assert_eq!(s.drain_progress, 0);
        set_pending(&mut s, &pods(&["b", "c"]));
        assert_eq!(s.drain_progress, 50);
        // A new attempt reports the same pods again, and one it had not
        // counted as gone: still the same set, progress stays.
        set_pending(&mut s, &pods(&["b", "c"]));
        assert_eq!(s.drain_progress, 50);
        set_pending(&mut s, &pods(&["c"]));
        assert_eq!(s.drain_progress, 75);
        assert_eq!(s.pending_pods.as_deref(), Some(&["c".to_owned()][..]));
        // A pod that came back (or a new one): progress may fall.
        set_pending(&mut s, &pods(&["c", "e"]));
        assert_eq!(s.drain_progress, 50);
        set_pending(&mut s, &[]);
        assert_eq!(s.drain_progress, 100);
        assert_eq!(s.pending_pods, None);
    }

    #[test]
    fn progress_is_zero_without_pods_to_evict_and_bounded_with_odd_counts() {
        assert_eq!(progress(0, 0), 0);
        assert_eq!(progress(-3, 1), 0);
        assert_eq!(progress(2, 5), 0);
        assert_eq!(progress(i32::MAX, 0), 100);
    }
}
