//! The policy engine's and the policy store's metrics: how long decisions
//! take, how they fail, and whether the policy directory reloads.

use prometheus::{HistogramVec, IntCounterVec, IntGauge, Registry};

use std::sync::Arc;

use crate::metrics::{self, Label, counter_vec, exponential, gauge, histogram_vec};
use nmo_policy_runtime::{Decision, Observer};

/// The categories of `nmo_policy_errors_total` (see `Error::category`).
pub(crate) const ERROR_CATEGORIES: [&str; 11] = [
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

/// The `result` label of `nmo_policy_reloads_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadResult {
    Success,
    Failure,
}

impl Label for ReloadResult {
    const ALL: &'static [Self] = &[Self::Success, Self::Failure];
    fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failure => "failure",
        }
    }
}

/// Everything the policy engine and store count. Cheap to clone.
#[derive(Clone)]
pub struct PolicyMetrics {
    latency: HistogramVec,
    errors: IntCounterVec,
    reloads: IntCounterVec,
    reload_ok: IntGauge,
}

impl std::fmt::Debug for PolicyMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyMetrics").finish_non_exhaustive()
    }
}

/// Every decision's latency, and its error's category.
impl Observer for PolicyMetrics {
    fn decided(&self, decision: Decision, seconds: f64, category: Option<&'static str>) {
        self.latency
            .with_label_values(&[decision.name()])
            .observe(seconds);
        if let Some(category) = category {
            self.errors.with_label_values(&[category]).inc();
        }
    }
}

impl PolicyMetrics {
    /// Registers the policy families on `registry`: every decision's
    /// latency series and every error category, empty or at 0, from the
    /// start.
    pub fn register(registry: &Registry) -> metrics::Result<Self> {
        let m = PolicyMetrics {
            latency: histogram_vec(
                registry,
                "nmo_policy_evaluation_seconds",
                "Time to get a validated answer from a policy (instantiate, call, validate).",
                &["function"],
                exponential(0.0001, 2.0, 16),
            )?,
            errors: counter_vec(
                registry,
                "nmo_policy_errors_total",
                "Policy errors by category (load, wrong_world, compile_limit, contract_version, trap, deadline, memory_limit, output_limit, invalid_decision, not_found, engine).",
                &["category"],
            )?,
            reloads: counter_vec(
                registry,
                "nmo_policy_reloads_total",
                "Policy directory reloads, by result: success, or failure (the last good set stays in use).",
                &["result"],
            )?,
            reload_ok: gauge(
                registry,
                "nmo_policy_last_reload_successful",
                "1 when the policy directory's current content is in use, 0 when its last reload was rejected.",
            )?,
        };
        for decision in Decision::ALL {
            m.latency.with_label_values(&[decision.name()]);
        }
        for category in ERROR_CATEGORIES {
            m.errors.with_label_values(&[category]);
        }
        for result in ReloadResult::ALL {
            m.reloads.with_label_values(&[result.as_str()]);
        }
        m.reload_ok.set(1);
        Ok(m)
    }

    /// The metrics behind an engine's observer, when it is these (the
    /// store counts its reloads beside the engine's decisions).
    pub fn of(observer: Option<&Arc<dyn Observer>>) -> Option<Self> {
        let observer: &dyn std::any::Any = &**observer?;
        observer.downcast_ref::<Self>().cloned()
    }

    /// These metrics as an engine's observer
    /// ([`crate::policy::PolicyEngine::observed`]).
    pub fn observer(&self) -> Arc<dyn Observer> {
        Arc::new(self.clone())
    }

    /// How many `decision` calls were timed so far.
    pub fn decisions(&self, decision: Decision) -> u64 {
        self.timed(decision).0
    }

    /// How many `decision` calls were timed so far, and their seconds in
    /// all.
    pub fn timed(&self, decision: Decision) -> (u64, f64) {
        let h = self.latency.with_label_values(&[decision.name()]);
        (h.get_sample_count(), h.get_sample_sum())
    }

    /// How many errors of `category` were counted so far.
    pub fn errors(&self, category: &str) -> u64 {
        self.errors.with_label_values(&[category]).get()
    }

    /// A reload of the policy directory ended with `result`.
    pub fn reloaded(&self, result: ReloadResult) {
        self.reloads.with_label_values(&[result.as_str()]).inc();
        self.reload_ok
            .set(i64::from(result == ReloadResult::Success));
    }

    /// Whether the directory's current content is in use (1) or its last
    /// reload was rejected (0).
    pub fn reload_ok(&self) -> i64 {
        self.reload_ok.get()
    }

    /// How many reloads ended with `result` so far.
    pub fn reloads(&self, result: ReloadResult) -> u64 {
        self.reloads.with_label_values(&[result.as_str()]).get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every category a policy error can have is one the metric shows.
    #[test]
    fn every_policy_error_category_is_listed() {
        use nmo_policy_runtime::Error;
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
            Error::Engine(String::new()),
        ];
        let not_found = crate::policy::Error::NotFound {
            name: String::new(),
            available: String::new(),
        };
        let categories = errors
            .iter()
            .map(Error::category)
            .chain([not_found.category()]);
        for category in categories {
            assert!(ERROR_CATEGORIES.contains(&category), "{category}");
        }
    }

    /// The error and reload series a dashboard needs are there at 0.
    #[test]
    fn the_policy_families_are_visible_from_the_start() {
        let registry = Registry::new();
        PolicyMetrics::register(&registry).unwrap();
        let text = metrics::render(&registry).unwrap();
        for series in [
            r#"nmo_policy_errors_total{category="deadline"} 0"#,
            r#"nmo_policy_errors_total{category="output_limit"} 0"#,
            r#"nmo_policy_reloads_total{result="failure"} 0"#,
            r#"nmo_policy_evaluation_seconds_count{function="admit"} 0"#,
            "nmo_policy_last_reload_successful 1",
        ] {
            assert!(text.contains(series), "{series} missing from:\n{text}");
        }
    }
}
