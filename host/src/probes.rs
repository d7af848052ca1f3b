//! What the probes ask: the operator's readiness checks, wired from the
//! controller's state and the policy store for the probes server
//! (`server.rs`), which knows neither.

use crate::controller::Context;

/// The operator's readiness checks: `informer-sync` (the NodeMaintenance
/// cache has synced; a standby replica waiting for leadership counts as
/// ready when `standby_ready`) and `policy` (a policy set is in use; its
/// detail names it and any rejected reload).
pub fn readiness_checks(
    ctx: std::sync::Arc<Context>,
    standby_ready: bool,
) -> Vec<(&'static str, crate::server::Check)> {
    let policies = ctx.policies().clone();
    vec![
        (
            "informer-sync",
            Box::new(move || match (ctx.started(), ctx.synced()) {
                (true, _) if ctx.crd_missing() => Err(
                    "the NodeMaintenance CRD is not installed (`nmo crd | kubectl apply -f -`)"
                        .into(),
                ),
                (_, true) if !ctx.watching() => Err("the NodeMaintenance watch is failing".into()),
                (_, true) => Ok(String::new()),
                (false, false) if standby_ready => Ok(String::new()),
                (false, false) => Err("the controller has not started".into()),
                (true, false) => Err("the NodeMaintenance cache has not synced".into()),
            }),
        ),
        ("policy", Box::new(move || Ok(policies.readiness()))),
    ]
}
