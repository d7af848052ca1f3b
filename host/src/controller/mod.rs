//! The NodeMaintenance controller: a kube-runtime controller whose
//! reconcile follows the Go operator step by step (see `reconcile.rs`),
//! with every drain and failure decision taken from the policy.
//!
//! `context.rs` holds what every reconcile shares, `memory.rs` what is
//! remembered about each maintenance between passes, `run.rs` the run
//! loop. The rooms: `pass/` (one pass: `reconcile.rs` its steps,
//! `finish.rs` how it ends, `status.rs` its writes, `events.rs`), `drain/`
//! (the executor and what it calls: `surge.rs`, `handshake.rs`,
//! `volumes.rs`, `ledger.rs`, `budgets.rs`, `workloads.rs`) and `node/`
//! (cordon, taints, the node lease). What admission reads (the watched
//! nodes, leases and claims, the history) is `crate::admission`, which the
//! webhook and `nmo plan` use as peers.

// The rooms, and beside them what every pass shares (`context`,
// `memory`, `metrics`) and the loop that runs passes (`run`, `leader`,
// `orphans`).
pub mod drain;
pub mod node;
pub mod pass;

mod context;
pub mod leader;
mod memory;
pub mod metrics;
mod orphans;
mod run;

use std::time::Duration;

pub use crate::admission::is_admitted;

pub use context::{Context, Settings, readiness_checks};
pub use metrics::{ControllerMetrics, ReconcileResult};
pub use pass::Next;
pub use pass::reconcile::reconcile;
pub use run::{run, stop_signal};

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
