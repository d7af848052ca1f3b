//! Make-before-break (`surge`): a pod whose owner can bring up a
//! replacement elsewhere leaves only once that replacement is Ready.
//!
//! The mechanism is the owner's own: its replicas go up by one (the
//! Deployment owning the pod's ReplicaSet, or a bare ReplicaSet), the
//! scheduler puts the new pod on another node (this one is cordoned),
//! and once it is Ready and the pod's PodDisruptionBudgets allow a
//! disruption, the pod gets the lowest `controller.kubernetes.io/pod-deletion-cost`
//! and the replicas go back down: the ReplicaSet controller then removes
//! exactly this pod. The owner ends as it was found (replicas, template);
//! its `maxSurge` must allow one more pod (a Recreate Deployment, or
//! `maxSurge: 0`, is evicted instead), and a Deployment mid-rollout is
//! waited for.
//!
//! Surges of one owner go in rounds at its [`Desk`]: the look that raises
//! adds every surge waiting there that `maxSurge` leaves room for, and the
//! look that hands over claims every pod whose replacement is Ready and
//! whose budgets allow now, then lowers the replicas once. A look reads
//! the owner and its pods from the desk's watch, not the API server, once
//! the watch shows this process's writes.
//!
//! While a surge runs the owner carries the annotation
//! [`SURGE_ANNOTATION`] (the pod, the replicas it had, the maintenance)
//! and the label [`SURGE_LABEL`]: a restarted operator resumes the surge
//! from them, a surge whose pod or maintenance is gone is undone by the
//! next one, and deleting the maintenance undoes its surges
//! ([`release`]). Someone else changing the replicas meanwhile (an HPA, a
//! GitOps tool) wins: their count is kept and the pod is evicted instead.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::reflector::store::Writer;
use kube::{Client, ResourceExt};

use serde_json::{Value, json};
use tokio::time::Instant;

use super::attempt::{Attempt, Note, Removal, Target};
use super::budgets::Via;
use crate::cluster::surge_record::{
    Entry, Found, Record, Remembered, SURGE_ANNOTATION, SurgeMemory,
};
use crate::cluster::workloads::Kind;
use crate::policy::workloads::{deployment_max_surge, replicas_of};
use crate::sync::Locked;

mod desk;
mod owner;

pub(crate) use desk::Desks;
use desk::*;
use owner::*;

/// On an owner while a maintenance surges one of its pods: the
/// maintenance's name (so its deletion finds them).
pub(crate) use crate::cluster::surge_record::SURGE_LABEL;
/// The ReplicaSet controller removes the pods with the lowest cost first.
pub(crate) const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
/// How often a surge looks at the replacement.
const POLL: Duration = Duration::from_millis(500);

/// How a surge ended.
#[derive(Debug)]
pub(in crate::controller) enum Surged {
    /// The owner removes the pod now, or the attempt ran out (the pod is
    /// still pending; the next attempt resumes).
    Done,
    /// The owner's rules allow no surge: evict instead, for this reason.
    Evict(String),
}

/// What one look at the surge found.
enum Step {
    /// Over: as said.
    Over(Surged),
    /// Not yet; what it waits for.
    Waiting(String),
}

/// Surges the pod `t`: raises its owner's replicas, waits for a Ready
/// replacement elsewhere and for its budgets, then has the owner remove
/// it. Returns when the owner removes the pod, the pod is gone, the
/// attempt runs out, or the owner allows no surge. Between looks it
/// waits for its owner or the owner's pods to change ([`Changes`]), not
/// on a clock.
pub(in crate::controller) async fn replace(
    how: Removal<'_>,
    desks: &Desks,
    t: &Target,
    state: &Attempt,
) -> Surged {
    let Some(("ReplicaSet", rs)) = t.controller.as_ref().map(|(k, n)| (k.as_str(), n)) else {
        return Surged::Evict("no ReplicaSet controls the pod".into());
    };
    if let Some(why) = &t.unreadable {
        return Surged::Evict(why.clone());
    }
    let mut desk: Option<Arc<Desk>> = None;
    let mut _joining: Option<Joining> = None;
    loop {
        if !state.has(&t.uid).await || Instant::now() >= how.deadline {
            return Surged::Done;
        }
        let opened = match &desk {
            Some(d) => Ok(d.clone()),
            None => match desks.open(how.client, &t.namespace, rs).await {
                // No such ReplicaSet (or Deployment above it): nothing to
                // surge through, and nothing a wait would bring.
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    return Surged::Evict(format!("its owner cannot be found ({})", e.message));
                }
                opened => opened,
            },
        };
        let (seen, looked) = match opened {
            Ok(d) => {
                if desk.is_none() {
                    _joining = Some(Joining::at(&d, entry(how, t)));
                    desk = Some(d.clone());
                }
                let seen = d.seen();
                (seen, look_at(how, &d, t, state).await)
            }
            Err(e) => (0, Err(e)),
        };
        // What the surge waits for now, and whether the look failed (then
        // it looks again on the clock, not on the owner's next change).
        let (waited, failed) = match looked {
            Ok(Step::Over(done)) => return done,
            Ok(Step::Waiting(what)) => (Some(what), false),
            // Two surges of one owner (or its controller) wrote it at the
            // same moment: the next look sees the winner; what the surge
            // waits for has not changed.
            Err(kube::Error::Api(e)) if e.code == 409 => (None, false),
            Err(e) => (
                Some(format!(
                    "surging pod {}: {}; trying again",
                    t.key(),
                    crate::text::api_error(&e)
                )),
                true,
            ),
        };
        if let Some(waited) = waited {
            state.waiting_for(t, waited).await;
        }
        match desk.as_ref() {
            Some(d) if !failed => d.next(seen, how.deadline, state, &t.uid).await,
            _ => {
                tokio::time::sleep(POLL.min(how.deadline.saturating_duration_since(Instant::now())))
                    .await
            }
        }
    }
}

/// One look at the owner for the pod `t`, in its turn: one look of the
/// owner at a time, so the next reads what this one wrote instead of
/// writing over the same read and being refused. A pod whose replacement
/// is Ready hands over with the others ready at that moment
/// ([`hand_over`]).
async fn look_at(how: Removal<'_>, desk: &Desk, t: &Target, state: &Attempt) -> kube::Result<Step> {
    let turn = desk.turn.lock().await;
    // Handed over by another look (in its turn: this one sees it).
    if let Some(step) = handed(how, desk, t) {
        return Ok(step);
    }
    let (mut owner, pods) = desk.read(how.client, &t.namespace).await?;
    let looked = look(how, desk, t, &mut owner, &pods).await;
    if owner.wrote || looked.is_err() {
        desk.wrote(&owner).await;
    }
    drop(turn);
    match looked? {
        Looked::Step(step) => Ok(step),
        Looked::Ready => {
            // The budgets may hold the pod a while (a hand-over is a
            // disruption no one else checks: only room the budgets' view
            // shows lets it go, never a probe): the status says which
            // budget, and the other surges of the owner take their turns
            // meanwhile.
            if let Some(why) = how.budgets.holding(&t.namespace, &t.labels) {
                state
                    .waiting_for(
                        t,
                        format!(
                            "surging pod {}: its replacement is Ready; waiting to hand it over: {why}",
                            t.key()
                        ),
                    )
                    .await;
            }
            let Some(permit) = how.budget_permit(Via::HandOver, t).await else {
                return Ok(Step::Over(Surged::Done));
            };
            // Another look took it meanwhile, with a permit of its own.
            if let Some(step) = handed(how, desk, t) {
                return Ok(step);
            }
            hand_over(how, desk, t, permit).await
        }
    }
}

/// The end of `t`'s surge if another look handed its pod over
/// ([`adopt`]): the owner removes it.
fn handed(how: Removal<'_>, desk: &Desk, t: &Target) -> Option<Step> {
    let owner = desk.handed.locked().remove(&t.uid)?;
    let _ = how.notes.send(Note::Surged {
        pod: t.reference(),
        owner,
    });
    Some(Step::Over(Surged::Done))
}

/// A surge registered at its owner's desk for as long as it runs: a
/// look that adds surges to the owner's record adds it too, if there is
/// room ([`join`]), in the same write.
struct Joining {
    desk: Arc<Desk>,
    uid: String,
}

impl Joining {
    fn at(desk: &Arc<Desk>, entry: Entry) -> Joining {
        let uid = entry.uid.clone();
        desk.joining.locked().insert(uid.clone(), entry);
        Joining {
            desk: desk.clone(),
            uid,
        }
    }
}

impl Drop for Joining {
    fn drop(&mut self) {
        self.desk.joining.locked().remove(&self.uid);
        self.desk.handed.locked().remove(&self.uid);
    }
}

/// A surge whose replacement is Ready and whose budgets allow it to
/// leave, waiting for the look that hands it over.
struct Handing {
    entry: Entry,
    told: tokio::sync::oneshot::Sender<Handed>,
}

/// What the look that took a [`Handing`] did with it.
enum Handed {
    /// Claimed in the owner's record: the owner removes the pod.
    Claimed { owner: String },
    /// Not handed over (the owner changed, or fewer replacements are Ready
    /// than pods waiting): look again.
    Again,
}

/// Hands the pod `t` over, its budgets' `permit` in hand: it waits at the
/// desk with the other pods ready to leave, and whichever of them gets the
/// turn first claims them all in one write of the owner and lowers its
/// replicas once for all ([`lead`]): an owner's pods leave in one round
/// of writes, not one after another. Each pod's own permit is told the
/// answer by its own surge.
async fn hand_over(
    how: Removal<'_>,
    desk: &Desk,
    t: &Target,
    permit: super::budgets::Permit<'_>,
) -> kube::Result<Step> {
    let (told, mut answer) = tokio::sync::oneshot::channel();
    desk.handing.locked().push(Handing {
        entry: entry(how, t),
        told,
    });
    let led = tokio::select! {
        handed = &mut answer => {
            handed.ok()
        }
        turn = desk.turn.lock() => {
            let led = match answer.try_recv() {
                Ok(handed) => Ok(Some(handed)),
                // No look took it: this one takes every pod waiting.
                Err(_) => lead(how, desk, &t.namespace).await.map(|()| answer.try_recv().ok()),
            };
            drop(turn);
            match led {
                Ok(handed) => handed,
                Err(e) => {
                    permit.failed();
                    return Err(e);
                }
            }
        }
    };
    match led {
        Some(Handed::Claimed { owner }) => {
            permit.replaced();
            let _ = how.notes.send(Note::Surged {
                pod: t.reference(),
                owner,
            });
            Ok(Step::Over(Surged::Done))
        }
        Some(Handed::Again) | None => {
            permit.failed();
            Ok(Step::Waiting(waiting_replacement(t, &desk.found)))
        }
    }
}

fn waiting_replacement(t: &Target, owner: &Owner) -> String {
    format!(
        "surging pod {}: waiting for a Ready replacement from {}",
        t.key(),
        owner.shown()
    )
}

/// In the turn: claims every pod waiting at the desk to leave that a
/// Ready replacement stands for, in one write of the owner's record, tells
/// each, then sets their deletion cost and lowers the replicas once
/// ([`finish`]). The pods it cannot claim are told to look again. With
/// them go the owner's other surging pods whose surges run here and
/// whose budgets allow their removal now ([`adopt`]): pods whose
/// replacements became Ready together leave together, not in as many
/// rounds as their surges took turns to look.
async fn lead(how: Removal<'_>, desk: &Desk, namespace: &str) -> kube::Result<()> {
    let waiting = std::mem::take(&mut *desk.handing.locked());
    let read = desk.read(how.client, namespace).await;
    let (mut owner, pods) = match read {
        Ok(read) => read,
        Err(e) => {
            tell(waiting, |_| false, "");
            return Err(e);
        }
    };
    let Some(mut record) = owner.record().filter(|r| owner.replicas() == r.expected()) else {
        tell(waiting, |_| false, "");
        return Ok(());
    };
    let entries: Vec<&str> = record.entries().map(|e| e.uid.as_str()).collect();
    let replacements = serving(&pods, &entries).saturating_sub(record.serving);
    let mut claimed: Vec<Entry> = waiting
        .iter()
        .map(|h| &h.entry)
        .filter(|e| record.surging.iter().any(|s| s.uid == e.uid))
        .take(replacements)
        .cloned()
        .collect();
    let mut adopted = adopt(how, desk, &record, &pods, &waiting);
    adopted.truncate(replacements.saturating_sub(claimed.len()));
    claimed.extend(adopted.iter().map(|(e, _)| e.clone()));
    let leaving: Vec<&str> = record
        .leaving
        .iter()
        .chain(&claimed)
        .map(|e| e.uid.as_str())
        .collect();
    // The ReplicaSet controller removes a not-Ready pod before the ones
    // with the lowest deletion cost: every pod it keeps but these must be
    // Ready, and a raise it has not acted on yet must have been.
    let ready = (live(&pods) as i64) >= record.expected() && others_ready(&pods, &leaving);
    if claimed.is_empty() || !ready {
        tell(waiting, |_| false, "");
        return Ok(());
    }
    record
        .surging
        .retain(|e| !claimed.iter().any(|c| c.uid == e.uid));
    record.serving = record.serving.saturating_add(claimed.len());
    record.leaving.extend(claimed.iter().cloned());
    let written = owner.write(record.expected(), Some(&record)).await;
    desk.wrote(&owner).await;
    if let Err(e) = written {
        tell(waiting, |_| false, "");
        return Err(e);
    }
    let shown = owner.shown();
    {
        let mut handed = desk.handed.locked();
        for (e, permit) in adopted {
            permit.replaced();
            handed.insert(e.uid, shown.clone());
        }
    }
    tell(waiting, |e| claimed.iter().any(|c| c.uid == e.uid), &shown);
    finish(how.client, desk, &mut owner, record).await
}

/// The owner's surging pods, other than those `waiting`, whose surges run
/// in this process (they are told through the desk's `handed`) and whose
/// budgets allow their removal at once: each with its permit, taken here.
fn adopt<'a>(
    how: Removal<'a>,
    desk: &Desk,
    record: &Record,
    pods: &[Arc<Pod>],
    waiting: &[Handing],
) -> Vec<(Entry, super::budgets::Permit<'a>)> {
    let here = desk.joining.locked();
    record
        .surging
        .iter()
        .filter(|e| here.contains_key(&e.uid) && !waiting.iter().any(|h| h.entry.uid == e.uid))
        .filter_map(|e| {
            let pod = pods
                .iter()
                .find(|p| p.metadata.uid.as_deref() == Some(&e.uid))?;
            let permit = how.budgets.try_permit(
                Via::HandOver,
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                &pod.name_any(),
                pod.metadata.labels.as_ref().unwrap_or(&Default::default()),
                how.retries.budget_timings(),
            )?;
            Some((e.clone(), permit))
        })
        .collect()
}

/// Tells each waiting pod whether it was claimed (`claimed`).
fn tell(waiting: Vec<Handing>, claimed: impl Fn(&Entry) -> bool, owner: &str) {
    for h in waiting {
        let handed = if claimed(&h.entry) {
            Handed::Claimed {
                owner: owner.to_owned(),
            }
        } else {
            Handed::Again
        };
        let _ = h.told.send(handed);
    }
}

/// This pod's record entry.
fn entry(how: Removal<'_>, t: &Target) -> Entry {
    Entry {
        pod: t.key(),
        uid: t.uid.clone(),
        maintenance: how.maintenance.to_owned(),
    }
}

/// The surges registered at the desk, other than `t` and those `record`
/// has, whose pods the owner still has: the ones a raise may add with
/// `t`'s, by pod name.
fn others_joining(
    desk: &Desk,
    t: &Target,
    pods: &[Arc<Pod>],
    record: Option<&Record>,
) -> Vec<Entry> {
    let present: Vec<&str> = kept(pods)
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    let mut others: Vec<Entry> = desk
        .joining
        .locked()
        .values()
        .filter(|e| e.uid != t.uid && present.contains(&e.uid.as_str()))
        .filter(|e| record.is_none_or(|r| !r.entries().any(|x| x.uid == e.uid)))
        .cloned()
        .collect();
    others.sort_by(|a, b| a.pod.cmp(&b.pod));
    others
}

/// Whether the pod `uid` serves (Ready, staying): it is counted in a
/// record's `serving` until it joins.
fn serves(pods: &[Arc<Pod>], uid: &str) -> bool {
    serving(pods, &[uid]) < serving(pods, &[])
}

/// The first surges of an owner with none running: its replicas as found
/// are what the surges end with, and its other Ready pods as found what
/// each replacement is counted above. Every surge of the owner waiting at
/// the desk starts with `t`, as many as its `maxSurge` allows.
async fn start(
    how: Removal<'_>,
    desk: &Desk,
    t: &Target,
    owner: &mut Owner,
    pods: &[Arc<Pod>],
) -> kube::Result<Step> {
    if let Some(why) = owner.refuses_surge() {
        return Ok(Step::Over(Surged::Evict(why)));
    }
    if owner.settling() || catching_up(pods, owner.replicas()) {
        return Ok(Step::Waiting(busy(t, owner)));
    }
    let room = owner.max_surge(owner.replicas()).max(1);
    let mut surging = vec![entry(how, t)];
    surging.extend(
        others_joining(desk, t, pods, None)
            .into_iter()
            .take(room - 1),
    );
    let uids: Vec<&str> = surging.iter().map(|e| e.uid.as_str()).collect();
    let record = Record {
        replicas: owner.replicas(),
        serving: serving(pods, &uids),
        surging: Vec::new(),
        leaving: Vec::new(),
    };
    let record = Record { surging, ..record };
    raise(t, owner, &record, record.surging.len()).await
}

/// Writes `record` (with the last `added` entries just added, `t`'s
/// first of them) and the replicas they add.
async fn raise(t: &Target, owner: &mut Owner, record: &Record, added: usize) -> kube::Result<Step> {
    owner.write(record.expected(), Some(record)).await?;
    let new = &record.surging[record.surging.len().saturating_sub(added)..];
    for e in new {
        tracing::info!(pod = %e.pod, owner = %owner.shown(), replicas = record.expected(), "surge: one more replica");
    }
    Ok(Step::Waiting(format!(
        "surging pod {}: {} raised to {} replicas",
        t.key(),
        owner.shown(),
        record.expected()
    )))
}

/// Joins the owner's running surges if its `maxSurge` leaves room, with
/// every other surge waiting at the desk that fits; surges whose pod is
/// gone are undone first, and while there is no room, those whose
/// maintenance is gone.
async fn join(
    how: Removal<'_>,
    desk: &Desk,
    t: &Target,
    owner: &mut Owner,
    mut record: Record,
    pods: &[Arc<Pod>],
) -> kube::Result<Step> {
    let present: Vec<&str> = pods
        .iter()
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    let mut undone = record.prune(|e| !present.contains(&e.uid.as_str()));
    if undone == 0 && record.len() >= owner.max_surge(record.replicas) {
        let mut ended = Vec::new();
        for e in record.entries() {
            if !ended.contains(&e.maintenance)
                && !maintenance_alive(how.client, &e.maintenance).await?
            {
                ended.push(e.maintenance.clone());
            }
        }
        undone = record.prune(|e| ended.contains(&e.maintenance));
    }
    if undone > 0 {
        owner.write(record.expected(), record.kept()).await?;
        return Ok(Step::Waiting(format!(
            "surging pod {}: undid a stale surge of {}",
            t.key(),
            owner.shown()
        )));
    }
    // Not while a pod is being handed over: a replacement starting now
    // would be the pod the lowered replicas remove (not Ready ranks first).
    // Nor while a lowering is not yet acted on (more pods than replicas):
    // a raise now would be folded into it, and the handed-over pod stay.
    // A raise not yet acted on is no reason to wait: the ReplicaSet
    // controller makes both pods.
    let room = owner
        .max_surge(record.replicas)
        .saturating_sub(record.len());
    if room == 0 || !record.leaving.is_empty() || live(pods) as i64 > record.expected() {
        return Ok(Step::Waiting(busy(t, owner)));
    }
    if record.expected() >= i64::from(i32::MAX) {
        return Ok(Step::Over(Surged::Evict(format!(
            "{} has {} replicas: one more is past what spec.replicas holds",
            owner.shown(),
            record.expected()
        ))));
    }
    let fits = usize::try_from(i64::from(i32::MAX) - record.expected()).unwrap_or(1);
    let mut added = vec![entry(how, t)];
    added.extend(others_joining(desk, t, pods, Some(&record)));
    added.truncate(room.min(fits));
    let n = added.len();
    for e in added {
        if serves(pods, &e.uid) {
            record.serving = record.serving.saturating_sub(1);
        }
        record.surging.push(e);
    }
    raise(t, owner, &record, n).await
}

/// The last steps of the pods `record` has leaving (claimed): each gets
/// the lowest deletion cost, then the owner their replicas back in one
/// write (the ReplicaSet controller removes exactly these pods).
async fn finish(
    client: &Client,
    desk: &Desk,
    owner: &mut Owner,
    mut record: Record,
) -> kube::Result<()> {
    let namespace = owner.object.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let cost = json!({"metadata": {"annotations": {DELETION_COST: i32::MIN.to_string()}}});
    let patch = Patch::Merge(&cost);
    let params = PatchParams::default();
    let patches = record.leaving.iter().map(|e| {
        let name = e.pod.rsplit_once('/').map_or(e.pod.as_str(), |(_, n)| n);
        pods.patch(name, &params, &patch)
    });
    for patched in futures::future::join_all(patches).await {
        match patched {
            Ok(pod) => desk.wrote_pod(&pod),
            // Gone already: the replica comes back all the same.
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let gone = std::mem::take(&mut record.leaving);
    let replicas = record.expected();
    let lowered = owner.write(replicas, record.kept()).await;
    desk.wrote(owner).await;
    lowered?;
    for e in gone {
        tracing::info!(pod = %e.pod, owner = %owner.shown(), replicas, "surge: replacement Ready; the owner removes the pod");
    }
    Ok(())
}

/// Whether the maintenance `name` exists and is not being deleted: a
/// surge it holds still has a reason to.
async fn maintenance_alive(client: &Client, name: &str) -> kube::Result<bool> {
    let nms: Api<crate::crd::NodeMaintenance> = Api::all(client.clone());
    Ok(nms
        .get_opt(name)
        .await?
        .is_some_and(|m| m.metadata.deletion_timestamp.is_none()))
}

/// Undoes every surge the maintenance `name` holds (it is being deleted,
/// or its drain ended): each owner with its pods in the record gets their
/// replicas back (the others' surges go on), or keeps the replicas
/// someone else set meanwhile. The owners are those this process
/// remembers surging for it (found by name, whatever was done to their
/// annotation or label), and those labelled as surged (a surge of an
/// operator that ran before this one).
pub async fn release(client: &Client, desks: &Desks, name: &str) -> kube::Result<usize> {
    let memory = desks.memory();
    let mut undone = 0;
    let mut seen: Vec<String> = Vec::new();
    for (uid, r) in memory.holding(name) {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &r.namespace, &r.kind.resource());
        match api.get_opt(&r.name).await? {
            Some(object) if object.uid().as_deref() == Some(uid.as_str()) => {
                let mut owner = Owner::of(client, &r.namespace, r.kind, object, memory);
                undone += release_on(&mut owner, name).await?;
            }
            // Gone (or another object of its name): nothing to give back.
            _ => memory.forget(&uid),
        }
        seen.push(uid);
    }
    for kind in [Kind::Deployment, Kind::ReplicaSet] {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &kind.resource());
        for object in api
            .list(&ListParams::default().labels(SURGE_LABEL))
            .await?
            .items
        {
            if seen.contains(&object.uid().unwrap_or_default()) {
                continue;
            }
            let ns = object.namespace().unwrap_or_default();
            let mut owner = Owner::of(client, &ns, kind, object, memory);
            undone += release_on(&mut owner, name).await?;
        }
    }
    Ok(undone)
}

/// Undoes the surges of the maintenance `name` on `owner`; how many.
async fn release_on(owner: &mut Owner, name: &str) -> kube::Result<usize> {
    let Some(mut r) = owner.record() else {
        // A record naming the maintenance that no surge could have left so
        // (its replicas set by someone else since): theirs stand, and the
        // record and label go.
        let stale = owner
            .object
            .annotations()
            .get(SURGE_ANNOTATION)
            .and_then(|t| Record::parse(t))
            .is_some_and(|r| r.entries().any(|e| e.maintenance == name));
        if stale {
            owner.write(owner.replicas(), None).await?;
        }
        return Ok(0);
    };
    let before = r.expected();
    let n = r.prune(|e| e.maintenance == name);
    if n == 0 {
        return Ok(0);
    }
    if owner.replicas() == before {
        owner.write(r.expected(), r.kept()).await?;
    } else {
        owner.write(owner.replicas(), None).await?;
    }
    tracing::info!(logger = "controller", owner = %owner.shown(), replicas = owner.replicas(), nodeMaintenance = %name, "surge undone");
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::refusal;
    use serde_json::json;

    /// A ReplicaSet (or Deployment) at the int32 limit is not surged: one
    /// more replica would be written as 2147483648.
    #[test]
    fn no_surge_past_what_spec_replicas_holds() {
        let at_limit = json!({"spec": {"replicas": 2147483647}});
        assert!(
            refusal("ReplicaSet", &at_limit, "ReplicaSet/big")
                .is_some_and(|why| why.contains("2147483647 replicas"))
        );
        assert!(refusal("Deployment", &at_limit, "Deployment/big").is_some());
        // A count no API server holds reads as 0 (the bounded reader
        // clamps it): one more fits.
        let negative = json!({"spec": {"replicas": -3}});
        assert_eq!(refusal("ReplicaSet", &negative, "ReplicaSet/odd"), None);
        let fine = json!({"spec": {"replicas": 2147483646}});
        assert_eq!(refusal("ReplicaSet", &fine, "ReplicaSet/big"), None);
        let recreate = json!({"spec": {"replicas": 1, "strategy": {"type": "Recreate"}}});
        assert!(refusal("Deployment", &recreate, "Deployment/r").is_some());
    }
}
