//! The controller's context: its settings, clients and caches, shared by
//! every reconcile, and how ready it is.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};

use super::drain;
use super::events;
use super::memory::Memories;
use super::metrics::{ControllerMetrics, State};
use super::node::lease;
use crate::crd::NodeMaintenance;
use crate::error::Result;
use crate::policy::{PolicyStore, Selected};
use crate::sync::Locked;

/// How often a finished maintenance is looked at again (renewing the node
/// lease well within its 3600 s).
pub(crate) const RENEW_INTERVAL: Duration = Duration::from_secs(30 * 60);
/// How long to wait after a policy error before asking again.
pub(crate) const POLICY_ERROR_RETRY: Duration = Duration::from_secs(30);
/// What the controller needs to know.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Maintenance passes at once, drains not counted
    /// (`--max-concurrent-maintenances`).
    pub max_concurrent: u16,
    /// Evictions and deletions of pods the whole operator has in flight at
    /// once (`--max-removals-in-flight`), every drain's together: many
    /// drains at once share the API server rather than flood it.
    pub removals_in_flight: u16,
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
    /// How often another tool's API that is not served (Cluster API's
    /// Machines, NVIDIA's NodeMaintenances) is looked for again.
    pub tool_api_recheck: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_concurrent: 10,
            removals_in_flight: crate::cluster::HOST_MAX_CONCURRENT as u16,
            lease_namespace: lease::DEFAULT_NAMESPACE.to_owned(),
            instance: "nmo".to_owned(),
            rewind_check: Duration::from_secs(10),
            watch_failure_window: Duration::from_secs(35),
            drain_retries: drain::Retries::default(),
            renew_interval: RENEW_INTERVAL,
            policy_error_retry: POLICY_ERROR_RETRY,
            error_retry: Duration::from_secs(5),
            stop_on_signal: true,
            openshift: false,
            admission_recheck: Duration::from_secs(10),
            admission_recheck_min: Duration::from_secs(2),
            waiting_update_interval: Duration::from_secs(30),
            orphan_sweep: Duration::from_secs(60),
            tool_api_recheck: crate::admission::claims::LOOK_AGAIN,
        }
    }
}

/// Shared by every reconcile, in parts: the client, the policies, the
/// settings and the metrics every part uses; what the controller writes
/// besides maintenances (`writers`); how its own watch goes (`health`);
/// what admission holds (`admission`) and reads (`watched`); what every
/// drain shares (`drains`); what is remembered of each maintenance
/// (`memory`); and the passes' slots.
pub struct Context {
    client: Client,
    /// The policies, as loaded (and reloaded) from the policy directory.
    policies: Arc<PolicyStore>,
    settings: Settings,
    /// Where the controller counts (on the registry the operator serves).
    metrics: ControllerMetrics,
    pub(super) writers: Writers,
    pub(super) health: Health,
    pub(crate) admission: Admission,
    /// The nodes, the medik8s leases and other tools' claims, watched
    /// while the controller runs (and while the webhook serves, which
    /// shares them): admission's fleet.
    pub(super) watched: Arc<crate::admission::Watched>,
    pub(super) drains: drain::Shared,
    /// What is remembered about each maintenance between passes.
    pub(super) memory: Memories,
    /// The passes that work at once (`max_concurrent`): held from a
    /// pass's start to its drain, never by a drain (see
    /// docs/architecture.md, the concurrency model).
    pub(super) slots: Arc<tokio::sync::Semaphore>,
}

/// What the controller writes besides maintenances.
pub(super) struct Writers {
    /// Events, as the Go operator records them.
    pub recorder: events::Recorder,
    /// The medik8s node leases.
    pub leases: lease::LeaseManager,
}

/// How the controller's own NodeMaintenance watch goes, and whether the
/// process stops.
pub(super) struct Health {
    /// The controller's cache of NodeMaintenances, once it runs.
    pub store: Mutex<Option<Store<NodeMaintenance>>>,
    /// The cache has synced.
    pub synced: AtomicBool,
    /// The NodeMaintenance watch's last event was not an error.
    pub watch_ok: AtomicBool,
    /// When the watch last failed.
    pub watch_failed_at: Mutex<Option<std::time::Instant>>,
    /// The API server answered that it serves no NodeMaintenances (the
    /// CRD is missing), at the last look.
    pub crd_missing: AtomicBool,
    /// Asked to stop (SIGTERM): no pass starts work, every drain and
    /// wait ends as if its maintenance were gone, so the process ends (and
    /// the leader lock is given up) within moments; the next leader
    /// resumes from what is in the API. The controller's run ends on it
    /// too (kube-runtime's graceful shutdown).
    pub stopping: tokio::sync::watch::Sender<bool>,
}

impl Health {
    /// The controller's cache of NodeMaintenances, if it runs.
    pub fn store(&self) -> Option<Store<NodeMaintenance>> {
        self.store.locked().clone()
    }

    /// A new run of the controller with `store` as its cache (`None`: no
    /// run, a standby's): nothing synced yet, the watch not failing.
    pub(crate) fn start_over(&self, store: Option<Store<NodeMaintenance>>) {
        *self.store.locked() = store;
        self.synced.store(false, Ordering::Relaxed);
        self.watch_ok.store(true, Ordering::Relaxed);
    }
}

impl Default for Health {
    fn default() -> Self {
        Health {
            store: Mutex::new(None),
            synced: AtomicBool::new(false),
            watch_ok: AtomicBool::new(true),
            watch_failed_at: Mutex::new(None),
            crd_missing: AtomicBool::new(false),
            stopping: tokio::sync::watch::Sender::new(false),
        }
    }
}

/// What admission holds, and what it reads besides the watches.
#[derive(Default)]
pub(crate) struct Admission {
    /// Held while one maintenance's admission is decided (and, when
    /// admitted, counted in `admitted_here`): two admissions never see a
    /// stale view of each other.
    pub(crate) lock: tokio::sync::Mutex<()>,
    /// The last list of the nodes for admission, and when it was asked
    /// for; held while a list is made, so admissions asking at once share
    /// one (see [`Context::fresh_nodes`]).
    pub(super) nodes_listed:
        tokio::sync::Mutex<Option<(std::time::Instant, crate::policy::FleetNodes)>>,
    /// The maintenances that ended (the fleet's history).
    pub(super) ended: crate::admission::history::EndedLog,
}

impl Context {
    /// The client every part uses.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The policies, as loaded (and reloaded) from the policy directory.
    pub fn policies(&self) -> &Arc<PolicyStore> {
        &self.policies
    }

    /// The controller's settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Where the controller counts (on the registry the operator serves).
    pub fn metrics(&self) -> &ControllerMetrics {
        &self.metrics
    }

    pub fn new(
        client: Client,
        policies: Arc<PolicyStore>,
        settings: Settings,
        metrics: ControllerMetrics,
    ) -> Arc<Self> {
        let in_flight = Arc::new(tokio::sync::Semaphore::new(usize::from(
            settings.removals_in_flight.max(1),
        )));
        let slots = Arc::new(tokio::sync::Semaphore::new(usize::from(
            settings.max_concurrent.max(1),
        )));
        let say_every = settings.waiting_update_interval;
        Arc::new(Context {
            slots,
            writers: Writers {
                recorder: events::Recorder::new(client.clone(), settings.instance.clone()),
                leases: lease::LeaseManager::new(client.clone(), settings.lease_namespace.clone()),
            },
            client,
            metrics,
            policies,
            settings,
            health: Health::default(),
            admission: Admission::default(),
            memory: Memories::new(say_every),
            drains: drain::Shared {
                budgets: Arc::default(),
                in_flight,
                desks: Arc::default(),
                reads: Arc::default(),
            },
            watched: Default::default(),
        })
    }

    /// What admission follows, to share with the webhook (one set of
    /// watches for both).
    pub fn watched(&self) -> Arc<crate::admission::Watched> {
        self.watched.clone()
    }

    /// The nodes for an admission: the node watch's, once it has listed
    /// them (no request). Before that, or while the watch fails, as listed
    /// by a request made after this call: admissions that ask while a list
    /// is in flight wait for the next one, and those waiting share it, so
    /// 50 maintenances created at once cost a few lists, not 50, and none
    /// reads nodes older than its own question.
    pub(crate) async fn fresh_nodes(&self) -> Result<crate::policy::FleetNodes> {
        if let Some(nodes) = self.watched.nodes.snapshot() {
            return Ok(nodes);
        }
        let asked = std::time::Instant::now();
        let mut listed = self.admission.nodes_listed.lock().await;
        if let Some((at, nodes)) = listed.as_ref()
            && *at >= asked
        {
            return Ok(nodes.clone());
        }
        let at = std::time::Instant::now();
        let nodes = crate::policy::fleet_nodes(crate::admission::nodes(&self.client).await?);
        *listed = Some((at, nodes.clone()));
        Ok(nodes)
    }

    /// The node `name` as the controller's node watch has it (what an
    /// admission decides on); `None` when the watch does not show it.
    pub fn watched_node(&self, name: &str) -> Option<k8s_openapi::api::core::v1::Node> {
        self.watched.nodes.get(name)
    }

    /// Who else holds `node`'s medik8s lease, as the controller's lease
    /// watch has it (what an admission decides on).
    pub fn watched_lease_holder(&self, node: &str) -> Option<String> {
        let node = Arc::new(self.watched.nodes.get(node)?);
        self.watched
            .leases
            .holders(std::slice::from_ref(&node))
            .into_values()
            .next()
    }

    /// Other tools' claims of `node`, as the controller's watches have
    /// them.
    pub fn watched_tool_claims(&self, node: &str) -> Vec<String> {
        self.watched
            .claims
            .by_node()
            .remove(node)
            .unwrap_or_default()
    }

    /// Every NodeMaintenance in the controller's cache.
    pub(crate) fn cached_maintenances(&self) -> Vec<Arc<NodeMaintenance>> {
        let store = self.health.store();
        store.map(|s| s.state()).unwrap_or_default()
    }

    /// Whether the process is stopping (a drain in progress ends, and the
    /// next leader resumes it).
    pub(crate) fn is_stopping(&self) -> bool {
        *self.health.stopping.borrow()
    }

    /// Ends when [`Context::stop`] is called (at once if it was).
    pub(crate) fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + Sync + 'static {
        let mut asked = self.health.stopping.subscribe();
        async move {
            let _ = asked.wait_for(|stopping| *stopping).await;
        }
    }

    /// Whether a maintenance named `name` exists, as the controller's cache
    /// sees it now.
    pub(crate) fn maintenance_exists(&self, name: &str) -> bool {
        self.health.store().is_some_and(|s| {
            s.get(&kube::runtime::reflector::ObjectRef::new(name))
                .is_some()
        })
    }

    /// Whether the maintenance `name` (uid `uid`, on `node`) is, as the
    /// controller's cache sees it now, gone, being deleted, or moved to
    /// another node: a drain in progress for it should stop.
    pub(crate) fn no_longer_wants(&self, name: &str, uid: &str, node: &str) -> bool {
        if self.is_stopping() {
            return true;
        }
        let store = self.health.store();
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

    /// How many maintenances the controller remembers something about
    /// (none once every maintenance it saw is gone).
    pub fn remembered(&self) -> usize {
        self.memory.len()
    }

    /// Forgets every maintenance the controller's cache no longer holds.
    pub(super) fn forget_gone(&self) {
        if !self.synced() {
            return;
        }
        let present: HashSet<String> = self
            .cached_maintenances()
            .iter()
            .filter_map(|nm| nm.uid())
            .collect();
        self.memory.retain(&present);
    }

    /// The policy that decides for `nm`: the one it started with, or, at
    /// its first decision, the one the current set selects (its annotation,
    /// a rule matching the node's labels, or the default), which is then
    /// kept until the maintenance is deleted.
    pub(crate) fn policy_for(
        &self,
        nm: &NodeMaintenance,
        node: Option<&k8s_openapi::api::core::v1::Node>,
    ) -> Result<Selected> {
        self.memory.pinned_or(&nm.uid().unwrap_or_default(), || {
            let selected = self
                .policies
                .current()
                .select_for(nm, node.map(|n| n.labels()))?;
            tracing::info!(
                nodeMaintenance = %nm.name_any(),
                policy = %selected.name,
                digest = selected.policy.digest(),
                chosen_by = %selected.why,
                "policy selected"
            );
            Ok(selected)
        })
    }

    /// Stops the work in progress: every drain and wait ends, and so does
    /// the controller's run once its passes have (what SIGTERM does).
    pub fn stop(&self) {
        if !self.health.stopping.send_replace(true) {
            tracing::info!(
                "stopping: drains in progress end here and are resumed by the next leader"
            );
        }
    }

    /// Whether the controller has started (a standby replica waiting for
    /// leadership has not).
    pub fn started(&self) -> bool {
        self.health.store.locked().is_some()
    }

    /// The controller stopped running in this process (leadership lost,
    /// or its run ended): back to a standby replica's state, no cache and
    /// nothing synced (readiness answers as a standby's does), nothing
    /// remembered of any maintenance.
    pub(super) fn stand_by(&self) {
        self.health.start_over(None);
        self.memory.forget_all();
        self.writers.recorder.stop();
    }

    /// Whether the controller's cache has synced.
    pub fn synced(&self) -> bool {
        self.health.synced.load(Ordering::Relaxed)
    }

    /// Whether the NodeMaintenance CRD was missing at the last look (every
    /// [`Settings::rewind_check`]).
    pub(crate) fn crd_missing(&self) -> bool {
        self.health.crd_missing.load(Ordering::Relaxed)
    }

    /// Whether the NodeMaintenance watch is working: no failure since
    /// its last event, or none within [`Settings::watch_failure_window`]
    /// (a watch that resumed quietly sends nothing until something
    /// changes; a failing one fails again at least that often, as the
    /// watcher's back-off is shorter).
    pub fn watching(&self) -> bool {
        if self.health.watch_ok.load(Ordering::Relaxed) {
            return true;
        }
        let failed_at = *self.health.watch_failed_at.locked();
        failed_at.is_none_or(|at| at.elapsed() > self.settings.watch_failure_window)
    }

    /// Sets the per-maintenance gauges from the controller's cache (called
    /// at each scrape, so they are never stale).
    pub fn refresh_gauges(&self) {
        let store = self.health.store();
        let Some(store) = store else { return };
        let all = store.state();
        let rows: Vec<(String, State, i32)> = all
            .iter()
            .map(|nm| {
                let status = nm.status.as_ref();
                let state = match (
                    status.and_then(|s| s.phase),
                    status.and_then(|s| s.waiting.as_ref()),
                ) {
                    (Some(crate::crd::MaintenancePhase::Running), _)
                        if status.is_some_and(|s| s.parked.is_some()) =>
                    {
                        State::Parked
                    }
                    (Some(p), _) => State::from(p),
                    (None, Some(_)) => State::Waiting,
                    (None, None) => State::Pending,
                };
                let progress = status.map_or(0, |s| s.drain_progress);
                (nm.name_any(), state, progress)
            })
            .collect();
        self.metrics.set_maintenances(all.iter().zip(&rows).map(
            |(nm, (name, state, progress))| {
                (name.as_str(), nm.spec.node_name.as_str(), *state, *progress)
            },
        ));
        // Kept current at every scrape, not only when /readyz is asked.
        self.metrics
            .ready
            .set(i64::from(self.synced() && self.watching()));
    }
}
