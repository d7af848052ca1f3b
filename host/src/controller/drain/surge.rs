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

/// The workload whose replicas a surge raises.
#[derive(Clone)]
struct Owner {
    api: Api<DynamicObject>,
    kind: Kind,
    object: DynamicObject,
    /// This look wrote the owner (or a pod of it): the desk's read is
    /// stale.
    wrote: bool,
    /// What this process's surges wrote on owners: the record trusted.
    memory: Arc<SurgeMemory>,
}

impl Owner {
    /// Owner `object`, of `kind`, in `namespace`.
    fn of(
        client: &Client,
        namespace: &str,
        kind: Kind,
        object: DynamicObject,
        memory: &Arc<SurgeMemory>,
    ) -> Owner {
        Owner {
            api: Api::namespaced_with(client.clone(), namespace, &kind.resource()),
            kind,
            object,
            wrote: false,
            memory: memory.clone(),
        }
    }

    fn shown(&self) -> String {
        format!("{}/{}", self.kind, self.object.name_any())
    }

    fn replicas(&self) -> i64 {
        replicas_of(&self.object.data)
    }

    /// The owner's surge record: as this process last wrote it, whatever
    /// the owner's annotation now says (rewritten or removed by a tool
    /// that owns annotations, forged); the annotation only when this
    /// process has written none (a surge resumed after a restart), and
    /// only if a surge could have left it so: its count is the owner's
    /// replicas, and the owner carries the surge label naming one of its
    /// maintenances. Anything else there is not a surge of ours: a new
    /// surge starts from the replicas as they stand.
    /// The owner's surge record, as far as it is trusted
    /// ([`SurgeMemory::trusted`]; a record naming a maintenance since
    /// deleted is still one to undo, so every name counts as live here).
    fn record(&self) -> Option<Record> {
        let found = Found {
            uid: self.object.metadata.uid.as_deref().unwrap_or_default(),
            annotation: self
                .object
                .annotations()
                .get(SURGE_ANNOTATION)
                .map(String::as_str),
            label: self.object.labels().get(SURGE_LABEL).map(String::as_str),
            replicas: self.replicas(),
        };
        self.memory.trusted(found, &|_: &str| true)
    }

    fn selector(&self) -> Option<String> {
        let s: LabelSelector =
            serde_json::from_value(self.object.data["spec"]["selector"].clone()).ok()?;
        let s = kube::core::Selector::try_from(s).ok()?;
        Some(s.to_string())
    }

    /// Why the owner's rules allow no extra pod, if they do not.
    fn refuses_surge(&self) -> Option<String> {
        refusal(self.kind.name(), &self.object.data, &self.shown())
    }

    /// How many pods of the owner may surge at once: a Deployment's
    /// `maxSurge` resolved against its replicas before the surges
    /// (`replicas`), as its own rollouts resolve it; one for a bare
    /// ReplicaSet, which has no strategy.
    fn max_surge(&self, replicas: i64) -> usize {
        if self.kind != Kind::Deployment {
            return 1;
        }
        usize::try_from(deployment_max_surge(&self.object.data, replicas)).unwrap_or(0)
    }

    /// A Deployment whose controller has not caught up, or that is rolling
    /// out: its ReplicaSets are about to change.
    fn settling(&self) -> bool {
        if self.kind != Kind::Deployment {
            return false;
        }
        let d = &self.object.data;
        let generation = self.object.metadata.generation.unwrap_or(0);
        let observed = d["status"]["observedGeneration"].as_i64().unwrap_or(0);
        let replicas = d["spec"]["replicas"].as_i64().unwrap_or(1);
        let updated = d["status"]["updatedReplicas"].as_i64().unwrap_or(0);
        observed < generation
            || updated < replicas.min(d["status"]["replicas"].as_i64().unwrap_or(0))
    }

    /// Writes replicas, annotation and label in one patch that holds only
    /// if the owner is as read where a surge cares: its spec (the
    /// generation) and its surge record, whatever its controller wrote to
    /// its status since (a JSON patch's `test`s; a status written every
    /// few milliseconds would refuse a write conditioned on the whole
    /// object). An owner without a generation, annotations or labels to
    /// test against is written on its resourceVersion instead. A refusal
    /// is a conflict (409) either way; the owner is then as written. The
    /// label names a maintenance with a surge there (the record names them
    /// all).
    async fn write(&mut self, replicas: i64, record: Option<&Record>) -> kube::Result<()> {
        let name = self.object.name_any();
        let params = PatchParams::default();
        let written = match self.tested_patch(replicas, record) {
            Some(ops) => {
                self.api
                    .patch(&name, &params, &Patch::Json::<()>(ops))
                    .await
            }
            None => {
                let patch = json!({
                    "metadata": {
                        "resourceVersion": self.object.resource_version(),
                        "annotations": {SURGE_ANNOTATION: record.map(record_text)},
                        "labels": {SURGE_LABEL: surge_label(record)},
                    },
                    "spec": {"replicas": replicas},
                });
                self.api.patch(&name, &params, &Patch::Merge(&patch)).await
            }
        };
        let written = written.inspect(|object| {
            self.memory.wrote(
                &object.uid().unwrap_or_default(),
                Remembered {
                    kind: self.kind,
                    namespace: object.namespace().unwrap_or_default(),
                    name: object.name_any(),
                    record: record.cloned().unwrap_or_else(Record::none),
                },
            );
        });
        self.object = written.map_err(|e| match e {
            // A test that failed: the owner changed since it was read.
            kube::Error::Api(s) if s.code == 422 => kube::Error::Api(
                kube::core::Status::failure(
                    &format!("{} changed since it was read", self.shown()),
                    "Conflict",
                )
                .with_code(409)
                .boxed(),
            ),
            e => e,
        })?;
        self.wrote = true;
        Ok(())
    }

    /// The JSON patch of [`Owner::write`], if the owner as read has what
    /// its tests need.
    fn tested_patch(&self, replicas: i64, record: Option<&Record>) -> Option<json_patch::Patch> {
        let meta = &self.object.metadata;
        let (annotations, labels) = (meta.annotations.as_ref()?, meta.labels.as_ref()?);
        let pointer = |map: &str, key: &str| {
            format!(
                "/metadata/{map}/{}",
                key.replace('~', "~0").replace('/', "~1")
            )
        };
        let (annotation, label) = (
            pointer("annotations", SURGE_ANNOTATION),
            pointer("labels", SURGE_LABEL),
        );
        let mut ops = vec![
            json!({"op": "test", "path": "/metadata/generation", "value": meta.generation?}),
            json!({"op": "test", "path": annotation, "value": annotations.get(SURGE_ANNOTATION)}),
            json!({"op": "add", "path": "/spec/replicas", "value": replicas}),
        ];
        match record.map(record_text) {
            Some(text) => ops.push(json!({"op": "add", "path": annotation, "value": text})),
            None if annotations.contains_key(SURGE_ANNOTATION) => {
                ops.push(json!({"op": "remove", "path": annotation}));
            }
            None => {}
        }
        match surge_label(record) {
            Some(m) => ops.push(json!({"op": "add", "path": label, "value": m})),
            None if labels.contains_key(SURGE_LABEL) => {
                ops.push(json!({"op": "remove", "path": label}));
            }
            None => {}
        }
        serde_json::from_value(Value::Array(ops)).ok()
    }
}

fn record_text(record: &Record) -> String {
    serde_json::to_string(record).unwrap_or_default()
}

/// The surge label's value for `record`: a maintenance it names.
fn surge_label(record: Option<&Record>) -> Option<String> {
    record
        .and_then(|r| r.entries().next())
        .map(|e| e.maintenance.clone())
}

/// Why an owner of `kind` with `data` (its object, as JSON) allows no
/// extra pod, if it does not; `shown` names it.
fn refusal(kind: &str, data: &Value, shown: &str) -> Option<String> {
    let replicas = replicas_of(data);
    // spec.replicas is an int32: one more than its largest is no replica
    // count the API server takes.
    if replicas >= i64::from(i32::MAX) || replicas < 0 {
        return Some(format!(
            "{shown} has {replicas} replicas: one more is past what spec.replicas holds"
        ));
    }
    if kind != "Deployment" {
        return None;
    }
    if data["spec"]["strategy"]["type"].as_str() == Some("Recreate") {
        return Some(format!(
            "{shown} uses the Recreate strategy: it never runs an extra pod"
        ));
    }
    (deployment_max_surge(data, replicas) < 1)
        .then(|| format!("{shown} has maxSurge 0: it allows no extra pod"))
}

/// The owner whose replicas to raise for a pod of the ReplicaSet `rs`:
/// its Deployment, or the ReplicaSet itself.
async fn owner(
    client: &Client,
    namespace: &str,
    rs: &str,
    memory: &Arc<SurgeMemory>,
) -> kube::Result<Owner> {
    let read = |kind: Kind| {
        Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &kind.resource())
    };
    let set = read(Kind::ReplicaSet).get(rs).await?;
    let deployment = set
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == Kind::Deployment.name())
        .map(|o| o.name.clone());
    Ok(match deployment {
        Some(name) => {
            let object = read(Kind::Deployment).get(&name).await?;
            Owner::of(client, namespace, Kind::Deployment, object, memory)
        }
        None => Owner::of(client, namespace, Kind::ReplicaSet, set, memory),
    })
}

/// The owner's pods (by its selector), as one look sees them.
async fn owner_pods(client: &Client, namespace: &str, selector: &str) -> kube::Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    Ok(pods
        .list(&ListParams::default().labels(selector))
        .await?
        .items)
}

/// The owner's pods that serve and stay: Ready, not terminating, not
/// leaving (the lowest deletion cost: a surge gave it to them), and not
/// among `except` (uids).
fn serving(pods: &[Arc<Pod>], except: &[&str]) -> usize {
    let lowest = i32::MIN.to_string();
    pods.iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.annotations().get(DELETION_COST) != Some(&lowest)
                && !except.contains(&p.uid().as_deref().unwrap_or_default())
                && crate::policy::convert::pod_ready(p)
        })
        .count()
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

/// The owners being surged, each with its [`Desk`]: every surge of one
/// owner, whatever its maintenance, shares one watch of it and one read
/// per change of it.
#[derive(Default)]
pub(crate) struct Desks {
    slots: std::sync::Mutex<HashMap<(String, String), Slot>>,
    /// What the surges of this process wrote on owners.
    memory: Arc<SurgeMemory>,
}

/// Where one owner's desk is found: opened by the first surge that needs
/// it while the others of the owner wait, so a hundred surges starting at
/// once find the owner once, not a hundred times.
type Slot = Arc<tokio::sync::Mutex<Weak<Desk>>>;

impl std::fmt::Debug for Desks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Desks")
    }
}

impl Desks {
    /// The desk of the ReplicaSet `rs`'s owner, opened (its watch started)
    /// by the first surge that needs it; it closes when the last one ends.
    async fn open(&self, client: &Client, namespace: &str, rs: &str) -> kube::Result<Arc<Desk>> {
        let slot = self.slot((namespace.to_owned(), rs.to_owned()));
        let mut desk = slot.lock().await;
        if let Some(open) = desk.upgrade() {
            return Ok(open);
        }
        let found = owner(client, namespace, rs, &self.memory).await?;
        let open = Arc::new(Desk::watching(client, namespace, &found));
        *desk = Arc::downgrade(&open);
        Ok(open)
    }

    /// What the surges of this process wrote on owners.
    pub(crate) fn memory(&self) -> &Arc<SurgeMemory> {
        &self.memory
    }

    /// The slot of `key`; the slots of closed desks no one is opening go.
    fn slot(&self, key: (String, String)) -> Slot {
        let mut map = self.slots.locked();
        map.retain(|_, slot| {
            Arc::strong_count(slot) > 1 || slot.try_lock().map_or(true, |d| d.strong_count() > 0)
        });
        map.entry(key).or_default().clone()
    }
}

/// One read of an owner and its pods, and the change count it was read
/// at.
type Read = (u64, Owner, Arc<[Arc<Pod>]>);

/// One owner's surges' shared view: its watch (the owner by name, its
/// pods by selector, through kube-runtime's watcher) counts changes, and
/// a look reads the owner and its pods once per change, for every surge
/// waiting on it: a hundred pods of one owner waiting for their
/// replacements make one read per change, not a hundred, and none while
/// nothing changes. While the watch fails (an RBAC that does not let the
/// operator watch the owner's kind, an API outage) the count moves every
/// [`POLL`] instead.
struct Desk {
    /// Changes seen; none when the owner's selector cannot be read (each
    /// look then reads afresh, and evicts).
    changes: Option<tokio::sync::watch::Receiver<u64>>,
    /// The owner and its pods as the watch shows them.
    view: Option<Arc<View>>,
    /// The last read, and the change count it was read at.
    last: tokio::sync::Mutex<Option<Read>>,
    /// Held by the surge whose look it is.
    turn: tokio::sync::Mutex<()>,
    /// Every surge of the owner running here, by its pod's uid.
    joining: std::sync::Mutex<HashMap<String, Entry>>,
    /// The pods waiting to be handed over.
    handing: std::sync::Mutex<Vec<Handing>>,
    /// Pods another surge's look handed over with its own (by uid), and
    /// the owner as it names it: their own surges end at their next look.
    handed: std::sync::Mutex<HashMap<String, String>>,
    /// The owner as first found (its API, kind and name: a look reads it
    /// again by name, without the ReplicaSet in between).
    found: Owner,
    _watch: Option<crate::task::Owned<()>>,
}

impl Desk {
    fn watching(client: &Client, namespace: &str, owner: &Owner) -> Desk {
        use futures::StreamExt;
        use kube::runtime::{reflector, watcher};
        let Some(selector) = owner.selector() else {
            return Desk::of(owner, None, None, None);
        };
        let (view, owner_writer, pods_writer) = View::new(owner.kind.resource());
        let view = Arc::new(view);
        let config = || watcher::Config::default().timeout(crate::client::WATCH_TIMEOUT_SECS);
        let by_name = config().fields(&format!("metadata.name={}", owner.object.name_any()));
        let itself = reflector(owner_writer, watcher(owner.api.clone(), by_name))
            .map(|e| e.map(|e| Shown::of(OWNER, &e)).ok());
        let pods = reflector(
            pods_writer,
            watcher(
                Api::<Pod>::namespaced(client.clone(), namespace),
                config().labels(&selector),
            ),
        )
        .map(|e| e.map(|e| Shown::of(PODS, &e)).ok());
        let mut events = futures::stream::select(itself, pods).boxed();
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let shown = view.clone();
        let watch = crate::task::spawn(async move {
            use futures::FutureExt;
            loop {
                match events.next().await {
                    Some(Some(s)) => shown.saw(s),
                    // The watch failed (the watcher tries again itself).
                    Some(None) | None => tokio::time::sleep(POLL).await,
                }
                // What else arrived with it is the same change.
                while let Some(Some(e)) = events.next().now_or_never() {
                    if let Some(s) = e {
                        shown.saw(s);
                    }
                }
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        });
        Desk::of(owner, Some(rx), Some(view), Some(watch))
    }

    fn of(
        owner: &Owner,
        changes: Option<tokio::sync::watch::Receiver<u64>>,
        view: Option<Arc<View>>,
        watch: Option<crate::task::Owned<()>>,
    ) -> Desk {
        Desk {
            changes,
            view,
            last: tokio::sync::Mutex::new(None),
            turn: tokio::sync::Mutex::new(()),
            joining: std::sync::Mutex::new(HashMap::new()),
            handing: std::sync::Mutex::new(Vec::new()),
            handed: std::sync::Mutex::new(HashMap::new()),
            found: owner.clone(),
            _watch: watch,
        }
    }

    /// The changes seen so far (a look taken now is at least this fresh).
    fn seen(&self) -> u64 {
        self.changes.as_ref().map_or(0, |c| *c.borrow())
    }

    /// The owner and its pods as of the latest change: as the watch shows
    /// them once it shows every write this process made to them (a look
    /// then costs no request), else read once per change, the owner before
    /// its pods (a surge another look finished since is in the record as
    /// leaving, or its pod carries the lowest cost), and shared by the
    /// surges looking at that change.
    async fn read(
        &self,
        client: &Client,
        namespace: &str,
    ) -> kube::Result<(Owner, Arc<[Arc<Pod>]>)> {
        if let Some(shown) = self.shown().await {
            return Ok(shown);
        }
        let at = self.seen();
        let mut last = self.last.lock().await;
        if let Some((seen, owner, pods)) = last.as_ref()
            && *seen == at
            && self.changes.is_some()
        {
            return Ok((owner.clone(), pods.clone()));
        }
        let mut owner = self.found.clone();
        owner.object = owner.api.get(&self.found.object.name_any()).await?;
        let pods: Arc<[Arc<Pod>]> = match owner.selector() {
            Some(selector) => owner_pods(client, namespace, &selector)
                .await?
                .into_iter()
                .map(Arc::new)
                .collect(),
            None => Arc::from([]),
        };
        *last = Some((at, owner.clone(), pods.clone()));
        Ok((owner, pods))
    }

    /// The owner and its pods as the watch shows them, once it shows this
    /// process's last writes: waited for up to [`POLL`] (the watch is
    /// usually a few milliseconds behind a write); `None` when it does not
    /// catch up by then, is not listed yet, or is failing.
    async fn shown(&self) -> Option<(Owner, Arc<[Arc<Pod>]>)> {
        let view = self.view.as_ref()?;
        let mut changes = self.changes.clone()?;
        if !view.current() {
            let caught_up = changes.wait_for(|_| view.current());
            tokio::time::timeout(POLL, caught_up).await.ok()?.ok()?;
        }
        let object = view.owner.state().into_iter().next()?;
        let owner = Owner {
            object: (*object).clone(),
            wrote: false,
            ..self.found.clone()
        };
        let pods: Arc<[Arc<Pod>]> = view.pods.state().into();
        Some((owner, pods))
    }

    /// This process wrote the pod `pod` (as it now is): the next read
    /// shows it.
    fn wrote_pod(&self, pod: &Pod) {
        if let Some(view) = &self.view {
            view.wrote(PODS, &pod.metadata);
        }
    }

    /// This process wrote the owner (as `owner` now is): the next read
    /// shows it.
    async fn wrote(&self, owner: &Owner) {
        if let Some(view) = &self.view {
            view.wrote(OWNER, &owner.object.metadata);
        }
        *self.last.lock().await = None;
    }

    /// Waits for a change after `seen`, for the pod `uid` to leave the
    /// node, or for `deadline`.
    async fn next(&self, seen: u64, deadline: Instant, state: &Attempt, uid: &str) {
        let changed = async {
            let Some(mut changes) = self.changes.clone() else {
                return tokio::time::sleep(POLL).await;
            };
            if changes.wait_for(|n| *n != seen).await.is_err() {
                tokio::time::sleep(POLL).await;
            }
        };
        let gone = async {
            loop {
                let notified = state.changed.notified();
                if !state.has(uid).await {
                    return;
                }
                notified.await;
            }
        };
        tokio::select! {
            () = changed => {}
            () = gone => {}
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// The owner's watch, in [`View`]'s counts.
const OWNER: usize = 0;
/// The pods' watch.
const PODS: usize = 1;

/// What one event of a watch showed: the resourceVersion of its object,
/// or that a list ended.
#[derive(Clone, Copy)]
enum Shown {
    Version(usize, u64),
    Listed(usize),
    Nothing,
}

impl Shown {
    fn of<K: kube::Resource>(watch: usize, e: &kube::runtime::watcher::Event<K>) -> Shown {
        use kube::runtime::watcher::Event;
        match e {
            Event::Apply(o) | Event::Delete(o) | Event::InitApply(o) => {
                version(o.meta()).map_or(Shown::Nothing, |v| Shown::Version(watch, v))
            }
            Event::InitDone => Shown::Listed(watch),
            Event::Init => Shown::Nothing,
        }
    }
}

/// A resourceVersion as the number the API server makes of it (etcd's
/// revision); `None` for one that is not, and then the watch is never
/// taken to show a write and every look reads.
fn version(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<u64> {
    meta.resource_version.as_deref()?.parse().ok()
}

/// The owner and its pods as the desk's watch shows them (kube-runtime's
/// reflector stores), and how far it has shown: a look reads them instead
/// of the API server once they show every write this process made.
struct View {
    owner: kube::runtime::reflector::Store<DynamicObject>,
    pods: kube::runtime::reflector::Store<Pod>,
    /// Per watch: the newest resourceVersion shown.
    seen: [std::sync::atomic::AtomicU64; 2],
    /// Per watch: a list has completed (the store holds every object).
    listed: [std::sync::atomic::AtomicBool; 2],
    /// Per watch: the newest resourceVersion this process wrote;
    /// `u64::MAX` once one was not a number.
    written: [std::sync::atomic::AtomicU64; 2],
}

impl View {
    /// An empty view of an owner of `resource`, and the stores' writers
    /// for its watches.
    fn new(resource: ApiResource) -> (View, Writer<DynamicObject>, Writer<Pod>) {
        let owner = Writer::new(resource);
        let pods = Writer::<Pod>::default();
        let view = View {
            owner: owner.as_reader(),
            pods: pods.as_reader(),
            seen: Default::default(),
            listed: Default::default(),
            written: Default::default(),
        };
        (view, owner, pods)
    }

    fn saw(&self, shown: Shown) {
        use std::sync::atomic::Ordering::SeqCst;
        match shown {
            Shown::Version(w, v) => {
                self.seen[w].fetch_max(v, SeqCst);
            }
            Shown::Listed(w) => self.listed[w].store(true, SeqCst),
            Shown::Nothing => {}
        }
    }

    fn wrote(
        &self,
        watch: usize,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) {
        let v = version(meta).unwrap_or(u64::MAX);
        self.written[watch].fetch_max(v, std::sync::atomic::Ordering::SeqCst);
    }

    /// Both watches listed, and showing this process's last writes.
    fn current(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        (0..2).all(|w| {
            self.listed[w].load(SeqCst)
                && self.written[w].load(SeqCst) != u64::MAX
                && self.seen[w].load(SeqCst) >= self.written[w].load(SeqCst)
        })
    }
}

/// What a pod waits for while its owner is busy: surging as many of its
/// pods as its `maxSurge` allows, or settling (a rollout, or catching up
/// with the last surge). One text for both: a pod waiting its turn shows
/// it steadily, not flapping between the two at every change of the
/// owner.
fn busy(t: &Target, owner: &Owner) -> String {
    format!(
        "surging pod {}: waiting its turn: {} is surging as many pods as its maxSurge allows or rolling out",
        t.key(),
        owner.shown()
    )
}

/// What one look found for a pod.
enum Looked {
    /// Over, or waiting: as the step says.
    Step(Step),
    /// Its replacement is Ready: it leaves once its budgets allow.
    Ready,
}

/// One look: start or join the owner's surges, or see how far this one
/// is.
async fn look(
    how: Removal<'_>,
    desk: &Desk,
    t: &Target,
    owner: &mut Owner,
    pods: &[Arc<Pod>],
) -> kube::Result<Looked> {
    if owner.selector().is_none() {
        return Ok(Looked::Step(Step::Over(Surged::Evict(format!(
            "{} has no selector the host can read",
            owner.shown()
        )))));
    }
    let Some(record) = owner.record() else {
        return start(how, desk, t, owner, pods).await.map(Looked::Step);
    };
    // Someone else set the replicas meanwhile (an autoscaler, a GitOps
    // tool setting them back before the replacement is Ready): theirs
    // stand, the record goes, and the pod is evicted instead. Looked at
    // before the replacement, so an owner whose replicas keep being set
    // back never holds the drain waiting for one.
    if owner.replicas() != record.expected() {
        let why = format!(
            "the replicas of {} changed to {} during the surge (an autoscaler or GitOps tool?); \
             kept, and the pod is evicted instead",
            owner.shown(),
            owner.replicas()
        );
        owner.write(owner.replicas(), None).await?;
        return Ok(Looked::Step(Step::Over(Surged::Evict(why))));
    }
    // A hand-over claims and lowers in one turn: pods still leaving in a
    // look are a lowering that failed, or an operator restarted between
    // the two. Whoever looks first finishes them.
    if !record.leaving.is_empty() {
        let this = record.leaving.iter().any(|e| e.uid == t.uid);
        finish(how.client, desk, owner, record).await?;
        if this {
            let _ = how.notes.send(Note::Surged {
                pod: t.reference(),
                owner: owner.shown(),
            });
            return Ok(Looked::Step(Step::Over(Surged::Done)));
        }
        return Ok(Looked::Step(Step::Waiting(busy(t, owner))));
    }
    if !record.surging.iter().any(|e| e.uid == t.uid) {
        return join(how, desk, t, owner, record, pods)
            .await
            .map(Looked::Step);
    }
    let entries: Vec<&str> = record.entries().map(|e| e.uid.as_str()).collect();
    // The ReplicaSet controller removes a not-Ready pod before the one
    // with the lowest deletion cost: lowering the replicas while another
    // surge's replacement is still starting would remove that replacement.
    // So surges of one owner raise their replicas together and hand over
    // once every replacement they brought is Ready.
    // Fewer pods than replicas: a raise the ReplicaSet controller has not
    // acted on. Lowering them now would only cancel the pod not yet made,
    // and this one would stay. (More is fine: pods handed over a moment
    // ago and not yet removed carry the lowest cost too, and go first.)
    if serving(pods, &entries) <= record.serving
        || (live(pods) as i64) < record.expected()
        || !others_ready(pods, &[t.uid.as_str()])
    {
        return Ok(Looked::Step(Step::Waiting(waiting_replacement(t, owner))));
    }
    Ok(Looked::Ready)
}

/// The owner's ReplicaSets' pods (not counting those already
/// terminating) against `replicas`: more is a lowered count the
/// ReplicaSet controller has not acted on yet, fewer a raised one. Either
/// way a change of the replicas now would be folded into that one: a
/// surge raising them would keep the pod another just handed over, one
/// lowering them would take back another's replacement before it exists,
/// and in both cases the handed-over pod stays and the replacement a
/// surge waits for never comes.
fn catching_up(pods: &[Arc<Pod>], replicas: i64) -> bool {
    live(pods) as i64 != replicas
}

/// Whether every pod the owner's ReplicaSets keep is Ready, but those
/// in `except` (uids: the pods about to leave). A pod not Ready would be
/// removed before them when the replicas go down.
fn others_ready(pods: &[Arc<Pod>], except: &[&str]) -> bool {
    kept(pods)
        .filter(|p| !except.contains(&p.metadata.uid.as_deref().unwrap_or_default()))
        .all(crate::policy::convert::pod_ready)
}

fn live(pods: &[Arc<Pod>]) -> usize {
    kept(pods).count()
}

/// The pods the owner's ReplicaSets keep: not already terminating.
fn kept(pods: &[Arc<Pod>]) -> impl Iterator<Item = &Pod> {
    pods.iter().map(|p| &**p).filter(|p| {
        p.metadata.deletion_timestamp.is_none()
            && p.owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && o.kind == "ReplicaSet")
    })
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
