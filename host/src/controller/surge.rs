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
//! While a surge runs the owner carries the annotation
//! [`SURGE_ANNOTATION`] (the pod, the replicas it had, the maintenance)
//! and the label [`SURGE_LABEL`]: a restarted operator resumes the surge
//! from them, a surge whose pod or maintenance is gone is undone by the
//! next one, and deleting the maintenance undoes its surges
//! ([`release`]). Someone else changing the replicas meanwhile (an HPA, a
//! GitOps tool) wins: their count is kept and the pod is evicted instead.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::attempt::{Attempt, Note, Removal, Target};

/// On an owner while one of its pods is surged: what to undo.
pub const SURGE_ANNOTATION: &str = "nmo.medik8s.io/surge";
/// On an owner while a maintenance surges one of its pods: the
/// maintenance's name (so its deletion finds them).
pub const SURGE_LABEL: &str = "nmo.medik8s.io/surging";
/// The ReplicaSet controller removes the pods with the lowest cost first.
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
/// How often a surge looks at the replacement.
const POLL: Duration = Duration::from_millis(500);

/// How a surge ended.
#[derive(Debug)]
pub(super) enum Surged {
    /// The owner removes the pod now, or the attempt ran out (the pod is
    /// still pending; the next attempt resumes).
    Done,
    /// The owner's rules allow no surge: evict instead, for this reason.
    Evict(String),
}

/// The record in [`SURGE_ANNOTATION`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Record {
    /// The surged pod's namespace/name and uid.
    pod: String,
    uid: String,
    /// The owner's replicas before the surge.
    replicas: i64,
    /// Ready pods of the owner on other nodes before the surge.
    ready_elsewhere: usize,
    maintenance: String,
}

/// The workload whose replicas a surge raises.
struct Owner {
    api: Api<DynamicObject>,
    kind: &'static str,
    object: DynamicObject,
}

impl Owner {
    fn shown(&self) -> String {
        format!("{}/{}", self.kind, self.object.name_any())
    }

    fn replicas(&self) -> i64 {
        replicas_of(&self.object.data)
    }

    /// The surge record on the owner, if it is one the host could have
    /// written: the record is on an object others may write, so replicas
    /// outside what a surge could have raised from are not trusted.
    fn record(&self) -> Option<Record> {
        let text = self.object.annotations().get(SURGE_ANNOTATION)?;
        let r: Record = serde_json::from_str(text).ok()?;
        (0..i64::from(i32::MAX)).contains(&r.replicas).then_some(r)
    }

    fn selector(&self) -> Option<String> {
        let s: LabelSelector =
            serde_json::from_value(self.object.data["spec"]["selector"].clone()).ok()?;
        let s = kube::core::Selector::try_from(s).ok()?;
        Some(s.to_string())
    }

    /// Why the owner's rules allow no extra pod, if they do not.
    fn refuses_surge(&self) -> Option<String> {
        refusal(self.kind, &self.object.data, &self.shown())
    }

    /// A Deployment whose controller has not caught up, or that is rolling
    /// out: its ReplicaSets are about to change.
    fn settling(&self) -> bool {
        if self.kind != "Deployment" {
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
    /// if the owner is as read (its resourceVersion).
    async fn write(&self, replicas: i64, record: Option<&Record>) -> kube::Result<()> {
        let patch = json!({
            "metadata": {
                "resourceVersion": self.object.resource_version(),
                "annotations": {SURGE_ANNOTATION: record.map(|r| serde_json::to_string(r).unwrap_or_default())},
                "labels": {SURGE_LABEL: record.map(|r| r.maintenance.clone())},
            },
            "spec": {"replicas": replicas},
        });
        self.api
            .patch(
                &self.object.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map(|_| ())
    }
}

fn dynamic_api<K>(client: &Client, namespace: &str) -> Api<DynamicObject>
where
    K: kube::Resource<DynamicType = ()>,
{
    Api::namespaced_with(client.clone(), namespace, &ApiResource::erase::<K>(&()))
}

/// An owner's `spec.replicas` (its object, as JSON); unset is 1, the
/// API's default.
fn replicas_of(data: &Value) -> i64 {
    data["spec"]["replicas"].as_i64().unwrap_or(1)
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
    let strategy = &data["spec"]["strategy"];
    if strategy["type"].as_str() == Some("Recreate") {
        return Some(format!(
            "{shown} uses the Recreate strategy: it never runs an extra pod"
        ));
    }
    let surge = match &strategy["rollingUpdate"]["maxSurge"] {
        Value::Number(n) => n.as_i64().unwrap_or(1),
        Value::String(p) => {
            let pct: i64 = p.trim_end_matches('%').parse().unwrap_or(25);
            replicas.saturating_mul(pct).saturating_add(99) / 100
        }
        // The API default: 25 %, rounded up.
        _ => replicas.saturating_mul(25).saturating_add(99) / 100,
    };
    (surge < 1).then(|| format!("{shown} has maxSurge 0: it allows no extra pod"))
}

/// The owner whose replicas to raise for a pod of the ReplicaSet `rs`:
/// its Deployment, or the ReplicaSet itself.
async fn owner(client: &Client, namespace: &str, rs: &str) -> kube::Result<Owner> {
    let rs_api = dynamic_api::<ReplicaSet>(client, namespace);
    let set = rs_api.get(rs).await?;
    let deployment = set
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "Deployment")
        .map(|o| o.name.clone());
    match deployment {
        Some(name) => {
            let api = dynamic_api::<Deployment>(client, namespace);
            let object = api.get(&name).await?;
            Ok(Owner {
                api,
                kind: "Deployment",
                object,
            })
        }
        None => Ok(Owner {
            api: rs_api,
            kind: "ReplicaSet",
            object: set,
        }),
    }
}

/// Ready, running pods of `selector` on nodes other than `node`.
async fn ready_elsewhere(
    client: &Client,
    namespace: &str,
    selector: &str,
    node: &str,
) -> kube::Result<usize> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = pods.list(&ListParams::default().labels(selector)).await?;
    Ok(list
        .items
        .iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node)
                && crate::policy::convert::pod_ready(p)
        })
        .count())
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
pub(super) async fn replace(how: Removal<'_>, t: &Target, state: &Attempt) -> Surged {
    let Some(("ReplicaSet", rs)) = t.controller.as_ref().map(|(k, n)| (k.as_str(), n)) else {
        return Surged::Evict("no ReplicaSet controls the pod".into());
    };
    let mut changes: Option<Changes> = None;
    loop {
        if !state.has(&t.uid).await || Instant::now() >= how.deadline {
            return Surged::Done;
        }
        let looked = match owner(how.client, &t.namespace, rs).await {
            Ok(owner) => {
                if changes.is_none() {
                    changes = Changes::of(how.client, &t.namespace, &owner);
                }
                look(how, t, &owner).await
            }
            Err(e) => Err(e),
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
        match changes.as_mut() {
            Some(c) if !failed => c.next(how.deadline, state, &t.uid).await,
            _ => {
                tokio::time::sleep(POLL.min(how.deadline.saturating_duration_since(Instant::now())))
                    .await
            }
        }
    }
}

/// What a waiting surge watches: its owner (by name) and the owner's pods
/// (by its selector), through kube-runtime's watcher. A look is taken
/// when either changes: a surge waiting an hour for its replacement
/// makes no request while nothing happens. While a watch fails (an RBAC
/// that does not let the operator watch the owner's kind, an API outage)
/// the surge looks every [`POLL`] instead.
struct Changes {
    events: futures::stream::BoxStream<'static, bool>,
}

impl Changes {
    /// The watches of `owner` and its pods; `None` when its selector
    /// cannot be read (the look then evicts instead).
    fn of(client: &Client, namespace: &str, owner: &Owner) -> Option<Self> {
        use futures::StreamExt;
        use kube::runtime::watcher;
        let selector = owner.selector()?;
        let config = || watcher::Config::default().timeout(crate::client::WATCH_TIMEOUT_SECS);
        let by_name = config().fields(&format!("metadata.name={}", owner.object.name_any()));
        let itself = watcher(owner.api.clone(), by_name).map(|e| e.is_ok());
        let pods = watcher(
            Api::<Pod>::namespaced(client.clone(), namespace),
            config().labels(&selector),
        )
        .map(|e| e.is_ok());
        Some(Self {
            events: futures::stream::select(itself, pods).boxed(),
        })
    }

    /// Waits for the next change (what else arrived with it is the same
    /// change), for the pod `uid` to leave the node, or for `deadline`.
    async fn next(&mut self, deadline: Instant, state: &Attempt, uid: &str) {
        use futures::{FutureExt, StreamExt};
        let changed = async {
            match self.events.next().await {
                Some(true) => {}
                // The watch failed (it is tried again at the next look).
                Some(false) | None => tokio::time::sleep(POLL).await,
            }
            while let Some(Some(_)) = self.events.next().now_or_never() {}
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

/// What a pod waits for while its owner is busy: surging another of its
/// pods, or settling (a rollout, or catching up with the last surge). One
/// text for both: a pod waiting its turn behind several surges shows it
/// steadily, not flapping between the two at every change of the owner.
fn busy(t: &Target, owner: &Owner) -> String {
    format!(
        "surging pod {}: waiting its turn: {} is surging another pod or rolling out",
        t.key(),
        owner.shown()
    )
}

/// One look: start the surge, or see how far it is, or finish it.
async fn look(how: Removal<'_>, t: &Target, owner: &Owner) -> kube::Result<Step> {
    let client = how.client;
    let Some(selector) = owner.selector() else {
        return Ok(Step::Over(Surged::Evict(format!(
            "{} has no selector the host can read",
            owner.shown()
        ))));
    };
    let record = match owner.record() {
        Some(r) if r.uid == t.uid => r,
        Some(other) => {
            if surge_alive(client, &t.namespace, &other).await? {
                return Ok(Step::Waiting(busy(t, owner)));
            }
            // A surge whose pod or maintenance went: undone, then ours.
            undo(owner, &other).await?;
            return Ok(Step::Waiting(format!(
                "surging pod {}: undid a stale surge of {}",
                t.key(),
                owner.shown()
            )));
        }
        None => {
            if let Some(why) = owner.refuses_surge() {
                return Ok(Step::Over(Surged::Evict(why)));
            }
            if owner.settling() {
                return Ok(Step::Waiting(busy(t, owner)));
            }
            let record = Record {
                pod: t.key(),
                uid: t.uid.clone(),
                replicas: owner.replicas(),
                ready_elsewhere: ready_elsewhere(client, &t.namespace, &selector, how.node).await?,
                maintenance: how.maintenance.to_owned(),
            };
            owner
                .write(record.replicas.saturating_add(1), Some(&record))
                .await?;
            tracing::info!(logger = "drain", pod = %t.key(), owner = %owner.shown(), replicas = record.replicas.saturating_add(1), "surge: one more replica");
            return Ok(Step::Waiting(format!(
                "surging pod {}: {} raised to {} replicas",
                t.key(),
                owner.shown(),
                record.replicas.saturating_add(1)
            )));
        }
    };
    // Someone else set the replicas meanwhile (an autoscaler, a GitOps
    // tool setting them back before the replacement is Ready): theirs
    // stand, the record goes, and the pod is evicted instead. Looked at
    // before the replacement, so an owner whose replicas keep being set
    // back never holds the drain waiting for one.
    if owner.replicas() != record.replicas.saturating_add(1) {
        let why = format!(
            "the replicas of {} changed to {} during the surge (an autoscaler or GitOps tool?); \
             kept, and the pod is evicted instead",
            owner.shown(),
            owner.replicas()
        );
        owner.write(owner.replicas(), None).await?;
        return Ok(Step::Over(Surged::Evict(why)));
    }
    let ready = ready_elsewhere(client, &t.namespace, &selector, how.node).await?;
    if ready <= record.ready_elsewhere {
        return Ok(Step::Waiting(format!(
            "surging pod {}: waiting for a Ready replacement from {}",
            t.key(),
            owner.shown()
        )));
    }
    let timings = how.retries.budget_timings();
    let Some(permit) = how
        .budgets
        .permit(&t.namespace, &t.name, &t.labels, timings, how.deadline)
        .await
    else {
        return Ok(Step::Over(Surged::Done));
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &t.namespace);
    let cost = json!({"metadata": {"annotations": {DELETION_COST: i32::MIN.to_string()}}});
    if let Err(e) = pods
        .patch(&t.name, &PatchParams::default(), &Patch::Merge(&cost))
        .await
    {
        permit.failed();
        return Err(e);
    }
    if let Err(e) = owner.write(record.replicas, None).await {
        permit.failed();
        return Err(e);
    }
    permit.accepted();
    tracing::info!(logger = "drain", pod = %t.key(), owner = %owner.shown(), replicas = record.replicas, "surge: replacement Ready; the owner removes the pod");
    let _ = how.notes.send(Note::Surged {
        pod: t.reference(),
        owner: owner.shown(),
    });
    Ok(Step::Over(Surged::Done))
}

/// Whether the surge `r` still has a reason to hold its owner: its pod
/// exists (same uid) and so does its maintenance.
async fn surge_alive(client: &Client, namespace: &str, r: &Record) -> kube::Result<bool> {
    let name = r.pod.rsplit('/').next().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    // A list by name: the operator's RBAC lists pods, it does not get them.
    let pod_there = pods
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await?
        .items
        .iter()
        .any(|p| p.uid().as_deref() == Some(r.uid.as_str()));
    if !pod_there {
        return Ok(false);
    }
    let nms: Api<crate::crd::NodeMaintenance> = Api::all(client.clone());
    Ok(nms
        .get_opt(&r.maintenance)
        .await?
        .is_some_and(|m| m.metadata.deletion_timestamp.is_none()))
}

/// Undoes the surge `r` on `owner`: its replicas back where they were if
/// nobody changed them since, the annotation and label removed.
async fn undo(owner: &Owner, r: &Record) -> kube::Result<()> {
    let replicas = if owner.replicas() == r.replicas.saturating_add(1) {
        r.replicas
    } else {
        owner.replicas()
    };
    owner.write(replicas, None).await
}

/// Undoes every surge the maintenance `name` holds (it is being deleted,
/// or its drain ended): each owner labelled with it gets its replicas
/// back.
pub async fn release(client: &Client, name: &str) -> kube::Result<usize> {
    let mut undone = 0;
    let selector = format!("{SURGE_LABEL}={name}");
    for resource in [
        ApiResource::erase::<Deployment>(&()),
        ApiResource::erase::<ReplicaSet>(&()),
    ] {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let kind = if resource.kind == "Deployment" {
            "Deployment"
        } else {
            "ReplicaSet"
        };
        for object in api
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
        {
            let ns = object.namespace().unwrap_or_default();
            let owner = Owner {
                api: Api::namespaced_with(client.clone(), &ns, &resource),
                kind,
                object,
            };
            if let Some(r) = owner.record() {
                undo(&owner, &r).await?;
                undone += 1;
                tracing::info!(logger = "controller", owner = %owner.shown(), replicas = r.replicas, nodeMaintenance = %name, "surge undone");
            }
        }
    }
    Ok(undone)
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
        let negative = json!({"spec": {"replicas": -3}});
        assert!(refusal("ReplicaSet", &negative, "ReplicaSet/odd").is_some());
        let fine = json!({"spec": {"replicas": 2147483646}});
        assert_eq!(refusal("ReplicaSet", &fine, "ReplicaSet/big"), None);
        let recreate = json!({"spec": {"replicas": 1, "strategy": {"type": "Recreate"}}});
        assert!(refusal("Deployment", &recreate, "Deployment/r").is_some());
    }
}
