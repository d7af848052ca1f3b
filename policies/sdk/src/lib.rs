//! Write nmo drain policies in Rust.
//!
//! A policy is a `cdylib` crate built for `wasm32-wasip2` that implements
//! [`Policy`] and exports it with [`export_policy!`]:
//!
//! ```ignore
//! use nmo_policy_sdk::*;
//!
//! struct MyPolicy;
//!
//! impl Policy for MyPolicy {
//!     fn plan_drain(m: Maintenance, node: Node, pods: Vec<Pod>) -> DrainPlan {
//!         let decisions = pods.iter().map(|p| p.decide(PodAction::evict(), 0)).collect();
//!         DrainPlan { decisions, attempt_timeout_ms: 30_000, max_concurrent_evictions: None }
//!     }
//!     fn on_failure(m: Maintenance, f: Failure) -> Verdict {
//!         Verdict::RetryWithBackoff
//!     }
//!     // `admit` (may the maintenance start?) and `validate_settings` have
//!     // defaults: the Go operator's admission rule, and no settings; so
//!     // have `plan_drain` and `on_failure` (the Go operator's rules).
//! }
//!
//! export_policy!(MyPolicy);
//! ```
//!
//! The contract is `wit/node-maintenance.wit` (version 0.4.0), where every
//! field is documented. Pods and nodes come as handles: each accessor
//! ([`Pod::label`], [`Pod::controller_kind`], ...) asks the host for that
//! one thing, so read only what the decision needs. This crate adds the
//! helpers a policy keeps needing, the Go operator's rules ([`defaults`]),
//! settings ([`Settings`]) and, for native unit tests, builders
//! ([`testing`]).

#[cfg(all(target_family = "wasm", feature = "bump-allocator"))]
pub mod alloc;

#[cfg(all(target_family = "wasm", feature = "bump-allocator"))]
#[global_allocator]
static ALLOCATOR: alloc::BumpAllocator = alloc::BumpAllocator::new();

#[allow(missing_docs, clippy::all)]
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "drain-policy",
        default_bindings_module: "nmo_policy_sdk::bindings",
        pub_export_macro: true,
        export_macro_name: "__export_guest",
    });
}

pub use bindings::medik8s::node_maintenance::types::{
    Admission, Completion, DrainPlan, DrainReport, EndedMaintenance, EtcdGuard, Failure,
    FleetMaintenance, KeyValue, Level, Maintenance, MaintenancePhase, Notice, Outcome, Owner,
    Parking, PodAction, PodDecision, PodHistory, PodPhase, PodRef, Removal, RemovalMethod, Taint,
    TaintEffect, Verdict, Waiting, Workload,
};

/// The annotation the kubelet puts on mirror (static) pods.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// The contract version this SDK builds policies for.
pub const CONTRACT_VERSION: &str = "0.4.0";

/// A drain policy: the decisions the operator asks for.
///
/// Every function is called in a fresh instance: nothing survives from one
/// call to the next.
pub trait Policy {
    /// How to drain `node`: one decision per pod of `pods` (every pod
    /// bound to the node), made with [`Pod::decide`]. Default: the Go
    /// operator's drain ([`defaults::plan`] with [`defaults::pod_action`]).
    fn plan_drain(_maintenance: Maintenance, _node: Node, pods: Vec<Pod>) -> DrainPlan {
        defaults::plan(&pods, defaults::pod_action)
    }

    /// What happens after a failure: retry, or give up. Default: the Go
    /// operator's answers ([`defaults::on_failure`]).
    fn on_failure(maintenance: Maintenance, failure: Failure) -> Verdict {
        defaults::on_failure(&maintenance, &failure)
    }

    /// Whether the maintenance may start now, given the rest of the fleet.
    /// Default: [`defaults::admit`] (admit, except the Go operator's etcd
    /// quorum rule on OpenShift control-plane nodes).
    fn admit(maintenance: Maintenance, node: Node, fleet: Fleet) -> Admission {
        defaults::admit(&maintenance, &node, &fleet)
    }

    /// Checks the settings `policies.yaml` gives the policy, when the
    /// policy set is loaded; an error refuses the set with its message.
    /// Default: no settings are accepted.
    fn validate_settings(settings: Settings) -> Result<(), String> {
        settings.allow_only(&[])
    }
}

/// Exports a [`Policy`] as the component's implementation of the contract.
#[macro_export]
macro_rules! export_policy {
    ($policy:ty) => {
        #[cfg(target_family = "wasm")]
        const _: () = {
            struct NmoPolicyExport;
            use $crate::bindings::medik8s::node_maintenance::types as host;
            impl $crate::bindings::Guest for NmoPolicyExport {
                fn validate_settings(
                    settings: ::std::vec::Vec<$crate::KeyValue>,
                ) -> ::std::result::Result<(), ::std::string::String> {
                    <$policy as $crate::Policy>::validate_settings($crate::Settings::new(settings))
                }
                fn admit(
                    maintenance: $crate::Maintenance,
                    node: host::Node,
                    fleet: host::Fleet,
                ) -> $crate::Admission {
                    <$policy as $crate::Policy>::admit(
                        maintenance,
                        $crate::Node::from_host(node),
                        $crate::Fleet::from_host(fleet),
                    )
                }
                fn plan_drain(
                    maintenance: $crate::Maintenance,
                    node: host::Node,
                    pods: ::std::vec::Vec<host::Pod>,
                ) -> $crate::DrainPlan {
                    <$policy as $crate::Policy>::plan_drain(
                        maintenance,
                        $crate::Node::from_host(node),
                        $crate::Pod::from_host_list(pods),
                    )
                }
                fn on_failure(
                    maintenance: $crate::Maintenance,
                    failure: $crate::Failure,
                ) -> $crate::Verdict {
                    <$policy as $crate::Policy>::on_failure(maintenance, failure)
                }
            }
    $crate::bindings::__export_guest!(NmoPolicyExport with_types_in $crate::bindings);
        };
        // A native build (the policy's own unit tests) exports nothing, but
        // the policy is still its code in use.
        #[cfg(not(target_family = "wasm"))]
        const _: () = {
            let _ = <$policy as $crate::Policy>::plan_drain as fn(_, _, _) -> _;
            let _ = <$policy as $crate::Policy>::on_failure as fn(_, _) -> _;
            let _ = <$policy as $crate::Policy>::admit as fn(_, _, _) -> _;
            let _ = <$policy as $crate::Policy>::validate_settings as fn(_) -> _;
        };
    };
}

/// Writes a line to the operator's log, tagged with the policy's name.
///
/// Outside WebAssembly (a policy's own native unit tests) the line goes to
/// standard error instead.
pub fn log(level: Level, message: &str) {
    #[cfg(target_family = "wasm")]
    bindings::log(level, message);
    #[cfg(not(target_family = "wasm"))]
    eprintln!("[{level:?}] {message}");
}

/// Looks a key up in a label or annotation list.
pub fn lookup<'a>(pairs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|kv| kv.key == key)
        .map(|kv| kv.value.as_str())
}

/// `90s`, `15m`, `2h`, `500ms` or a bare number of seconds, in
/// milliseconds; `None` for anything else (or zero).
pub fn duration_ms(text: &str) -> Option<u64> {
    let s = text.trim();
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = digits.parse().ok()?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(ms).filter(|&ms| ms > 0)
}

/// Milliseconds as a short duration (`10m`, `90s`, `1500ms`), for messages.
pub fn show_ms(ms: u64) -> String {
    match ms {
        ms if ms >= 3_600_000 && ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms >= 60_000 && ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms >= 1_000 && ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

mod settings;
pub use settings::Settings;

mod facts;
pub use facts::{Node, Pod};

mod claims;
pub use claims::Claim;

mod plans;
pub use plans::Fleet;

/// The Go operator's rules, as the default policy applies them, for
/// policies that change one thing and keep the rest.
pub mod defaults;

/// Builders for what a policy gets, for a policy's own native unit tests
/// (`cargo test`, no WebAssembly, no operator):
///
/// ```
/// use nmo_policy_sdk::testing::{maintenance, node, pod, positions};
/// use nmo_policy_sdk::*;
///
/// let pods = positions(vec![
///     pod("default", "web-1").owned_by("ReplicaSet", "web-5d4f"),
///     pod("kube-system", "agent-x").owned_by("DaemonSet", "agent"),
/// ]);
/// assert!(matches!(defaults::pod_action(&pods[0]), PodAction::Evict(_)));
/// assert!(matches!(defaults::pod_action(&pods[1]), PodAction::Skip(_)));
/// let plan = defaults::plan(&pods, defaults::pod_action);
/// assert_eq!(plan.decisions[1].pod, 1);
/// let m = maintenance("node-1").attempt(3);
/// assert_eq!(m.attempt, 3);
/// assert_eq!(node("node-1").label("missing"), None);
/// ```
///
/// Native builds only: a policy built for WebAssembly does not carry it.
#[cfg(not(target_family = "wasm"))]
pub mod testing;
