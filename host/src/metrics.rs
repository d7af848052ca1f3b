//! Prometheus metrics: controller-runtime's names (so the Go operator's
//! dashboards keep working) and our own, every label bounded.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// The controller name in controller-runtime's labels.
/// The `phase` label values of `nmo_node_maintenances`: Pending (not
/// looked at yet), Waiting (the policy holds it back), and the three
/// phases.
pub const PHASES: [&str; 5] = ["Pending", "Waiting", "Running", "Succeeded", "Failed"];

pub const CONTROLLER: &str = "nodemaintenance";

/// The categories of `nmo_policy_errors_total` (see `Error::category`).
pub const POLICY_ERROR_CATEGORIES: [&str; 11] = [
    "load",
    "wrong_world",
    "compile_limit",
    "contract_version",
    "trap",
    "deadline",
    "memory_limit",
    "output_limit",
    "invalid_decision",
    "not_found",
    "engine",
];

/// Every metric the operator exports.
pub struct Metrics {
    pub registry: Registry,
    pub reconcile_total: IntCounterVec,
    pub reconcile_errors: IntCounterVec,
    pub active_workers: IntGaugeVec,
    pub max_concurrent_reconciles: IntGaugeVec,
    pub leader: IntGaugeVec,
    pub reconcile_duration: HistogramVec,
    pub reconcile_time: HistogramVec,
    pub webhook_requests: IntCounterVec,
    pub webhook_latency: HistogramVec,
    pub maintenances: IntGaugeVec,
    pub drain_progress: IntGaugeVec,
    pub drain_duration: Histogram,
    pub evictions: IntCounterVec,
    pub policy_latency: HistogramVec,
    pub policy_errors: IntCounterVec,
    pub policy_reloads: IntCounterVec,
    pub policy_reload_ok: IntGauge,
    pub lease_errors: IntCounterVec,
    pub build_info: IntGaugeVec,
    pub ready: IntGauge,
    pub rest_client_requests: IntCounterVec,
}

fn buckets(start: f64, factor: f64, n: usize) -> Vec<f64> {
    prometheus::exponential_buckets(start, factor, n).expect("valid buckets")
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every family registered (counters at 0). The binary
    /// makes one and hands it to every component; a test makes its own and
    /// asserts exact counts.
    pub fn new() -> Self {
        let registry = Registry::new();
        let reconcile_total = IntCounterVec::new(
            Opts::new(
                "controller_runtime_reconcile_total",
                "Total number of reconciliations per controller",
            ),
            &["controller", "result"],
        )
        .expect("metric");
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "controller_runtime_reconcile_errors_total",
                "Total number of reconciliation errors per controller",
            ),
            &["controller"],
        )
        .expect("metric");
        let active_workers = IntGaugeVec::new(
            Opts::new(
                "controller_runtime_active_workers",
                "Number of currently used workers per controller",
            ),
            &["controller"],
        )
        .expect("metric");
        let max_concurrent_reconciles = IntGaugeVec::new(
            Opts::new(
                "controller_runtime_max_concurrent_reconciles",
                "Maximum number of concurrent reconciles per controller",
            ),
            &["controller"],
        )
        .expect("metric");
        let leader = IntGaugeVec::new(
            Opts::new(
                "leader_election_master_status",
                "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            ),
            &["name"],
        )
        .expect("metric");
        let reconcile_duration = HistogramVec::new(
            HistogramOpts::new(
                "controller_runtime_reconcile_duration_seconds",
                "Length of time per reconciliation per controller",
            )
            .buckets(buckets(0.005, 2.0, 16)),
            &["controller"],
        )
        .expect("metric");
        // controller-runtime itself names it this way; both are kept so
        // dashboards built on either work.
        let reconcile_time = HistogramVec::new(
            HistogramOpts::new(
                "controller_runtime_reconcile_time_seconds",
                "Length of time per reconciliation per controller",
            )
            .buckets(buckets(0.005, 2.0, 16)),
            &["controller"],
        )
        .expect("metric");
        let webhook_requests = IntCounterVec::new(
            Opts::new(
                "controller_runtime_webhook_requests_total",
                "Total number of admission requests by HTTP status code.",
            ),
            &["webhook", "code"],
        )
        .expect("metric");
        let webhook_latency = HistogramVec::new(
            HistogramOpts::new(
                "controller_runtime_webhook_latency_seconds",
                "Histogram of the latency of processing admission requests",
            )
            .buckets(buckets(0.001, 2.0, 14)),
            &["webhook"],
        )
        .expect("metric");
        let maintenances = IntGaugeVec::new(
            Opts::new(
                "nmo_node_maintenances",
                "NodeMaintenances by phase (Pending: not started yet).",
            ),
            &["phase"],
        )
        .expect("metric");
        let drain_progress = IntGaugeVec::new(
            Opts::new(
                "nmo_drain_progress_percent",
                "Drain progress of each NodeMaintenance, percent.",
            ),
            &["node_maintenance", "node"],
        )
        .expect("metric");
        let drain_duration = Histogram::with_opts(
            HistogramOpts::new(
                "nmo_drain_duration_seconds",
                "Time from a NodeMaintenance's creation to its drain succeeding.",
            )
            .buckets(buckets(1.0, 2.0, 14)),
        )
        .expect("metric");
        let evictions = IntCounterVec::new(
            Opts::new(
                "nmo_pod_removals_total",
                "Pod decisions carried out by the drain executor, by outcome: evicted, deleted, skipped, blocked, pdb-429, error.",
            ),
            &["outcome"],
        )
        .expect("metric");
        let policy_latency = HistogramVec::new(
            HistogramOpts::new(
                "nmo_policy_evaluation_seconds",
                "Time to get a validated answer from a policy (instantiate, call, validate).",
            )
            .buckets(buckets(0.0001, 2.0, 16)),
            &["function"],
        )
        .expect("metric");
        let policy_errors = IntCounterVec::new(
            Opts::new("nmo_policy_errors_total", "Policy errors by category (load, wrong_world, compile_limit, contract_version, trap, deadline, memory_limit, output_limit, invalid_decision, not_found, engine)."),
            &["category"],
        )
        .expect("metric");
        let policy_reloads = IntCounterVec::new(
            Opts::new(
                "nmo_policy_reloads_total",
                "Policy directory reloads, by result: success, or failure (the last good set stays in use).",
            ),
            &["result"],
        )
        .expect("metric");
        let policy_reload_ok = IntGauge::new(
            "nmo_policy_last_reload_successful",
            "1 when the policy directory's current content is in use, 0 when its last reload was rejected.",
        )
        .expect("metric");
        let lease_errors = IntCounterVec::new(
            Opts::new(
                "nmo_lease_errors_total",
                "Node lease failures: held by another holder, or an API error.",
            ),
            &["kind"],
        )
        .expect("metric");
        let build_info = IntGaugeVec::new(
            Opts::new(
                "nmo_build_info",
                "Build information; the value is always 1.",
            ),
            &["version"],
        )
        .expect("metric");
        let rest_client_requests = IntCounterVec::new(
            Opts::new(
                "rest_client_requests_total",
                "Number of HTTP requests to the API server, partitioned by status code, method, and host.",
            ),
            &["code", "method", "host"],
        )
        .expect("metric");
        let ready = IntGauge::new(
            "nmo_ready",
            "1 when the operator is ready (caches synced, policy loaded).",
        )
        .expect("metric");
        for c in [
            Box::new(reconcile_total.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(reconcile_errors.clone()),
            Box::new(active_workers.clone()),
            Box::new(max_concurrent_reconciles.clone()),
            Box::new(leader.clone()),
            Box::new(reconcile_duration.clone()),
            Box::new(reconcile_time.clone()),
            Box::new(webhook_requests.clone()),
            Box::new(webhook_latency.clone()),
            Box::new(maintenances.clone()),
            Box::new(drain_progress.clone()),
            Box::new(drain_duration.clone()),
            Box::new(evictions.clone()),
            Box::new(policy_latency.clone()),
            Box::new(policy_errors.clone()),
            Box::new(policy_reloads.clone()),
            Box::new(policy_reload_ok.clone()),
            Box::new(lease_errors.clone()),
            Box::new(build_info.clone()),
            Box::new(ready.clone()),
            Box::new(rest_client_requests.clone()),
        ] {
            registry.register(c).expect("unique metric names");
        }
        // process_cpu_seconds_total, process_resident_memory_bytes,
        // process_open_fds, process_start_time_seconds…, as client_golang's.
        #[cfg(target_os = "linux")]
        {
            let process = prometheus::process_collector::ProcessCollector::for_self();
            registry
                .register(Box::new(process))
                .expect("unique metric names");
        }
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        policy_reload_ok.set(1);
        for result in ["success", "failure"] {
            policy_reloads.with_label_values(&[result]);
        }
        for phase in PHASES {
            maintenances.with_label_values(&[phase]).set(0);
        }
        // Every counter family is visible, at 0, from the start: a
        // dashboard or an alert finds its series before the first event.
        for result in ["success", "error", "requeue", "requeue_after"] {
            reconcile_total.with_label_values(&[CONTROLLER, result]);
        }
        reconcile_errors.with_label_values(&[CONTROLLER]);
        active_workers.with_label_values(&[CONTROLLER]).set(0);
        // Histograms too: a dashboard's rate() has a series from the start.
        reconcile_duration.with_label_values(&[CONTROLLER]);
        reconcile_time.with_label_values(&[CONTROLLER]);
        for function in ["plan-drain", "on-failure"] {
            policy_latency.with_label_values(&[function]);
        }
        for category in POLICY_ERROR_CATEGORIES {
            policy_errors.with_label_values(&[category]);
        }
        for outcome in [
            "evicted", "deleted", "skipped", "blocked", "pdb-429", "error",
        ] {
            evictions.with_label_values(&[outcome]);
        }
        for kind in ["held", "api"] {
            lease_errors.with_label_values(&[kind]);
        }
        Metrics {
            registry,
            reconcile_total,
            reconcile_errors,
            active_workers,
            max_concurrent_reconciles,
            leader,
            reconcile_duration,
            reconcile_time,
            webhook_requests,
            webhook_latency,
            maintenances,
            drain_progress,
            drain_duration,
            evictions,
            policy_latency,
            policy_errors,
            policy_reloads,
            policy_reload_ok,
            lease_errors,
            build_info,
            ready,
            rest_client_requests,
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding cannot fail");
        String::from_utf8(out).expect("utf-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dashboard or alert finds every counter family, at 0, before the
    /// first event.
    #[test]
    fn counter_families_are_visible_at_zero_from_the_start() {
        let text = Metrics::new().render();
        for series in [
            r#"controller_runtime_reconcile_total{controller="nodemaintenance",result="error"} 0"#,
            r#"controller_runtime_reconcile_total{controller="nodemaintenance",result="success"} 0"#,
            r#"controller_runtime_reconcile_errors_total{controller="nodemaintenance"} 0"#,
            r#"controller_runtime_active_workers{controller="nodemaintenance"} 0"#,
            r#"nmo_policy_errors_total{category="deadline"} 0"#,
            r#"nmo_policy_errors_total{category="output_limit"} 0"#,
            r#"nmo_pod_removals_total{outcome="pdb-429"} 0"#,
            r#"nmo_lease_errors_total{kind="held"} 0"#,
            r#"nmo_policy_reloads_total{result="failure"} 0"#,
        ] {
            assert!(text.contains(series), "{series} missing from:\n{text}");
        }
    }

    /// Every category a policy error can have is one the metric shows.
    #[test]
    fn every_policy_error_category_is_listed() {
        use crate::policy::Error;
        let errors = [
            Error::Load {
                policy: String::new(),
                reason: String::new(),
            },
            Error::WrongWorld {
                policy: String::new(),
                reason: String::new(),
            },
            Error::CompileLimit {
                policy: String::new(),
                reason: String::new(),
            },
            Error::ContractVersion {
                policy: String::new(),
                found: String::new(),
                expected: "",
            },
            Error::Trap {
                policy: String::new(),
                function: "",
                reason: String::new(),
            },
            Error::Deadline {
                policy: String::new(),
                function: "",
                deadline: Default::default(),
            },
            Error::MemoryLimit {
                policy: String::new(),
                function: "",
                limit_bytes: 0,
            },
            Error::OutputLimit {
                policy: String::new(),
                function: "",
                limit_bytes: 0,
            },
            Error::InvalidDecision {
                policy: String::new(),
                function: "",
                reason: String::new(),
            },
            Error::NotFound {
                name: String::new(),
                available: String::new(),
            },
            Error::Engine(String::new()),
        ];
        for e in errors {
            assert!(
                POLICY_ERROR_CATEGORIES.contains(&e.category()),
                "{}",
                e.category()
            );
        }
    }
}
