//! One reconcile of a NodeMaintenance, following the Go operator:
//! finalizer, status initialisation, node, owner reference, lease, label,
//! taints and cordon, drain, Succeeded; deletion undoes it all. Every step
//! is idempotent, so a restart at any point converges to the same state.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use serde_json::json;

use super::events::{EventType, reasons};
use super::{Context, backoff, drain, node};
use crate::crd::{
    FINALIZER, MaintenancePhase, NodeMaintenance, NodeMaintenanceStatus, PodReference,
};
use crate::error::{Error, Result};
use crate::policy::convert;
use crate::policy::types::{self, DrainReport, Failure};
use crate::policy::{Plan, Verdict};

/// How often a finished maintenance is looked at again (renewing the node
/// lease well within its 3600 s).
pub const RENEW_INTERVAL: Duration = Duration::from_secs(30 * 60);
/// How long to wait after a policy error before asking again.
pub const POLICY_ERROR_RETRY: Duration = Duration::from_secs(30);

fn has_finalizer(nm: &NodeMaintenance) -> bool {
    nm.finalizers().iter().any(|f| f == FINALIZER)
}

fn status(nm: &NodeMaintenance) -> NodeMaintenanceStatus {
    nm.status.clone().unwrap_or_default()
}

fn now() -> Time {
    Time(Timestamp::now())
}

/// The maintenance as the policy sees it.
fn record(nm: &NodeMaintenance, attempt: u32) -> types::Maintenance {
    convert::maintenance(nm, attempt, Timestamp::now())
}

/// Asks the maintenance's policy for a drain plan, on the blocking pool: a
/// decision is CPU work of up to the policy deadline, and WASI's
/// synchronous streams must not run on an async worker. The pods are
/// handed back for the drain.
async fn plan_drain(
    ctx: &Context,
    nm: &NodeMaintenance,
    node: &Node,
    pods: Vec<Pod>,
    attempt: u32,
) -> (Result<Plan>, Vec<Pod>) {
    let selected = match ctx.policy_for(nm, Some(node)) {
        Ok(s) => s,
        Err(e) => return (Err(e), pods),
    };
    let (record, node) = (record(nm, attempt), node.clone());
    let task = tokio::task::spawn_blocking(move || {
        let plan = selected.policy.plan_drain_k8s(&record, &node, &pods);
        (plan, pods)
    });
    match task.await {
        Ok(answer) => answer,
        Err(e) => (
            Err(Error::Engine(format!(
                "the policy call did not finish: {e}"
            ))),
            Vec::new(),
        ),
    }
}

/// Asks the maintenance's policy what to do after a failure (on the
/// blocking pool, as [`plan_drain`]).
async fn on_failure(
    ctx: &Context,
    nm: &NodeMaintenance,
    failure: Failure,
    attempt: u32,
) -> Result<Verdict> {
    let selected = ctx.policy_for(nm, None)?;
    let record = record(nm, attempt);
    tokio::task::spawn_blocking(move || selected.policy.on_failure(&record, &failure))
        .await
        .map_err(|e| Error::Engine(format!("the policy call did not finish: {e}")))?
}

/// Reads the NodeMaintenance fresh, changes its status with `f`, and writes
/// it back guarded by resourceVersion (retrying on conflict). Returns the
/// status before the change and the object after.
async fn update_status(
    api: &Api<NodeMaintenance>,
    name: &str,
    f: impl Fn(&mut NodeMaintenanceStatus),
) -> Result<(NodeMaintenanceStatus, NodeMaintenance)> {
    for _ in 0..8 {
        let mut nm = api
            .get(name)
            .await
            .map_err(Error::kube("reading the NodeMaintenance"))?;
        let old = status(&nm);
        let mut new = old.clone();
        f(&mut new);
        if new == old {
            return Ok((old, nm));
        }
        nm.status = Some(new);
        match api.replace_status(name, &PostParams::default(), &nm).await {
            Ok(updated) => return Ok((old, updated)),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(Error::kube("updating the NodeMaintenance status")(e)),
        }
    }
    Err(Error::Conflict("updating the NodeMaintenance status"))
}

fn pod_refs(list: &[PodReference]) -> (Option<Vec<String>>, Option<Vec<PodReference>>) {
    if list.is_empty() {
        return (None, None);
    }
    (
        Some(list.iter().map(|p| p.name.clone()).collect()),
        Some(list.to_vec()),
    )
}

fn progress(eviction_pods: i32, pending: usize) -> i32 {
    if eviction_pods <= 0 {
        return 0;
    }
    // In i64: status values come from the API and may be anything.
    let total = i64::from(eviction_pods);
    let done = (total - pending as i64).max(0);
    (done * 100 / total).clamp(0, 100) as i32
}

async fn pods_on(client: &kube::Client, node: &str) -> Result<(Vec<Pod>, String)> {
    let api: Api<Pod> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(Error::kube("listing the node's pods"))?;
    Ok((
        list.items,
        list.metadata.resource_version.unwrap_or_default(),
    ))
}

/// The reconcile.
pub async fn reconcile(nm: Arc<NodeMaintenance>, ctx: Arc<Context>) -> Result<Action> {
    let api: Api<NodeMaintenance> = Api::all(ctx.client.clone());
    let name = nm.name_any();
    let uid = nm.uid().unwrap_or_default();
    let node_name = nm.spec.node_name.clone();
    tracing::debug!(logger = "controller", nodeMaintenance = %name, nodeName = %node_name, "reconciling");

    // 1. Being deleted: undo the maintenance if the finalizer is ours.
    if nm.metadata.deletion_timestamp.is_some() {
        if has_finalizer(&nm) {
            // Its node, and a node it was moved away from that the move
            // has not restored yet.
            let mut nodes: Vec<String> = vec![node_name.clone()];
            nodes.extend(node_owners(&nm).filter(|n| *n != node_name));
            for n in &nodes {
                restore_unless_wanted(&ctx, &api, &nm, n).await?;
            }
            let finalizers: Vec<String> = nm
                .finalizers()
                .iter()
                .filter(|f| *f != FINALIZER)
                .cloned()
                .collect();
            patch_metadata(
                &api,
                &nm,
                json!({"finalizers": finalizers}),
                "removing the finalizer",
            )
            .await?;
            let (reason, message) = reasons::REMOVED;
            log_err(
                ctx.recorder
                    .record(&*nm, EventType::Normal, reason, message)
                    .await,
            );
            ctx.succeeded(&uid);
            ctx.unpin(&uid);
        }
        return Ok(Action::await_change());
    }

    // A failed maintenance stays failed until it is deleted.
    if status(&nm).phase == Some(MaintenancePhase::Failed) {
        return Ok(Action::await_change());
    }

    // 2. The finalizer.
    let mut nm = (*nm).clone();
    if !has_finalizer(&nm) {
        let mut finalizers = nm.finalizers().to_vec();
        finalizers.push(FINALIZER.to_owned());
        nm = patch_metadata(
            &api,
            &nm,
            json!({"finalizers": finalizers}),
            "adding the finalizer",
        )
        .await?;
        let (reason, message) = reasons::BEGIN;
        log_err(
            ctx.recorder
                .record(&nm, EventType::Normal, reason, message)
                .await,
        );
        tracing::info!(logger = "controller", nodeName = %node_name, "{message}");
    }

    // spec.nodeName changed (the webhook refuses that; without it, this):
    // the old node is restored and the maintenance starts over on the new
    // one.
    let moved_from: Vec<String> = node_owners(&nm).filter(|n| *n != node_name).collect();
    if !moved_from.is_empty() {
        for old in &moved_from {
            restore_unless_wanted(&ctx, &api, &nm, old).await?;
        }
        let refs: Vec<_> = nm
            .owner_references()
            .iter()
            .filter(|o| o.kind != "Node" || o.name == node_name)
            .cloned()
            .collect();
        patch_metadata(
            &api,
            &nm,
            json!({"ownerReferences": refs}),
            "dropping the old node's owner reference",
        )
        .await?;
        nm = update_status(&api, &name, |s| *s = NodeMaintenanceStatus::default())
            .await?
            .1;
        ctx.succeeded(&uid);
        ctx.unpin(&uid);
        tracing::warn!(logger = "controller", nodeMaintenance = %name, from = ?moved_from, to = %node_name, "spec.nodeName changed: the old node is restored, the maintenance starts over on the new one");
    }

    // A failed attempt waits as its verdict said, whatever woke us (our own
    // status write, a watch event): no request, no policy call until then.
    if let Some(left) = ctx.held(&uid) {
        tracing::debug!(logger = "controller", nodeMaintenance = %name, wait = ?left, "waiting before the next attempt");
        return Ok(Action::requeue(left));
    }

    // 3. Status, once. A name no node can have is a node that does not
    // exist.
    let node = if is_node_name(&node_name) {
        Api::<Node>::all(ctx.client.clone())
            .get_opt(&node_name)
            .await
            .map_err(Error::kube("reading the node"))?
    } else {
        None
    };
    if status(&nm).phase.is_none() {
        let (pods, _) = pods_on(&ctx.client, &node_name).await?;
        let total = i32::try_from(pods.len()).unwrap_or(i32::MAX);
        let removals = match &node {
            Some(n) => match plan_drain(&ctx, &nm, n, pods, 1).await.0 {
                Ok(plan) => plan
                    .removals()
                    .map(|s| PodReference {
                        namespace: s.namespace.clone(),
                        name: s.name.clone(),
                    })
                    .collect(),
                Err(e) => return policy_failed(&ctx, &api, &nm, e).await,
            },
            None => Vec::new(),
        };
        let (names, refs) = pod_refs(&removals);
        let chosen = node
            .as_ref()
            .and_then(|n| ctx.policy_for(&nm, Some(n)).ok())
            .map(|s| s.label());
        let (_, updated) = update_status(&api, &name, |s| {
            if s.phase.is_none() {
                s.phase = Some(MaintenancePhase::Running);
                s.policy = chosen.clone();
                s.last_update = Some(now());
                s.pending_pods = names.clone();
                s.pending_pods_refs = refs.clone();
                s.eviction_pods = i32::try_from(removals.len()).unwrap_or(i32::MAX);
                s.total_pods = total;
            }
        })
        .await?;
        nm = updated;
    }

    // 4. The node.
    let Some(node) = node else {
        let message = format!("nodes \"{node_name}\" not found");
        return handle_failure(&ctx, &api, &nm, Failure::NodeNotFound, message).await;
    };

    // 5. Owner reference to the node, so the CR goes with it.
    let node_uid = node.uid().unwrap_or_default();
    if !nm
        .owner_references()
        .iter()
        .any(|o| o.kind == "Node" && o.uid == node_uid)
    {
        let mut refs = nm.owner_references().to_vec();
        refs.push(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node_name.clone(),
                uid: node_uid,
                block_owner_deletion: Some(false),
                controller: Some(false),
            },
        );
        nm = patch_metadata(
            &api,
            &nm,
            json!({"ownerReferences": refs}),
            "setting the owner reference",
        )
        .await?;
    }

    // Read fresh before acting on the node: the cache may be behind (a
    // watch that lost events, an API server restored from a backup). A
    // NodeMaintenance that is gone, being deleted or moved is left to the
    // next pass, which sees the change.
    let fresh = api
        .get_opt(&name)
        .await
        .map_err(Error::kube("reading the NodeMaintenance"))?;
    let current = fresh.as_ref().is_some_and(|f| {
        f.uid() == nm.uid()
            && f.metadata.deletion_timestamp.is_none()
            && f.spec.node_name == node_name
    });
    if !current {
        tracing::info!(logger = "controller", nodeMaintenance = %name, "the NodeMaintenance changed or went since the cache saw it; not acting on the node");
        return Ok(Action::requeue(Duration::from_secs(1)));
    }

    // 6. The node lease.
    match ctx.leases.request(&node).await {
        Ok(()) => {
            if status(&nm).error_on_lease_count != 0 {
                nm = update_status(&api, &name, |s| s.error_on_lease_count = 0)
                    .await?
                    .1;
            }
        }
        Err(e @ (Error::LeaseHeld { .. } | Error::Kube { .. })) => {
            let kind = if matches!(e, Error::LeaseHeld { .. }) {
                "held"
            } else {
                "api"
            };
            crate::metrics::METRICS
                .lease_errors
                .with_label_values(&[kind])
                .inc();
            if status(&nm).drain_progress > 0 {
                nm = update_status(&api, &name, |s| {
                    s.error_on_lease_count = s.error_on_lease_count.saturating_add(1)
                })
                .await?
                .1;
            }
            let failure = match &e {
                Error::LeaseHeld { holder } => Failure::LeaseHeld(holder.clone()),
                other => Failure::LeaseError(other.to_string()),
            };
            return handle_failure(&ctx, &api, &nm, failure, e.to_string()).await;
        }
        Err(e) => return Err(e),
    }

    // 7, 8. Label, taints, cordon.
    let Some(node) = node::set_maintenance(&ctx.client, &node_name, true)
        .await?
        .0
    else {
        let message = format!("nodes \"{node_name}\" not found");
        return handle_failure(&ctx, &api, &nm, Failure::NodeNotFound, message).await;
    };

    // 9. Drain, as the policy plans it.
    let (pods, list_rv) = pods_on(&ctx.client, &node_name).await?;
    let attempt = ctx.failures(&uid) + 1;
    let (plan, pods) = plan_drain(&ctx, &nm, &node, pods, attempt).await;
    let plan: Plan = match plan {
        Ok(p) => p,
        Err(e) => return policy_failed(&ctx, &api, &nm, e).await,
    };
    let eviction_pods = status(&nm).eviction_pods;
    let (tx, mut rx) = tokio::sync::watch::channel::<Option<Vec<PodReference>>>(None);
    let writer = {
        let api = api.clone();
        let name = name.clone();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let Some(pending) = rx.borrow_and_update().clone() else {
                    continue;
                };
                let (names, refs) = pod_refs(&pending);
                let p = progress(eviction_pods, pending.len());
                let _ = update_status(&api, &name, |s| {
                    s.pending_pods = names.clone();
                    s.pending_pods_refs = refs.clone();
                    if s.phase != Some(MaintenancePhase::Succeeded) {
                        s.drain_progress = p;
                    }
                })
                .await;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let outcome = drain::execute(
        &ctx.client,
        drain::Listed {
            node: &node_name,
            pods: &pods,
            resource_version: &list_rv,
        },
        &plan,
        &ctx.settings.drain_retries,
        move |pending| {
            let _ = tx.send(Some(pending));
        },
        || ctx.no_longer_wants(&name, &uid, &node_name),
    )
    .await;
    // The final status below supersedes any progress still being written.
    writer.abort();
    if outcome.cancelled {
        // Deleted or moved meanwhile: the change is queued and handled next.
        tracing::info!(logger = "controller", nodeMaintenance = %name, nodeName = %node_name, "drain stopped: the NodeMaintenance was deleted or moved");
        return Ok(Action::requeue(Duration::from_millis(100)));
    }

    if outcome.complete() {
        let (old, _) = update_status(&api, &name, |s| {
            if s.phase != Some(MaintenancePhase::Succeeded) {
                s.last_update = Some(now());
            }
            s.phase = Some(MaintenancePhase::Succeeded);
            s.drain_progress = 100;
            s.pending_pods = None;
            s.pending_pods_refs = None;
        })
        .await?;
        if old.phase != Some(MaintenancePhase::Succeeded) {
            if let Some(created) = &nm.metadata.creation_timestamp {
                let secs = (Timestamp::now().as_millisecond() - created.0.as_millisecond()).max(0)
                    as f64
                    / 1e3;
                crate::metrics::METRICS.drain_duration.observe(secs);
            }
            let (reason, message) = reasons::SUCCEEDED;
            log_err(
                ctx.recorder
                    .record(&nm, EventType::Normal, reason, message)
                    .await,
            );
        }
        ctx.succeeded(&uid);
        return Ok(Action::requeue(ctx.settings.renew_interval));
    }

    let (names, refs) = pod_refs(&outcome.pending);
    let p = progress(eviction_pods, outcome.pending.len());
    let message = outcome.message.clone();
    let (_, nm) = update_status(&api, &name, |s| {
        s.pending_pods = names.clone();
        s.pending_pods_refs = refs.clone();
        s.drain_progress = p;
        s.last_error = Some(message.clone());
        s.last_update = Some(now());
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
        timed_out: outcome.timed_out,
        message: outcome.message.clone(),
    };
    handle_failure(
        &ctx,
        &api,
        &nm,
        Failure::DrainIncomplete(report),
        outcome.message,
    )
    .await
}

/// A merge patch of metadata, guarded by the resourceVersion we read.
async fn patch_metadata(
    api: &Api<NodeMaintenance>,
    nm: &NodeMaintenance,
    metadata: serde_json::Value,
    op: &'static str,
) -> Result<NodeMaintenance> {
    let mut metadata = metadata;
    metadata["resourceVersion"] = json!(nm.resource_version());
    api.patch(
        &nm.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": metadata})),
    )
    .await
    .map_err(Error::kube(op))
}

fn log_err(r: Result<()>) {
    if let Err(e) = r {
        tracing::warn!(logger = "controller", error = %e, "could not record an event");
    }
}

/// Asks the policy what to do after a failure and does it.
async fn handle_failure(
    ctx: &Context,
    api: &Api<NodeMaintenance>,
    nm: &NodeMaintenance,
    failure: Failure,
    last_error: String,
) -> Result<Action> {
    let uid = nm.uid().unwrap_or_default();
    let name = nm.name_any();
    let attempt = ctx.failed(&uid);
    let verdict = match on_failure(ctx, nm, failure.clone(), attempt).await {
        Ok(v) => v,
        Err(e) => return policy_failed(ctx, api, nm, e).await,
    };
    if let Failure::DrainIncomplete(report) = &failure {
        // The Go operator's lines, which its e2e suite looks for.
        tracing::warn!(logger = "controller", nodeName = %nm.spec.node_name, error = %report.message, "Not all pods evicted");
    }
    tracing::warn!(logger = "controller", nodeMaintenance = %name, nodeName = %nm.spec.node_name, error = %last_error, verdict = %verdict, "maintenance step failed");
    if let Verdict::RetryAfter(d) = &verdict {
        tracing::info!(logger = "controller", nodeMaintenance = %name, requeueAfter = ?d, "Reconciling with fixed duration");
    }
    match verdict {
        Verdict::RetryAfter(d) => {
            ctx.hold(&uid, d);
            update_status(api, &name, |s| s.last_error = Some(last_error.clone())).await?;
            Ok(Action::requeue(d))
        }
        Verdict::RetryWithBackoff => {
            let d = backoff(attempt);
            ctx.hold(&uid, d);
            update_status(api, &name, |s| s.last_error = Some(last_error.clone())).await?;
            Ok(Action::requeue(d))
        }
        Verdict::Fail(message) => {
            if !matches!(failure, Failure::NodeNotFound) {
                restore_unless_wanted(ctx, api, nm, &nm.spec.node_name).await?;
            }
            let (old, updated) = update_status(api, &name, |s| {
                s.phase = Some(MaintenancePhase::Failed);
                s.last_error = Some(message.clone());
                s.last_update = Some(now());
            })
            .await?;
            if old.phase != Some(MaintenancePhase::Failed) {
                let (reason, msg) = reasons::FAILED;
                log_err(
                    ctx.recorder
                        .record(&updated, EventType::Warning, reason, msg)
                        .await,
                );
            }
            Ok(Action::await_change())
        }
    }
}

/// A policy could not decide: record it and wait; never act.
async fn policy_failed(
    ctx: &Context,
    api: &Api<NodeMaintenance>,
    nm: &NodeMaintenance,
    e: Error,
) -> Result<Action> {
    let message = e.to_string();
    tracing::error!(logger = "controller", nodeMaintenance = %nm.name_any(), category = e.category(), "{message}");
    let (old, updated) = update_status(api, &nm.name_any(), |s| {
        s.last_error = Some(message.clone())
    })
    .await?;
    if old.last_error.as_deref() != Some(message.as_str()) {
        log_err(
            ctx.recorder
                .record(
                    &updated,
                    EventType::Warning,
                    reasons::POLICY_ERROR,
                    &message,
                )
                .await,
        );
    }
    Ok(Action::requeue(ctx.settings.policy_error_retry))
}

/// Whether `s` can be a node's name (a DNS subdomain).
fn is_node_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// The nodes a maintenance holds an owner reference to.
fn node_owners(nm: &NodeMaintenance) -> impl Iterator<Item = String> + '_ {
    nm.owner_references()
        .iter()
        .filter(|o| o.kind == "Node")
        .map(|o| o.name.clone())
}

/// Restores `node` unless another maintenance (not being deleted, not
/// failed) still wants it in maintenance: with no webhook to refuse a
/// second NodeMaintenance for a node, ending one must not end the other's.
async fn restore_unless_wanted(
    ctx: &Context,
    api: &Api<NodeMaintenance>,
    nm: &NodeMaintenance,
    node: &str,
) -> Result<()> {
    let others = api
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing NodeMaintenances"))?;
    if let Some(other) = others.items.iter().find(|o| {
        o.uid() != nm.uid()
            && o.spec.node_name == node
            && o.metadata.deletion_timestamp.is_none()
            && status(o).phase != Some(MaintenancePhase::Failed)
    }) {
        tracing::info!(logger = "controller", nodeMaintenance = %nm.name_any(), nodeName = %node, other = %other.name_any(), "the node stays in maintenance for another NodeMaintenance");
        return Ok(());
    }
    stop_maintenance(ctx, node).await
}

/// Undoes the maintenance on the node: taints, cordon, label, lease.
async fn stop_maintenance(ctx: &Context, node_name: &str) -> Result<()> {
    let (node, changed) = node::set_maintenance(&ctx.client, node_name, false).await?;
    if let (Some(node), true) = (node, changed) {
        let (reason, message) = reasons::UNCORDON;
        log_err(
            ctx.recorder
                .record(&node, EventType::Normal, reason, message)
                .await,
        );
    }
    ctx.leases.invalidate(node_name).await
}
