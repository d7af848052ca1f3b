//! The drain executor: carries out a validated plan, wave by wave, with
//! evictions through the Eviction API (PDB 429s retried as kubectl does,
//! every 5 s), deletes where the policy says delete, bounded concurrency,
//! and pod disappearance observed by a watch on the node's pods.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, EvictParams, Preconditions, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;

use crate::crd::PodReference;
use crate::policy::{Action, Plan};

/// Wait after a PodDisruptionBudget refusal before evicting again
/// (kubectl drain's).
pub const PDB_RETRY: Duration = Duration::from_secs(5);

/// How long the drain waits before trying a pod again.
#[derive(Debug, Clone)]
pub struct Retries {
    /// After an eviction a PodDisruptionBudget refused (a 429).
    pub pdb: Duration,
    /// After another API error, and before watching again.
    pub api_error: Duration,
}

impl Default for Retries {
    fn default() -> Self {
        Retries {
            pdb: PDB_RETRY,
            api_error: ERROR_RETRY,
        }
    }
}
/// Wait after any other failed eviction.
pub const ERROR_RETRY: Duration = Duration::from_secs(1);
/// Removals in flight at once when the policy sets no limit.
pub const HOST_MAX_CONCURRENT: usize = 256;

/// How a drain attempt ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Pods the plan removes that are still on the node.
    pub pending: Vec<PodReference>,
    /// The subset of `pending` whose last eviction got a 429.
    pub pdb_blocked: Vec<PodReference>,
    /// Pods the plan blocks on that are still on the node.
    pub blocked: Vec<PodReference>,
    /// The attempt timeout ran out.
    pub timed_out: bool,
    /// The error the attempt ended with ("" when complete).
    pub message: String,
    /// The attempt was stopped because the maintenance no longer wants it
    /// (deleted, or moved to another node).
    pub cancelled: bool,
    /// Evictions / deletions that the API accepted in this attempt.
    pub evicted: usize,
    pub deleted: usize,
}

impl Outcome {
    pub fn complete(&self) -> bool {
        self.pending.is_empty() && self.blocked.is_empty()
    }
}

/// A pod the plan acts on.
#[derive(Clone)]
struct Target {
    namespace: String,
    name: String,
    uid: String,
    action: Action,
}

impl Target {
    fn reference(&self) -> PodReference {
        PodReference {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// Shared state of one attempt.
struct Attempt {
    /// uids still on the node.
    present: Mutex<HashSet<String>>,
    /// uids whose last eviction was refused by a PDB.
    pdb_blocked: Mutex<HashSet<String>>,
    last_error: Mutex<String>,
    evicted: std::sync::atomic::AtomicUsize,
    deleted: std::sync::atomic::AtomicUsize,
    changed: tokio::sync::Notify,
}

/// A node's pods as listed: what a plan is made from.
#[derive(Debug, Clone, Copy)]
pub struct Listed<'a> {
    pub node: &'a str,
    pub pods: &'a [Pod],
    /// The list's resourceVersion, where the drain's watch starts.
    pub resource_version: &'a str,
}

/// Runs one drain attempt of `plan` over the `listed` pods (the list the
/// plan was made from). `on_progress` is called with the pods still
/// pending whenever that set shrinks; `cancelled` is asked at least every
/// 500 ms and ends the attempt early when it says so.
pub async fn execute(
    client: &Client,
    listed: Listed<'_>,
    plan: &Plan,
    retries: &Retries,
    on_progress: impl Fn(Vec<PodReference>) + Send + Sync,
    cancelled: impl Fn() -> bool + Send + Sync,
) -> Outcome {
    let Listed {
        node,
        pods,
        resource_version: list_rv,
    } = listed;
    let deadline = Instant::now() + plan.attempt_timeout;
    let targets: Vec<(u32, Target)> = plan
        .steps
        .iter()
        .map(|s| {
            let p = &pods[s.pod];
            (
                s.order,
                Target {
                    namespace: s.namespace.clone(),
                    name: s.name.clone(),
                    uid: p.uid().unwrap_or_default(),
                    action: s.action.clone(),
                },
            )
        })
        .collect();
    let state = Arc::new(Attempt {
        present: Mutex::new(pods.iter().filter_map(|p| p.uid()).collect()),
        pdb_blocked: Mutex::new(HashSet::new()),
        last_error: Mutex::new(String::new()),
        evicted: Default::default(),
        deleted: Default::default(),
        changed: tokio::sync::Notify::new(),
    });
    let watch = tokio::spawn(watch_node(
        client.clone(),
        node.to_owned(),
        list_rv.to_owned(),
        state.clone(),
        retries.api_error,
    ));
    let limit = plan
        .max_concurrent_evictions
        .map_or(HOST_MAX_CONCURRENT, |n| {
            (n.get() as usize).min(HOST_MAX_CONCURRENT)
        });
    let semaphore = Arc::new(Semaphore::new(limit));
    let removals: Vec<&Target> = targets
        .iter()
        .filter(|(_, t)| t.action.removes())
        .map(|(_, t)| t)
        .collect();
    let report = |present: &HashSet<String>| -> Vec<PodReference> {
        removals
            .iter()
            .filter(|t| present.contains(&t.uid))
            .map(|t| t.reference())
            .collect()
    };

    let mut timed_out = false;
    let mut stopped = false;
    let mut last_reported = usize::MAX;
    let mut waves: Vec<u32> = targets.iter().map(|(o, _)| *o).collect();
    waves.dedup();
    'waves: for wave in waves {
        let wave_targets: Vec<Target> = targets
            .iter()
            .filter(|(o, t)| *o == wave && t.action.removes())
            .map(|(_, t)| t.clone())
            .collect();
        let mut tasks = Vec::new();
        for t in &wave_targets {
            let t = t.clone();
            let client = client.clone();
            let state = state.clone();
            let semaphore = semaphore.clone();
            let retries = retries.clone();
            tasks.push(tokio::spawn(async move {
                let _permit = semaphore.acquire_owned().await;
                remove(&client, &t, &state, deadline, &retries).await;
            }));
        }
        // Wait for this wave's pods to be gone, reporting progress.
        loop {
            let notified = state.changed.notified();
            let present = state.present.lock().await.clone();
            let pending = report(&present);
            if pending.len() != last_reported {
                last_reported = pending.len();
                on_progress(pending);
            }
            if wave_targets.iter().all(|t| !present.contains(&t.uid)) {
                break;
            }
            let over = Instant::now() >= deadline;
            if over || cancelled() {
                timed_out = over;
                stopped = !over;
                for t in tasks {
                    t.abort();
                }
                break 'waves;
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
        for t in tasks {
            let _ = t.await;
        }
    }
    watch.abort();

    let m = &crate::metrics::METRICS.evictions;
    for (_, t) in &targets {
        match t.action {
            Action::Skip { .. } => m.with_label_values(&["skipped"]).inc(),
            Action::Block { .. } => m.with_label_values(&["blocked"]).inc(),
            _ => {}
        }
    }
    let present = state.present.lock().await.clone();
    let pdb = state.pdb_blocked.lock().await.clone();
    let pending: Vec<&Target> = removals
        .iter()
        .copied()
        .filter(|t| present.contains(&t.uid))
        .collect();
    let blocked: Vec<PodReference> = targets
        .iter()
        .filter(|(_, t)| matches!(t.action, Action::Block { .. }) && present.contains(&t.uid))
        .map(|(_, t)| t.reference())
        .collect();
    let mut message = String::new();
    // The Go operator's text where the situation is the same (tools parse
    // it): the attempt ran out of time waiting for a pod whose eviction was
    // accepted to go.
    let waited_for = pending.iter().find(|t| !pdb.contains(&t.uid));
    if let (true, Some(t)) = (timed_out, waited_for) {
        message = format!(
            "error when waiting for pod \"{}\" in namespace \"{}\" to terminate: context deadline exceeded",
            t.name, t.namespace
        );
    } else if !pending.is_empty() {
        let pdb_count = pending.iter().filter(|t| pdb.contains(&t.uid)).count();
        message = format!(
            "drain did not complete{}: {} pod(s) still on node {node}{}",
            if timed_out {
                format!(" within {:?}", plan.attempt_timeout)
            } else {
                String::new()
            },
            pending.len(),
            if pdb_count > 0 {
                format!(", {pdb_count} refused by a PodDisruptionBudget")
            } else {
                String::new()
            }
        );
        let last = state.last_error.lock().await.clone();
        if !last.is_empty() {
            message.push_str(&format!(" (last error: {last})"));
        }
    } else if let Some((t, reason)) = targets.iter().find_map(|(_, t)| match &t.action {
        Action::Block { reason } if present.contains(&t.uid) => Some((t, reason)),
        _ => None,
    }) {
        message = format!("pod {}/{} blocks the drain: {reason}", t.namespace, t.name);
    }
    Outcome {
        pdb_blocked: pending
            .iter()
            .filter(|t| pdb.contains(&t.uid))
            .map(|t| t.reference())
            .collect(),
        pending: pending.iter().map(|t| t.reference()).collect(),
        blocked,
        timed_out,
        message,
        cancelled: stopped,
        evicted: state.evicted.load(std::sync::atomic::Ordering::Relaxed),
        deleted: state.deleted.load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// Evicts or deletes one pod, retrying until accepted, gone, or the
/// deadline.
async fn remove(
    client: &Client,
    t: &Target,
    state: &Attempt,
    deadline: Instant,
    retries: &Retries,
) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &t.namespace);
    let preconditions = Preconditions {
        uid: Some(t.uid.clone()),
        resource_version: None,
    };
    loop {
        if !state.present.lock().await.contains(&t.uid) {
            return;
        }
        let result = match &t.action {
            Action::Evict {
                grace_period_seconds,
            } => {
                let mut dp = DeleteParams::default().preconditions(preconditions.clone());
                dp.grace_period_seconds = grace_period_seconds.map(|g| g as u32);
                api.evict(
                    &t.name,
                    &EvictParams {
                        delete_options: Some(dp),
                        ..Default::default()
                    },
                )
                .await
                .map(|_| ())
            }
            Action::Delete {
                grace_period_seconds,
            } => {
                let mut dp = DeleteParams::default().preconditions(preconditions.clone());
                dp.grace_period_seconds = grace_period_seconds.map(|g| g as u32);
                api.delete(&t.name, &dp).await.map(|_| ())
            }
            _ => return,
        };
        let wait = match result {
            Ok(()) => {
                let (counter, outcome) = if matches!(t.action, Action::Delete { .. }) {
                    (&state.deleted, "deleted")
                } else {
                    (&state.evicted, "evicted")
                };
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                crate::metrics::METRICS
                    .evictions
                    .with_label_values(&[outcome])
                    .inc();
                state.pdb_blocked.lock().await.remove(&t.uid);
                tracing::info!(logger = "drain", pod = %format!("{}/{}", t.namespace, t.name), "pod removed from node");
                return;
            }
            // Gone already, or a replacement with the same name: done.
            Err(kube::Error::Api(e))
                if e.code == 404 || (e.code == 409 && e.message.contains("Precondition")) =>
            {
                state.present.lock().await.remove(&t.uid);
                state.changed.notify_waiters();
                return;
            }
            Err(kube::Error::Api(e)) if e.code == 429 => {
                crate::metrics::METRICS
                    .evictions
                    .with_label_values(&["pdb-429"])
                    .inc();
                state.pdb_blocked.lock().await.insert(t.uid.clone());
                *state.last_error.lock().await =
                    format!("evicting pod {}/{}: {}", t.namespace, t.name, e.message);
                retries.pdb
            }
            Err(e) => {
                crate::metrics::METRICS
                    .evictions
                    .with_label_values(&["error"])
                    .inc();
                *state.last_error.lock().await =
                    format!("evicting pod {}/{}: {e}", t.namespace, t.name);
                retries.api_error
            }
        };
        if Instant::now() + wait >= deadline {
            return;
        }
        tokio::time::sleep(wait).await;
    }
}

/// Follows the node's pods and removes from `present` every uid that goes.
/// When the watch drops, lists again and resumes from there.
async fn watch_node(
    client: Client,
    node: String,
    mut rv: String,
    state: Arc<Attempt>,
    retry: Duration,
) {
    let api: Api<Pod> = Api::all(client);
    let fields = format!("spec.nodeName={node}");
    loop {
        let stream = match api
            .watch(
                &WatchParams::default()
                    .fields(&fields)
                    .timeout(crate::client::WATCH_TIMEOUT_SECS),
                &rv,
            )
            .await
        {
            Ok(s) => s,
            Err(_) => {
                tokio::time::sleep(retry).await;
                rv = relist(&api, &fields, &state).await.unwrap_or(rv);
                continue;
            }
        };
        let mut stream = stream.boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(WatchEvent::Deleted(p)) => {
                    if let Some(uid) = p.uid() {
                        state.present.lock().await.remove(&uid);
                        state.changed.notify_waiters();
                    }
                    rv = p.resource_version().unwrap_or(rv);
                }
                Ok(WatchEvent::Added(p) | WatchEvent::Modified(p)) => {
                    rv = p.resource_version().unwrap_or(rv)
                }
                Ok(WatchEvent::Bookmark(b)) => rv = b.metadata.resource_version,
                Ok(WatchEvent::Error(_)) | Err(_) => break,
            }
        }
        // The watch ended (timeout, dropped, 410 Gone): it may have missed
        // deletions, so list again and resume from there.
        if let Some(new_rv) = relist(&api, &fields, &state).await {
            rv = new_rv;
        }
    }
}

/// Lists the node's pods; every tracked uid no longer there is gone.
async fn relist(api: &Api<Pod>, fields: &str, state: &Attempt) -> Option<String> {
    let list = api
        .list(&kube::api::ListParams::default().fields(fields))
        .await
        .ok()?;
    let live: HashMap<String, ()> = list
        .items
        .iter()
        .filter_map(|p| p.uid())
        .map(|u| (u, ()))
        .collect();
    let mut present = state.present.lock().await;
    let before = present.len();
    present.retain(|uid| live.contains_key(uid));
    if present.len() != before {
        state.changed.notify_waiters();
    }
    list.metadata.resource_version
}
