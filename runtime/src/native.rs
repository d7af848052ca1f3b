//! The default policy's drain rules written directly in Rust, on Kubernetes
//! objects: what an operator without policies (the Go NMO) computes.
//!
//! It is the yardstick for the embedded default policy: the tests check that
//! both give the same plan for the same pods, and the benchmark measures what
//! running the rules in the sandbox costs over running them natively.

use std::time::Duration;

use k8s_openapi::api::core::v1 as core;

use super::convert::{is_daemonset_managed, is_mirror};
use super::validate::{Action, Plan, Step};

/// kubectl drain's attempt timeout as the Go operator sets it.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

/// kubectl drain's filters (`--ignore-daemonsets --delete-emptydir-data
/// --force`, grace period -1) on one pod.
pub fn action(pod: &core::Pod) -> Action {
    if is_daemonset_managed(pod) {
        Action::Skip {
            reason: "DaemonSet-managed pod (--ignore-daemonsets)".into(),
        }
    } else if is_mirror(pod) {
        Action::Skip {
            reason: "mirror (static) pod, owned by the kubelet".into(),
        }
    } else {
        Action::Evict(crate::validate::Removal::default())
    }
}

/// The default policy's plan, computed natively.
pub fn default_plan(pods: &[core::Pod]) -> Plan {
    Plan {
        steps: pods
            .iter()
            .enumerate()
            .map(|(i, p)| Step {
                pod: i,
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                name: p.metadata.name.clone().unwrap_or_default(),
                action: action(p),
                order: 0,
            })
            .collect(),
        attempt_timeout: ATTEMPT_TIMEOUT,
        max_concurrent_evictions: None,
        volume_detach_timeout: None,
    }
}
