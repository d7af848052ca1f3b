//! The NodeMaintenance controller: a kube-runtime controller whose
//! reconcile follows the Go operator step by step (see
//! `pass/reconcile.rs`), with every drain and failure decision taken from
//! the policy.
//!
//! This file is the controller's run loop: kube-runtime's controller over
//! a watch of NodeMaintenances, each reconcile timed and counted,
//! restarted when the API server's resourceVersions go backwards; the
//! watches the passes read, started with it. Below it, the rooms: `pass/`
//! (one pass: `reconcile.rs` its steps, `finish.rs` how it ends,
//! `status.rs` its writes), `drain/` (the executor and what it calls:
//! `surge/`, `handshake.rs`, `volumes.rs`, `ledger.rs`, `budgets.rs`,
//! `workloads.rs`) and `node/` (cordon, taints, the node lease); beside
//! them what every pass shares: `context.rs`, `memory.rs` (what is
//! remembered about each maintenance between passes), `next.rs` (when a
//! maintenance is looked at again), `events.rs`, `metrics.rs`; and
//! `leader.rs`, `orphans.rs`. What admission reads (the watched nodes,
//! leases and claims, the history) is `crate::admission`, which the
//! webhook and `nmo plan` use as peers.

pub mod drain;
pub mod node;
pub mod pass;

mod context;
pub(crate) mod events;
pub mod leader;
mod memory;
pub mod metrics;
mod next;
mod orphans;

pub use crate::crd::is_admitted;

pub use context::{Context, Settings};
pub use metrics::{ControllerMetrics, ReconcileResult};
pub use next::{Next, backoff};
use pass::reconcile::reconcile;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};

use crate::crd::{MaintenancePhase, NodeMaintenance};
use crate::error::{Error, Result};
use crate::sync::Locked;

fn error_policy(_nm: Arc<NodeMaintenance>, err: &Error, ctx: Arc<Context>) -> Action {
    tracing::error!(error = %err, category = err.category(), "reconcile failed");
    Action::requeue(ctx.settings().error_retry)
}

/// The reconcile, timed and counted under controller-runtime's names.
async fn instrumented(nm: Arc<NodeMaintenance>, ctx: Arc<Context>) -> Result<Action> {
    use futures::FutureExt;
    use tracing::Instrument;
    let started = std::time::Instant::now();
    let m = ctx.metrics().clone();
    let worker = m.reconcile_started();
    let name = nm.name_any();
    // A panic (a bug, or an API object nobody foresaw) fails this
    // reconcile only: it is logged, counted and retried; the process and
    // the other maintenances go on.
    // Every line of the pass (and of the tasks it spawns) carries the
    // maintenance and its node. At the error level, so that it is there
    // whatever level the log is filtered at.
    let span = tracing::error_span!(
        "reconcile",
        nodeMaintenance = %name,
        nodeName = %nm.spec.node_name
    );
    let result = match std::panic::AssertUnwindSafe(reconcile(nm, ctx).instrument(span.clone()))
        .catch_unwind()
        .await
    {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned());
            tracing::error!(parent: &span, panic = %what, "reconcile panicked");
            m.panicked();
            Err(Error::Panic(what))
        }
    };
    drop(worker);
    let label = match &result {
        Err(_) => ReconcileResult::Error,
        Ok(next) => next.result_label(),
    };
    m.reconciled(started.elapsed().as_secs_f64(), label);
    result.map(Action::from)
}

/// Runs the controller until it is asked to stop (SIGTERM, Ctrl-C).
///
/// The NodeMaintenance cache is kube-runtime's reflector, watched with
/// kube-runtime's watcher (which relists on a lost watch or a 410 Gone).
/// Beyond that, the API server's current resourceVersion is checked every
/// [`Settings::rewind_check`]: when it is below the newest one the cache
/// has seen, the server was restored from an older state and the watch
/// would wait for a version that never comes, so the cache is dropped and
/// everything is listed again. Readiness follows: not ready until the
/// cache has synced, nor while the watch is failing.
pub async fn run(ctx: Arc<Context>) -> Result<()> {
    let api: Api<NodeMaintenance> = Api::all(ctx.client().clone());
    api.list_metadata(&kube::api::ListParams::default().limit(1))
        .await
        .map_err(Error::kube(
            "listing NodeMaintenances (is the CRD installed? `nmo crd | kubectl apply -f -`)",
        ))?;
    ctx.metrics()
        .set_max_concurrent(ctx.settings().max_concurrent);
    // However the run ends (dropped when leadership is lost), the context
    // is a standby's again.
    struct StandBy<'a>(&'a Context);
    impl Drop for StandBy<'_> {
        fn drop(&mut self) {
            self.0.stand_by();
        }
    }
    let _stand_by = StandBy(&ctx);
    // The watches the passes read (the budgets', the nodes', the leases',
    // other tools' claims) run as long as the controller does.
    let _watches = start_watches(&ctx);
    loop {
        match run_once(&ctx, &api).await {
            Ended::Stopped => return Ok(()),
            Ended::Rewound { server, seen } => {
                tracing::warn!(
                    server_resource_version = server,
                    seen_resource_version = seen,
                    "the API server's resourceVersion went backwards (restored from an older state?); listing everything again"
                );
            }
        }
    }
}

/// A watch error in words: what failed, and the API server's own message
/// (not the client library's wrapping of it), with a hint when the
/// resource is not served at all.
fn watch_error(e: &watcher::Error) -> String {
    let api = |what: &str, e: &kube::Error| match e {
        kube::Error::Api(s) if s.code == 404 => format!(
            "{what}: the API server does not serve NodeMaintenances (is the CRD installed? `nmo crd | kubectl apply -f -`)"
        ),
        kube::Error::Api(s) => format!("{what}: {} ({})", s.message, s.code),
        other => format!("{what}: {other}"),
    };
    match e {
        watcher::Error::InitialListFailed(e) => api("listing NodeMaintenances", e),
        watcher::Error::WatchStartFailed(e) => api("watching NodeMaintenances", e),
        watcher::Error::WatchFailed(e) => api("the NodeMaintenance watch broke", e),
        watcher::Error::WatchError(s) => {
            format!("the API server ended the watch: {} ({})", s.message, s.code)
        }
        watcher::Error::NoResourceVersion => {
            "the API server's list has no resourceVersion: it cannot be watched".into()
        }
    }
}

/// Whether a watch event may let a waiting maintenance start: another
/// one is gone (its node restored) or failed (its node given back).
fn frees_a_place(e: &watcher::Event<NodeMaintenance>) -> bool {
    match e {
        watcher::Event::Delete(_) => true,
        watcher::Event::Apply(nm) => {
            nm.status.as_ref().and_then(|s| s.phase) == Some(MaintenancePhase::Failed)
        }
        _ => false,
    }
}

/// Queues a pass for every maintenance waiting for admission, oldest
/// first (the order their policy is asked in).
fn recheck_waiting(
    ctx: &Context,
    store: &Store<NodeMaintenance>,
    tx: &futures::channel::mpsc::UnboundedSender<
        kube::runtime::reflector::ObjectRef<NodeMaintenance>,
    >,
) {
    let mut waiting: Vec<Arc<NodeMaintenance>> = store
        .state()
        .into_iter()
        .filter(|nm| !is_admitted(nm) && nm.metadata.deletion_timestamp.is_none())
        .collect();
    waiting.sort_by(|a, b| {
        (
            a.metadata.creation_timestamp.as_ref().map(|t| t.0),
            a.name_any(),
        )
            .cmp(&(
                b.metadata.creation_timestamp.as_ref().map(|t| t.0),
                b.name_any(),
            ))
    });
    for nm in waiting {
        // The pass must look, though the object is at our own last write
        // (and though a pass of it may be running now and remember a wait
        // when it ends).
        ctx.memory.force(&nm.uid().unwrap_or_default());
        let _ = tx.unbounded_send(kube::runtime::reflector::ObjectRef::from_obj(&*nm));
    }
}

/// SIGTERM or Ctrl-C (what kube-runtime's graceful shutdown waits for).
pub async fn stop_signal() {
    #[cfg(unix)]
    {
        let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
        match term {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Why one run of the controller ended.
enum Ended {
    Stopped,
    Rewound { server: u64, seen: u64 },
}

/// The newest resourceVersion in an object, as a number (they are etcd
/// revisions; an opaque one counts as 0, which never looks rewound).
fn rv_of(nm: &NodeMaintenance) -> u64 {
    nm.resource_version()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

/// Lists one NodeMaintenance every `Settings::rewind_check` and ends
/// when the API server's resourceVersion is below what the watch has
/// shown (restored from an older state); waits while the CRD is missing,
/// saying so once.
async fn watch_for_rewind(
    ctx: &Context,
    api: &Api<NodeMaintenance>,
    seen: &std::sync::atomic::AtomicU64,
) -> Ended {
    loop {
        tokio::time::sleep(ctx.settings().rewind_check).await;
        // What the watch had shown before the list is asked for: the
        // server's answer is at least that, unless it went back. (Read
        // after the answer, it may hold events newer than the answer,
        // written while the answer travelled: a rewind that was not.)
        let seen = seen.load(Ordering::Relaxed);
        let list = match api
            .list_metadata(&kube::api::ListParams::default().limit(1))
            .await
        {
            Ok(list) => list,
            Err(kube::Error::Api(e)) if e.code == 404 => {
                if !ctx.health.crd_missing.swap(true, Ordering::Relaxed) {
                    tracing::error!(
                        "the API server serves no NodeMaintenances: the CRD is missing (`nmo crd | kubectl apply -f -`)"
                    );
                }
                continue;
            }
            Err(_) => continue,
        };
        if ctx.health.crd_missing.swap(false, Ordering::Relaxed) {
            tracing::info!("the NodeMaintenance CRD is back");
        }
        let server: u64 = list
            .metadata
            .resource_version
            .and_then(|rv| rv.parse().ok())
            .unwrap_or(u64::MAX);
        if server < seen {
            return Ended::Rewound { server, seen };
        }
    }
}

async fn run_once(ctx: &Arc<Context>, api: &Api<NodeMaintenance>) -> Ended {
    use kube::runtime::{WatchStreamExt, reflector};
    let (reader, writer) = reflector::store();
    ctx.health.start_over(Some(reader.clone()));
    // Maintenances waiting for admission are asked again when another one
    // ends.
    let (recheck_tx, recheck_rx) = futures::channel::mpsc::unbounded();
    let requeue = recheck_tx.clone();
    let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stream = {
        let ctx = ctx.clone();
        let seen = seen.clone();
        let reader = reader.clone();
        watcher(
            api.clone(),
            watcher::Config::default().timeout(crate::client::WATCH_TIMEOUT_SECS),
        )
        .default_backoff()
        .reflect(writer)
        .inspect(move |event| match event {
            Ok(e) => {
                if !ctx.health.watch_ok.swap(true, Ordering::Relaxed) {
                    tracing::info!("the NodeMaintenance watch works again");
                }
                if frees_a_place(e) {
                    recheck_waiting(&ctx, &reader, &recheck_tx);
                }
                if let watcher::Event::Delete(nm) = e {
                    // Gone from the API: nothing of it is kept.
                    ctx.memory.forget(&nm.uid().unwrap_or_default());
                }
                let newest = match e {
                    watcher::Event::Apply(nm)
                    | watcher::Event::Delete(nm)
                    | watcher::Event::InitApply(nm) => rv_of(nm),
                    watcher::Event::InitDone => {
                        // The initial list is in the cache (the reflector
                        // applied it before this): synced, whatever was
                        // deleted meanwhile.
                        if !ctx.health.synced.swap(true, Ordering::Relaxed) {
                            tracing::info!("cache synced");
                        }
                        0
                    }
                    watcher::Event::Init => 0,
                };
                seen.fetch_max(newest, Ordering::Relaxed);
            }
            Err(e) => {
                *ctx.health.watch_failed_at.locked() =
                    Some(std::time::Instant::now());
                if ctx.health.watch_ok.swap(false, Ordering::Relaxed) {
                    tracing::warn!(error = %watch_error(e), "the NodeMaintenance watch failed; retrying");
                }
            }
        })
        .touched_objects()
    };
    let controller = Controller::for_stream(stream, reader)
        // Every maintenance may have a pass at once: a pass waits for a
        // slot (`Context::slots`) for its own work, and a drain, waiting or
        // removing pods, holds none.
        .with_config(ControllerConfig::default().concurrency(0))
        .reconcile_on(recheck_rx);
    // kube-runtime's shutdown waits for the passes in progress: on the
    // same stop, their drains and waits end at once.
    let controller = controller.graceful_shutdown_on(ctx.stopped());
    let _stop = ctx.settings().stop_on_signal.then(|| {
        let ctx = ctx.clone();
        crate::task::spawn(async move {
            stop_signal().await;
            ctx.stop();
        })
    });
    let controller = controller
        .run(instrumented, error_policy, ctx.clone())
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "reconcile result");
            }
        });
    let rewound = watch_for_rewind(ctx, api, &seen);
    tokio::select! {
        () = controller => Ended::Stopped,
        ended = rewound => ended,
        () = orphans::run(ctx, &requeue) => Ended::Stopped,
    }
}

/// Starts every watch the passes read, each in a span naming it: the
/// budgets', and admission's fleet (the nodes, the leases, other tools'
/// claims) unless the process follows it already (for the webhook). They
/// end when the returned handles are dropped (with the controller's run).
fn start_watches(ctx: &Context) -> (crate::task::Owned<()>, Arc<crate::admission::Following>) {
    use tracing::Instrument;
    let budgets = ctx.drains.budgets.clone();
    let client = ctx.client().clone();
    (
        crate::task::spawn(
            async move { budgets.watch(client).await }
                .instrument(tracing::error_span!("watch", of = "budgets")),
        ),
        ctx.watched.follow_fleet(
            ctx.client(),
            &ctx.settings().lease_namespace,
            ctx.settings().tool_api_recheck,
        ),
    )
}
