//! The NodeMaintenance controller: a kube-runtime controller whose
//! reconcile follows the Go operator step by step (see `reconcile.rs`),
//! with every drain and failure decision taken from the policy.

pub mod drain;
pub mod events;
mod finish;
pub mod leader;
pub mod lease;
pub mod node;
mod orphans;
mod reconcile;
mod status;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use crate::crd::{MaintenancePhase, NodeMaintenance};
use crate::error::{Error, Result};
use crate::metrics::{CONTROLLER, Metrics};
use crate::policy::{PolicyStore, Selected};

pub(crate) use reconcile::decide;
pub use reconcile::{Next, reconcile};

/// What the controller needs to know.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Maintenances reconciled at once (`--max-concurrent-maintenances`).
    pub max_concurrent: u16,
    /// Namespace of node leases (the binary reads `LEASE_NAMESPACE`).
    pub lease_namespace: String,
    /// Name of this instance, for events (the binary reads `HOSTNAME`).
    pub instance: String,
    /// How often the API server's resourceVersion is compared with the
    /// newest the cache has seen (see [`run`]).
    pub rewind_check: Duration,
    /// How long after a watch failure, with no event since, the operator
    /// still reports itself not ready (see [`Context::watching`]); above
    /// the watcher's longest back-off (30 s).
    pub watch_failure_window: Duration,
    /// How long the drain waits before trying a pod again (after a
    /// PodDisruptionBudget's 429, after another API error).
    pub drain_retries: drain::Retries,
    /// When a Succeeded maintenance is looked at again (its lease renewed).
    pub renew_interval: Duration,
    /// When a maintenance whose policy could not decide is tried again.
    pub policy_error_retry: Duration,
    /// When a reconcile that failed (an API error) is tried again.
    pub error_retry: Duration,
    /// Stop at SIGTERM or Ctrl-C (the operator). Off where the caller
    /// decides when to stop (the demo, which still has to end its
    /// maintenance after Ctrl-C).
    pub stop_on_signal: bool,
    /// The cluster is OpenShift: `admit` gets the etcd quorum guard.
    pub openshift: bool,
    /// A maintenance waiting for admission is asked again at least this
    /// often (node changes are not watched; the end of another maintenance
    /// is, and asks at once).
    pub admission_recheck: Duration,
    /// A policy's `recheck-after` is never shorter than this: a policy
    /// asking for 0 s does not turn admission into a busy loop.
    pub admission_recheck_min: Duration,
    /// A waiting maintenance's reason (its status and `Waiting` event) is
    /// written at most this often when the policy's reason keeps changing.
    pub waiting_update_interval: Duration,
    /// How often nodes marked by this operator with no NodeMaintenance
    /// left are looked for and restored (see `orphans.rs`).
    pub orphan_sweep: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_concurrent: 10,
            lease_namespace: lease::DEFAULT_NAMESPACE.to_owned(),
            instance: "nmo".to_owned(),
            rewind_check: Duration::from_secs(10),
            watch_failure_window: Duration::from_secs(35),
            drain_retries: drain::Retries::default(),
            renew_interval: reconcile::RENEW_INTERVAL,
            policy_error_retry: reconcile::POLICY_ERROR_RETRY,
            error_retry: Duration::from_secs(5),
            stop_on_signal: true,
            openshift: false,
            admission_recheck: Duration::from_secs(10),
            admission_recheck_min: Duration::from_secs(2),
            waiting_update_interval: Duration::from_secs(30),
            orphan_sweep: Duration::from_secs(60),
        }
    }
}

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    /// The policies, as loaded (and reloaded) from the policy directory.
    pub policies: Arc<PolicyStore>,
    recorder: events::Recorder,
    leases: lease::LeaseManager,
    pub settings: Settings,
    /// Where everything is counted: the registry the operator serves (its
    /// policy engine's).
    pub metrics: Arc<Metrics>,
    /// Consecutive failures per NodeMaintenance uid (the policy's `attempt`
    /// and the backoff's exponent).
    failures: Mutex<HashMap<String, u32>>,
    /// When a maintenance that failed may be tried again, by uid: the
    /// policy's verdict holds whatever wakes the reconcile earlier (our own
    /// status write, a watch event), so one attempt gets one `on-failure`
    /// and a retry never comes sooner than the verdict said.
    retry_at: Mutex<HashMap<String, std::time::Instant>>,
    /// The controller's cache of NodeMaintenances, once it runs.
    store: Mutex<Option<Store<NodeMaintenance>>>,
    /// The cache has synced.
    synced: AtomicBool,
    /// The NodeMaintenance watch's last event was not an error.
    watch_ok: AtomicBool,
    /// When the watch last failed.
    watch_failed_at: Mutex<Option<std::time::Instant>>,
    /// The API server answered that it serves no NodeMaintenances (the
    /// CRD is missing), at the last look.
    crd_missing: AtomicBool,
    /// The policy each maintenance started with, by uid: a maintenance
    /// finishes with the policy it started with, whatever reloads happen
    /// meanwhile.
    pins: Mutex<HashMap<String, Selected>>,
    /// Our own recent writes to each maintenance (by uid), and when the
    /// pass that made them wanted the next look: a pass woken by one of
    /// these writes has nothing to do.
    own: Mutex<HashMap<String, OwnWrites>>,
    /// Held while one maintenance's admission is decided (and, when
    /// admitted, counted in `admitted_here`): two admissions never see a
    /// stale view of each other.
    pub(crate) admission: tokio::sync::Mutex<()>,
    /// Maintenances this process admitted (by uid), which the cache may
    /// not show admitted yet.
    admitted_here: Mutex<std::collections::HashSet<String>>,
    /// When each waiting maintenance's reason was last written (status and
    /// event): a reason that changes on every call is written at most every
    /// [`Settings::waiting_update_interval`].
    waiting_written: Mutex<HashMap<String, std::time::Instant>>,
    /// The last list of the nodes for admission, and when it was asked
    /// for; held while a list is made, so admissions asking at once share
    /// one (see [`Context::fresh_nodes`]).
    nodes_listed:
        tokio::sync::Mutex<Option<(std::time::Instant, Arc<[k8s_openapi::api::core::v1::Node]>)>>,
    /// Maintenances whose next pass must look even if it was woken by our
    /// own write (a place freed for a waiting one), by uid.
    forced: Mutex<std::collections::HashSet<String>>,
}

/// Our recent writes to one maintenance.
#[derive(Default)]
struct OwnWrites {
    /// The resourceVersions our writes produced, newest last.
    versions: std::collections::VecDeque<String>,
    /// When the last completed pass wanted the next one: `None` while a
    /// pass runs (or after one that failed).
    next: Option<(std::time::Instant, Next)>,
}

/// How many of our writes to one maintenance are remembered.
const OWN_WRITES_KEPT: usize = 64;

impl Context {
    pub fn new(client: Client, policies: Arc<PolicyStore>, settings: Settings) -> Arc<Self> {
        Arc::new(Context {
            recorder: events::Recorder::new(client.clone(), settings.instance.clone()),
            leases: lease::LeaseManager::new(client.clone(), settings.lease_namespace.clone()),
            client,
            metrics: policies.metrics().clone(),
            policies,
            settings,
            failures: Mutex::new(HashMap::new()),
            retry_at: Mutex::new(HashMap::new()),
            store: Mutex::new(None),
            synced: AtomicBool::new(false),
            watch_ok: AtomicBool::new(true),
            crd_missing: AtomicBool::new(false),
            watch_failed_at: Mutex::new(None),
            pins: Mutex::new(HashMap::new()),
            own: Mutex::new(HashMap::new()),
            admission: tokio::sync::Mutex::new(()),
            nodes_listed: tokio::sync::Mutex::new(None),
            admitted_here: Mutex::new(std::collections::HashSet::new()),
            waiting_written: Mutex::new(HashMap::new()),
            forced: Mutex::new(std::collections::HashSet::new()),
        })
    }

    /// The nodes, as listed by a request made after this call: admissions
    /// that ask while a list is in flight wait for the next one, and those
    /// waiting share it, so 50 maintenances created at once cost a few
    /// lists, not 50, and none reads nodes older than its own question.
    pub async fn fresh_nodes(&self) -> Result<Arc<[k8s_openapi::api::core::v1::Node]>> {
        let asked = std::time::Instant::now();
        let mut listed = self.nodes_listed.lock().await;
        if let Some((at, nodes)) = listed.as_ref()
            && *at >= asked
        {
            return Ok(nodes.clone());
        }
        let at = std::time::Instant::now();
        let nodes: Arc<[_]> = crate::admission::nodes(&self.client).await?.into();
        *listed = Some((at, nodes.clone()));
        Ok(nodes)
    }

    /// Whether `nm` was admitted, by its status or by this process (whose
    /// write the cache may not have seen yet).
    pub fn admitted(&self, nm: &NodeMaintenance) -> bool {
        is_admitted(nm)
            || self
                .admitted_here
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&nm.uid().unwrap_or_default())
    }

    /// The next pass of `uid` looks, whatever woke it.
    fn force(&self, uid: &str) {
        self.forced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid.to_owned());
    }

    /// Whether the pass starting now was forced (and clears it).
    fn take_forced(&self, uid: &str) -> bool {
        self.forced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid)
    }

    /// Records that this process admitted the maintenance `uid`.
    pub(crate) fn admitted_now(&self, uid: &str) {
        self.admitted_here
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid.to_owned());
    }

    /// Forgets that this process admitted `uid` (it starts over).
    pub(crate) fn readmit(&self, uid: &str) {
        self.admitted_here
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
    }

    /// Every NodeMaintenance in the controller's cache.
    pub(crate) fn cached_maintenances(&self) -> Vec<Arc<NodeMaintenance>> {
        let store = self.store.lock().unwrap_or_else(|p| p.into_inner()).clone();
        store.map(|s| s.state()).unwrap_or_default()
    }

    /// The policy that decides for `nm`: the one it started with, or, at
    /// its first decision, the one the current set selects (its annotation,
    /// a rule matching the node's labels, or the default), which is then
    /// kept until the maintenance is deleted.
    pub fn policy_for(
        &self,
        nm: &NodeMaintenance,
        node: Option<&k8s_openapi::api::core::v1::Node>,
    ) -> Result<Selected> {
        let uid = nm.uid().unwrap_or_default();
        let mut pins = self.pins.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = pins.get(&uid) {
            return Ok(s.clone());
        }
        let selected = self
            .policies
            .current()
            .select_for(nm, node.map(|n| n.labels()))?;
        tracing::info!(
            logger = "controller",
            nodeMaintenance = %nm.name_any(),
            policy = %selected.name,
            digest = selected.policy.digest(),
            chosen_by = %selected.why,
            "policy selected"
        );
        pins.insert(uid, selected.clone());
        Ok(selected)
    }

    /// Whether the maintenance `name` (uid `uid`, on `node`) is, as the
    /// controller's cache sees it now, gone, being deleted, or moved to
    /// another node: a drain in progress for it should stop.
    pub fn no_longer_wants(&self, name: &str, uid: &str, node: &str) -> bool {
        let store = self.store.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(store) = store else { return false };
        match store.get(&kube::runtime::reflector::ObjectRef::new(name)) {
            None => true,
            Some(nm) => {
                nm.uid().as_deref() != Some(uid)
                    || nm.metadata.deletion_timestamp.is_some()
                    || nm.spec.node_name != node
            }
        }
    }

    /// Remembers that our write gave the maintenance `uid` the
    /// resourceVersion `rv`.
    fn own_write(&self, uid: &str, rv: String) {
        let mut own = self.own.lock().unwrap_or_else(|p| p.into_inner());
        let writes = own.entry(uid.to_owned()).or_default();
        writes.versions.push_back(rv);
        while writes.versions.len() > OWN_WRITES_KEPT {
            writes.versions.pop_front();
        }
    }

    /// When the maintenance is at a version our own write made and the
    /// last pass's wish for the next one still stands: that wish (what is
    /// left of its wait). `None`: a pass has work to do.
    fn after_own_write(&self, uid: &str, rv: Option<&str>) -> Option<Next> {
        let own = self.own.lock().unwrap_or_else(|p| p.into_inner());
        let writes = own.get(uid)?;
        let rv = rv?;
        if !writes.versions.iter().any(|v| v == rv) {
            return None;
        }
        match writes.next? {
            (_, Next::Change) => Some(Next::Change),
            (since, Next::After(d)) => {
                let left = d.checked_sub(since.elapsed())?;
                (!left.is_zero()).then_some(Next::After(left))
            }
        }
    }

    /// A pass starts: the last one's wish no longer stands.
    fn forget_next(&self, uid: &str) {
        if let Some(w) = self
            .own
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(uid)
        {
            w.next = None;
        }
    }

    /// A pass ended wanting `next`.
    fn remember_next(&self, uid: &str, next: Next) {
        self.own
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(uid.to_owned())
            .or_default()
            .next = Some((std::time::Instant::now(), next));
    }

    /// Forgets everything about a maintenance that is gone.
    fn forget(&self, uid: &str) {
        self.succeeded(uid);
        self.unpin(uid);
        self.readmit(uid);
        self.waiting_written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
        self.own
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
    }

    /// Whether a waiting maintenance's new reason may be written now (and,
    /// if so, notes that it is): the first always, then at most one every
    /// [`Settings::waiting_update_interval`].
    fn may_write_reason(&self, uid: &str) -> bool {
        let mut written = self
            .waiting_written
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        match written.get(uid) {
            Some(at) if now.duration_since(*at) < self.settings.waiting_update_interval => false,
            _ => {
                written.insert(uid.to_owned(), now);
                true
            }
        }
    }

    /// Forgets the policy a maintenance started with (it is gone).
    fn unpin(&self, uid: &str) {
        self.pins
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
    }

    /// Whether the controller has started (a standby replica waiting for
    /// leadership has not).
    pub fn started(&self) -> bool {
        self.store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Whether the controller's cache has synced.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// Whether the NodeMaintenance CRD was missing at the last look (every
    /// [`Settings::rewind_check`]).
    pub fn crd_missing(&self) -> bool {
        self.crd_missing.load(Ordering::Relaxed)
    }

    /// Whether the NodeMaintenance watch is working: no failure since
    /// its last event, or none within [`Settings::watch_failure_window`]
    /// (a watch that resumed quietly sends nothing until something
    /// changes; a failing one fails again at least that often, as the
    /// watcher's back-off is shorter).
    pub fn watching(&self) -> bool {
        if self.watch_ok.load(Ordering::Relaxed) {
            return true;
        }
        let failed_at = *self
            .watch_failed_at
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        failed_at.is_none_or(|at| at.elapsed() > self.settings.watch_failure_window)
    }

    /// Sets the per-maintenance gauges from the controller's cache (called
    /// at each scrape, so they are never stale).
    pub fn refresh_gauges(&self) {
        let store = self.store.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(store) = store else { return };
        let mut counts: HashMap<&'static str, i64> =
            crate::metrics::PHASES.into_iter().map(|p| (p, 0)).collect();
        let m = &self.metrics;
        m.drain_progress.reset();
        for nm in store.state() {
            let status = nm.status.clone().unwrap_or_default();
            let phase = match (status.phase, &status.waiting) {
                (Some(p), _) => p.as_str(),
                (None, Some(_)) => "Waiting",
                (None, None) => "Pending",
            };
            *counts.entry(phase).or_default() += 1;
            m.drain_progress
                .with_label_values(&[nm.name_any().as_str(), nm.spec.node_name.as_str()])
                .set(status.drain_progress as i64);
        }
        for (phase, n) in counts {
            m.maintenances.with_label_values(&[phase]).set(n);
        }
        // Kept current at every scrape, not only when /readyz is asked.
        m.ready.set(i64::from(self.synced() && self.watching()));
    }

    /// Counts a failure; returns how many in a row.
    fn failed(&self, uid: &str) -> u32 {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = f.entry(uid.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// How many failures in a row so far.
    fn failures(&self, uid: &str) -> u32 {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(uid)
            .copied()
            .unwrap_or(0)
    }

    fn succeeded(&self, uid: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
        self.retry_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
    }

    /// Holds the maintenance's next attempt until `delay` from now.
    fn hold(&self, uid: &str, delay: Duration) {
        self.retry_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid.to_owned(), std::time::Instant::now() + delay);
    }

    /// How long the maintenance's next attempt is still held, if it is.
    fn held(&self, uid: &str) -> Option<Duration> {
        let mut held = self.retry_at.lock().unwrap_or_else(|p| p.into_inner());
        let at = *held.get(uid)?;
        let left = at.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            held.remove(uid);
            return None;
        }
        Some(left)
    }
}

/// controller-runtime's default per-item backoff (5 ms doubling, at most
/// 1000 s), never shorter than [`MIN_RETRY`](crate::policy::validate::MIN_RETRY):
/// the first retries wait 1 s, then it doubles as controller-runtime's does.
pub fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(30);
    Duration::from_millis(5u64.saturating_mul(1 << exp)).clamp(
        crate::policy::validate::MIN_RETRY,
        Duration::from_secs(1000),
    )
}

fn error_policy(_nm: Arc<NodeMaintenance>, err: &Error, ctx: Arc<Context>) -> Action {
    tracing::error!(logger = "controller", error = %err, category = err.category(), "reconcile failed");
    Action::requeue(ctx.settings.error_retry)
}

/// The reconcile, timed and counted under controller-runtime's names.
async fn instrumented(nm: Arc<NodeMaintenance>, ctx: Arc<Context>) -> Result<Action> {
    use futures::FutureExt;
    let started = std::time::Instant::now();
    let m = ctx.metrics.clone();
    let workers = m.active_workers.with_label_values(&[CONTROLLER]);
    workers.inc();
    let name = nm.name_any();
    // A panic (a bug, or an API object nobody foresaw) fails this
    // reconcile only: it is logged, counted and retried; the process and
    // the other maintenances go on.
    let result = match std::panic::AssertUnwindSafe(reconcile(nm, ctx))
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
            tracing::error!(logger = "controller", nodeMaintenance = %name, panic = %what, "reconcile panicked");
            Err(Error::Panic(what))
        }
    };
    workers.dec();
    let secs = started.elapsed().as_secs_f64();
    m.reconcile_duration
        .with_label_values(&[CONTROLLER])
        .observe(secs);
    m.reconcile_time
        .with_label_values(&[CONTROLLER])
        .observe(secs);
    let label = match &result {
        Err(_) => "error",
        Ok(a) if *a == Action::await_change() => "success",
        Ok(_) => "requeue_after",
    };
    m.reconcile_total
        .with_label_values(&[CONTROLLER, label])
        .inc();
    if result.is_err() {
        m.reconcile_errors.with_label_values(&[CONTROLLER]).inc();
    }
    result
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
    let api: Api<NodeMaintenance> = Api::all(ctx.client.clone());
    api.list_metadata(&kube::api::ListParams::default().limit(1))
        .await
        .map_err(Error::kube(
            "listing NodeMaintenances (is the CRD installed? `nmo crd | kubectl apply -f -`)",
        ))?;
    ctx.metrics
        .max_concurrent_reconciles
        .with_label_values(&[CONTROLLER])
        .set(i64::from(ctx.settings.max_concurrent));
    loop {
        match run_once(&ctx, &api).await {
            Ended::Stopped => return Ok(()),
            Ended::Rewound { server, seen } => {
                tracing::warn!(
                    logger = "controller",
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
        ctx.force(&nm.uid().unwrap_or_default());
        let _ = tx.unbounded_send(kube::runtime::reflector::ObjectRef::from_obj(&*nm));
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

async fn run_once(ctx: &Arc<Context>, api: &Api<NodeMaintenance>) -> Ended {
    use kube::runtime::{WatchStreamExt, reflector};
    let (reader, writer) = reflector::store();
    *ctx.store.lock().unwrap_or_else(|p| p.into_inner()) = Some(reader.clone());
    // Maintenances waiting for admission are asked again when another one
    // ends.
    let (recheck_tx, recheck_rx) = futures::channel::mpsc::unbounded();
    ctx.synced.store(false, Ordering::Relaxed);
    ctx.watch_ok.store(true, Ordering::Relaxed);
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
                if !ctx.watch_ok.swap(true, Ordering::Relaxed) {
                    tracing::info!(logger = "controller", "the NodeMaintenance watch works again");
                }
                if frees_a_place(e) {
                    recheck_waiting(&ctx, &reader, &recheck_tx);
                }
                let newest = match e {
                    watcher::Event::Apply(nm)
                    | watcher::Event::Delete(nm)
                    | watcher::Event::InitApply(nm) => rv_of(nm),
                    watcher::Event::InitDone => {
                        // The initial list is in the cache (the reflector
                        // applied it before this): synced, whatever was
                        // deleted meanwhile.
                        if !ctx.synced.swap(true, Ordering::Relaxed) {
                            tracing::info!(logger = "controller", "cache synced");
                        }
                        0
                    }
                    watcher::Event::Init => 0,
                };
                seen.fetch_max(newest, Ordering::Relaxed);
            }
            Err(e) => {
                *ctx.watch_failed_at.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(std::time::Instant::now());
                if ctx.watch_ok.swap(false, Ordering::Relaxed) {
                    tracing::warn!(logger = "controller", error = %watch_error(e), "the NodeMaintenance watch failed; retrying");
                }
            }
        })
        .touched_objects()
    };
    let controller = Controller::for_stream(stream, reader)
        .with_config(ControllerConfig::default().concurrency(ctx.settings.max_concurrent))
        .reconcile_on(recheck_rx);
    let controller = if ctx.settings.stop_on_signal {
        controller.shutdown_on_signal()
    } else {
        controller
    };
    let controller = controller
        .run(instrumented, error_policy, ctx.clone())
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(logger = "controller", error = %e, "reconcile result");
            }
        });
    let rewound = async {
        loop {
            tokio::time::sleep(ctx.settings.rewind_check).await;
            let list = match api
                .list_metadata(&kube::api::ListParams::default().limit(1))
                .await
            {
                Ok(list) => list,
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    if !ctx.crd_missing.swap(true, Ordering::Relaxed) {
                        tracing::error!(
                            logger = "controller",
                            "the API server serves no NodeMaintenances: the CRD is missing (`nmo crd | kubectl apply -f -`)"
                        );
                    }
                    continue;
                }
                Err(_) => continue,
            };
            if ctx.crd_missing.swap(false, Ordering::Relaxed) {
                tracing::info!(logger = "controller", "the NodeMaintenance CRD is back");
            }
            let server: u64 = list
                .metadata
                .resource_version
                .and_then(|rv| rv.parse().ok())
                .unwrap_or(u64::MAX);
            let seen = seen.load(Ordering::Relaxed);
            if server < seen {
                return Ended::Rewound { server, seen };
            }
        }
    };
    tokio::select! {
        () = controller => Ended::Stopped,
        ended = rewound => ended,
        () = orphans::run(ctx) => Ended::Stopped,
    }
}

/// Whether a maintenance was admitted: its phase is set (it started, or
/// finished), or the policy admitted it (`status.admittedAt`).
pub fn is_admitted(nm: &NodeMaintenance) -> bool {
    nm.status
        .as_ref()
        .is_some_and(|s| s.phase.is_some() || s.admitted_at.is_some())
}
