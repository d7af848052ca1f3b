//! Kubernetes objects to the records a policy reads: the runtime's
//! conversions (pods, nodes, taints), and the operator's own resource, the
//! NodeMaintenance, which the runtime does not know.

pub use nmo_policy_runtime::convert::*;

use nmo_policy_runtime::types;

/// A NodeMaintenance as the policy sees it, `now` being the time of the
/// decision (for `elapsed-ms` and `now-ms`).
pub fn maintenance(
    nm: &crate::crd::NodeMaintenance,
    attempt: u32,
    now: jiff::Timestamp,
) -> types::Maintenance {
    let s = nm.status.clone().unwrap_or_default();
    let elapsed = nm
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| (now.as_millisecond() - t.0.as_millisecond()).max(0) as u64)
        .unwrap_or(0);
    types::Maintenance {
        name: nm.metadata.name.clone().unwrap_or_default(),
        node_name: nm.spec.node_name.clone(),
        reason: nm.spec.reason.clone().unwrap_or_default(),
        labels: key_values(nm.metadata.labels.as_ref()),
        annotations: key_values(nm.metadata.annotations.as_ref()),
        phase: s.phase.map(maintenance_phase),
        drain_progress: s.drain_progress.clamp(0, 100) as u32,
        error_on_lease_count: s.error_on_lease_count.max(0) as u32,
        attempt: attempt.max(1),
        elapsed_ms: elapsed,
        now_ms: now.as_millisecond().max(0) as u64,
        created_ms: nm
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_millisecond().max(0) as u64),
    }
}

/// A NodeMaintenance phase as the contract names it.
pub(crate) fn maintenance_phase(p: crate::crd::MaintenancePhase) -> types::MaintenancePhase {
    use crate::crd::MaintenancePhase as Phase;
    match p {
        Phase::Running => types::MaintenancePhase::Running,
        Phase::Succeeded => types::MaintenancePhase::Succeeded,
        Phase::Failed => types::MaintenancePhase::Failed,
    }
}
