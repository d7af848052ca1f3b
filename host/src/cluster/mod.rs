//! What the cluster's objects say, read the same way by the drain
//! (`controller/drain`) and by `nmo plan`, which shows what a drain would
//! do: the workloads behind a node's pods ([`workloads`]), the replicas an
//! owner has as its owner set them ([`surge_record`]), which
//! PodDisruptionBudgets cover a pod ([`covers`]), and the most removals a
//! drain has in flight at once ([`HOST_MAX_CONCURRENT`]).

use std::collections::BTreeMap;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;

pub(crate) mod surge_record;
pub(crate) mod workloads;

/// Removals in flight at once when the policy sets no limit (and the most
/// a policy may ask for): each one in flight holds a connection to the API
/// server, and more than this only makes the server's queue longer.
pub(crate) const HOST_MAX_CONCURRENT: usize = 64;

/// Whether `pdb` covers a pod with `labels`: a budget without a selector
/// picks none; an empty one picks every pod of its namespace (policy/v1).
pub fn covers(pdb: &PodDisruptionBudget, labels: &BTreeMap<String, String>) -> bool {
    use kube::core::SelectorExt;
    pdb.spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .and_then(|sel| kube::core::Selector::try_from(sel).ok())
        .is_some_and(|sel| sel.matches(labels))
}
