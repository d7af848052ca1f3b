//! A pass over one maintenance: `reconcile.rs` (the `Pass` and its steps),
//! `finish.rs` (the ways it ends, more methods of the `Pass`),
//! `restore.rs` (a deleted maintenance's restore, which the orphan sweep
//! shares), `status.rs` (its writes); here, what they share (two reads of
//! a maintenance).

mod finish;
pub mod reconcile;
pub(super) mod restore;
pub(super) mod status;

use kube::ResourceExt;

use crate::crd::{FINALIZER, MaintenancePhase, NodeMaintenance};

pub(super) fn has_finalizer(nm: &NodeMaintenance) -> bool {
    nm.finalizers().iter().any(|f| f == FINALIZER)
}

pub(super) fn phase(nm: &NodeMaintenance) -> Option<MaintenancePhase> {
    nm.status.as_ref().and_then(|s| s.phase)
}
