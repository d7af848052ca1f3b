//! What admission reads, watched while the controller runs: the nodes,
//! the medik8s node leases, and other tools' claims on nodes; `follow.rs`
//! is the watch loop they share.

pub mod claims;
pub(super) mod follow;
pub mod leases;
pub(crate) mod nodes;
