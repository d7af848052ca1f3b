//! What this runtime implements and ships: the contract's version and
//! world, the earlier versions it still loads, and the embedded default
//! policy.

/// The default policy, built from `policies/default` by this crate's build
/// script and embedded so a caller works with no policy of its own.
pub const DEFAULT_POLICY_WASM: &[u8] = include_bytes!(concat!(
    env!("NMO_POLICY_WASM_DIR"),
    "/nmo_policy_default.wasm"
));

/// The name the embedded default policy goes by in logs, metrics and status.
pub const DEFAULT_POLICY_NAME: &str = "default";

/// The WIT world a policy must implement, for messages.
pub const WORLD: &str = "medik8s:node-maintenance/drain-policy@0.4.0";

/// The contract version this runtime implements; policies built against
/// another minor version, but for those of [`SERVED_CONTRACTS`], are
/// refused.
pub const CONTRACT_VERSION: &str = "0.4.0";

/// The earlier contract versions this runtime still loads policies of: each
/// is a subset of [`CONTRACT_VERSION`] (0.4 added a pod's `workload`).
pub const SERVED_CONTRACTS: &[&str] = &["0.3.0"];
