//! The controller's metrics: controller-runtime's families (so the Go
//! operator's dashboards keep working) and the maintenances' own.

use prometheus::{Histogram, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use crate::metrics::{self, Label, counter_vec, exponential, gauge, gauge_vec, histogram_vec};

/// The controller name in controller-runtime's labels.
pub(crate) const CONTROLLER: &str = "nodemaintenance";

/// The `result` label of `controller_runtime_reconcile_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconcileResult {
    Success,
    Error,
    Requeue,
    RequeueAfter,
}

impl Label for ReconcileResult {
    const ALL: &'static [Self] = &[
        Self::Success,
        Self::Error,
        Self::Requeue,
        Self::RequeueAfter,
    ];
    fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Error => "error",
            Self::Requeue => "requeue",
            Self::RequeueAfter => "requeue_after",
        }
    }
}

/// The `outcome` label of `nmo_pod_removals_total`: what became of a pod
/// decision the drain carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodOutcome {
    Evicted,
    Deleted,
    Skipped,
    Blocked,
    /// An eviction a PodDisruptionBudget refused (HTTP 429).
    Pdb429,
    Error,
}

impl Label for PodOutcome {
    const ALL: &'static [Self] = &[
        Self::Evicted,
        Self::Deleted,
        Self::Skipped,
        Self::Blocked,
        Self::Pdb429,
        Self::Error,
    ];
    fn as_str(self) -> &'static str {
        match self {
            Self::Evicted => "evicted",
            Self::Deleted => "deleted",
            Self::Skipped => "skipped",
            Self::Blocked => "blocked",
            Self::Pdb429 => "pdb-429",
            Self::Error => "error",
        }
    }
}

/// The `kind` label of `nmo_lease_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseFailure {
    /// Another holder has the node's lease.
    Held,
    /// The API server failed the lease's request.
    Api,
}

impl Label for LeaseFailure {
    const ALL: &'static [Self] = &[Self::Held, Self::Api];
    fn as_str(self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::Api => "api",
        }
    }
}

/// The `phase` label of `nmo_node_maintenances` and
/// `nmo_node_maintenance_phase`: Pending (not looked at yet), Waiting (the
/// policy holds it back), Parked (phase Running, set aside by its
/// policy's `park` verdict), and the three phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    Pending,
    Waiting,
    Parked,
    Running,
    Succeeded,
    Failed,
}

impl Label for State {
    const ALL: &'static [Self] = &[
        Self::Pending,
        Self::Waiting,
        Self::Parked,
        Self::Running,
        Self::Succeeded,
        Self::Failed,
    ];
    fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Waiting => "Waiting",
            Self::Parked => "Parked",
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
        }
    }
}

impl From<crate::crd::MaintenancePhase> for State {
    fn from(phase: crate::crd::MaintenancePhase) -> Self {
        use crate::crd::MaintenancePhase as P;
        match phase {
            P::Running => Self::Running,
            P::Succeeded => Self::Succeeded,
            P::Failed => Self::Failed,
        }
    }
}

/// Everything the controller counts. Cheap to clone: each family is a
/// handle on the registry's.
#[derive(Clone)]
pub struct ControllerMetrics {
    reconcile_total: IntCounterVec,
    reconcile_errors: IntCounterVec,
    reconcile_panics: IntCounterVec,
    terminal_errors: IntCounterVec,
    active_workers: IntGaugeVec,
    max_concurrent_reconciles: IntGaugeVec,
    leader: IntGaugeVec,
    reconcile_duration: HistogramVec,
    reconcile_time: HistogramVec,
    maintenances: IntGaugeVec,
    drain_progress: IntGaugeVec,
    maintenance_phase: IntGaugeVec,
    pub drain_duration: Histogram,
    pod_removals: IntCounterVec,
    lease_errors: IntCounterVec,
    pub ready: IntGauge,
}

impl std::fmt::Debug for ControllerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerMetrics").finish_non_exhaustive()
    }
}

impl ControllerMetrics {
    /// Registers the controller's families on `registry`, every bounded
    /// series at 0 from the start (a dashboard or an alert finds its
    /// series before the first event).
    pub fn register(registry: &Registry) -> metrics::Result<Self> {
        let by_controller = &["controller"];
        let m = ControllerMetrics {
            reconcile_total: counter_vec(
                registry,
                "controller_runtime_reconcile_total",
                "Total number of reconciliations per controller",
                &["controller", "result"],
            )?,
            reconcile_errors: counter_vec(
                registry,
                "controller_runtime_reconcile_errors_total",
                "Total number of reconciliation errors per controller",
                by_controller,
            )?,
            reconcile_panics: counter_vec(
                registry,
                "controller_runtime_reconcile_panics_total",
                "Total number of reconciliation panics per controller",
                by_controller,
            )?,
            // nmo retries every error (none is terminal): at 0, for the
            // dashboards and alerts written for controller-runtime.
            terminal_errors: counter_vec(
                registry,
                "controller_runtime_terminal_reconcile_errors_total",
                "Total number of terminal reconciliation errors per controller",
                by_controller,
            )?,
            active_workers: gauge_vec(
                registry,
                "controller_runtime_active_workers",
                "Number of currently used workers per controller",
                by_controller,
            )?,
            max_concurrent_reconciles: gauge_vec(
                registry,
                "controller_runtime_max_concurrent_reconciles",
                "Maximum number of concurrent reconciles per controller",
                by_controller,
            )?,
            leader: gauge_vec(
                registry,
                "leader_election_master_status",
                "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
                &["name"],
            )?,
            reconcile_duration: histogram_vec(
                registry,
                "controller_runtime_reconcile_duration_seconds",
                "Length of time per reconciliation per controller",
                by_controller,
                exponential(0.005, 2.0, 16),
            )?,
            // controller-runtime itself names it this way too; both are
            // kept so dashboards built on either work.
            reconcile_time: histogram_vec(
                registry,
                "controller_runtime_reconcile_time_seconds",
                "Length of time per reconciliation per controller",
                by_controller,
                exponential(0.005, 2.0, 16),
            )?,
            maintenances: gauge_vec(
                registry,
                "nmo_node_maintenances",
                "NodeMaintenances by phase (Pending: not started yet).",
                &["phase"],
            )?,
            drain_progress: gauge_vec(
                registry,
                "nmo_drain_progress_percent",
                "Drain progress of each NodeMaintenance, percent.",
                &["node_maintenance", "node"],
            )?,
            maintenance_phase: gauge_vec(
                registry,
                "nmo_node_maintenance_phase",
                "Each NodeMaintenance's phase (Pending, Waiting, Parked, Running, Succeeded, Failed): 1, one series per maintenance.",
                &["node_maintenance", "node", "phase"],
            )?,
            drain_duration: metrics::histogram(
                registry,
                "nmo_drain_duration_seconds",
                "Time from a NodeMaintenance's creation to its drain succeeding.",
                exponential(1.0, 2.0, 14),
            )?,
            pod_removals: counter_vec(
                registry,
                "nmo_pod_removals_total",
                "Pod decisions carried out by the drain executor, by outcome: evicted, deleted, skipped, blocked, pdb-429, error.",
                &["outcome"],
            )?,
            lease_errors: counter_vec(
                registry,
                "nmo_lease_errors_total",
                "Node lease failures: held by another holder, or an API error.",
                &["kind"],
            )?,
            ready: gauge(
                registry,
                "nmo_ready",
                "1 when the operator is ready (caches synced, policy loaded).",
            )?,
        };
        m.every_bounded_series_at_zero();
        Ok(m)
    }

    /// Every series whose labels are bounded, at 0.
    fn every_bounded_series_at_zero(&self) {
        let m = self;
        for result in ReconcileResult::ALL {
            m.reconcile_total
                .with_label_values(&[CONTROLLER, result.as_str()]);
        }
        m.reconcile_errors.with_label_values(&[CONTROLLER]);
        m.reconcile_panics.with_label_values(&[CONTROLLER]);
        m.terminal_errors.with_label_values(&[CONTROLLER]);
        m.active_workers.with_label_values(&[CONTROLLER]).set(0);
        // Histograms too: a dashboard's rate() has a series from the start.
        m.reconcile_duration.with_label_values(&[CONTROLLER]);
        m.reconcile_time.with_label_values(&[CONTROLLER]);
        for state in State::ALL {
            m.maintenances.with_label_values(&[state.as_str()]).set(0);
        }
        for outcome in PodOutcome::ALL {
            m.pod_removals.with_label_values(&[outcome.as_str()]);
        }
        for kind in LeaseFailure::ALL {
            m.lease_errors.with_label_values(&[kind.as_str()]);
        }
    }

    /// A reconcile began; the guard counts it as active until dropped.
    pub(crate) fn reconcile_started(&self) -> ActiveWorker {
        let gauge = self.active_workers.with_label_values(&[CONTROLLER]);
        gauge.inc();
        ActiveWorker(gauge)
    }

    /// A reconcile ended after `seconds` with `result`.
    pub(crate) fn reconciled(&self, seconds: f64, result: ReconcileResult) {
        self.reconcile_duration
            .with_label_values(&[CONTROLLER])
            .observe(seconds);
        self.reconcile_time
            .with_label_values(&[CONTROLLER])
            .observe(seconds);
        self.reconcile_total
            .with_label_values(&[CONTROLLER, result.as_str()])
            .inc();
        if result == ReconcileResult::Error {
            self.reconcile_errors.with_label_values(&[CONTROLLER]).inc();
        }
    }

    /// A reconcile panicked (caught: it is retried).
    pub fn panicked(&self) {
        self.reconcile_panics.with_label_values(&[CONTROLLER]).inc();
    }

    /// How many reconciles ended with `result` so far.
    pub fn reconciles(&self, result: ReconcileResult) -> u64 {
        self.reconcile_total
            .with_label_values(&[CONTROLLER, result.as_str()])
            .get()
    }

    /// How many maintenances may be reconciled at once.
    pub(crate) fn set_max_concurrent(&self, n: u16) {
        self.max_concurrent_reconciles
            .with_label_values(&[CONTROLLER])
            .set(i64::from(n));
    }

    /// Whether this process leads (holds the operator's `lock`).
    pub(crate) fn set_leader(&self, lock: &str, leading: bool) {
        self.leader
            .with_label_values(&[lock])
            .set(i64::from(leading));
    }

    /// A pod decision carried out with `outcome`.
    pub(crate) fn pod_removal(&self, outcome: PodOutcome) {
        self.pod_removals
            .with_label_values(&[outcome.as_str()])
            .inc();
    }

    /// How many pod decisions had `outcome` so far.
    pub fn pod_removals(&self, outcome: PodOutcome) -> u64 {
        self.pod_removals
            .with_label_values(&[outcome.as_str()])
            .get()
    }

    /// A node lease failure of `kind`.
    pub(crate) fn lease_error(&self, kind: LeaseFailure) {
        self.lease_errors.with_label_values(&[kind.as_str()]).inc();
    }

    /// Sets the per-maintenance gauges to `maintenances` (name, node,
    /// state, drain progress), dropping the series of those gone.
    pub fn set_maintenances<'a>(
        &self,
        maintenances: impl IntoIterator<Item = (&'a str, &'a str, State, i32)>,
    ) {
        let mut counts: std::collections::HashMap<State, i64> =
            State::ALL.iter().map(|s| (*s, 0)).collect();
        self.drain_progress.reset();
        self.maintenance_phase.reset();
        for (name, node, state, progress) in maintenances {
            *counts.entry(state).or_default() += 1;
            self.drain_progress
                .with_label_values(&[name, node])
                .set(i64::from(progress));
            self.maintenance_phase
                .with_label_values(&[name, node, state.as_str()])
                .set(1);
        }
        for (state, n) in counts {
            self.maintenances
                .with_label_values(&[state.as_str()])
                .set(n);
        }
    }
}

/// A reconcile counted in `controller_runtime_active_workers` while it
/// lives.
pub(crate) struct ActiveWorker(IntGauge);

impl Drop for ActiveWorker {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dashboard or alert finds every counter family, at 0, before the
    /// first event.
    #[test]
    fn counter_families_are_visible_at_zero_from_the_start() {
        let registry = Registry::new();
        ControllerMetrics::register(&registry).unwrap();
        let text = metrics::render(&registry).unwrap();
        for series in [
            r#"controller_runtime_reconcile_total{controller="nodemaintenance",result="error"} 0"#,
            r#"controller_runtime_reconcile_total{controller="nodemaintenance",result="success"} 0"#,
            r#"controller_runtime_reconcile_errors_total{controller="nodemaintenance"} 0"#,
            r#"controller_runtime_active_workers{controller="nodemaintenance"} 0"#,
            r#"nmo_pod_removals_total{outcome="pdb-429"} 0"#,
            r#"nmo_lease_errors_total{kind="held"} 0"#,
            r#"nmo_node_maintenances{phase="Waiting"} 0"#,
        ] {
            assert!(text.contains(series), "{series} missing from:\n{text}");
        }
    }

    /// A maintenance that is gone leaves no series behind; the counts by
    /// phase follow.
    #[test]
    fn the_gauges_follow_the_maintenances_that_exist() {
        let registry = Registry::new();
        let m = ControllerMetrics::register(&registry).unwrap();
        m.set_maintenances([
            ("a", "worker-1", State::Running, 40),
            ("b", "worker-2", State::Waiting, 0),
        ]);
        m.set_maintenances([("b", "worker-2", State::Running, 10)]);
        let text = metrics::render(&registry).unwrap();
        assert!(!text.contains(r#"node_maintenance="a""#), "{text}");
        assert!(
            text.contains(r#"nmo_drain_progress_percent{node="worker-2",node_maintenance="b"} 10"#),
            "{text}"
        );
        assert!(
            text.contains(r#"nmo_node_maintenances{phase="Running"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"nmo_node_maintenances{phase="Waiting"} 0"#),
            "{text}"
        );
    }
}
