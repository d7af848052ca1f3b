//! The garbage collector: an object whose owners are all gone is deleted.

use super::*;

/// Deletes objects all of whose owners are gone (background propagation).
pub(super) fn garbage_collect(sim: &Sim, state: &mut ControllerState) {
    let mut doomed: Vec<(String, Value)> = Vec::new();
    state.owners.clear();
    {
        let store = sim.store();
        for rt in sim.all_types() {
            if rt.group == "events.k8s.io" {
                continue;
            }
            for obj in store.list(&rt.storage, None) {
                let Some(refs) = obj["metadata"]["ownerReferences"].as_array() else {
                    continue;
                };
                state.owners.extend(
                    refs.iter()
                        .filter_map(|r| r["uid"].as_str().map(str::to_owned)),
                );
                if refs.is_empty() || is_terminating(&obj) {
                    continue;
                }
                let alive = refs
                    .iter()
                    .any(|r| r["uid"].as_str().and_then(|u| store.by_uid(u)).is_some());
                if !alive {
                    doomed.push((rt.plural.clone() + "." + &rt.group, (*obj).clone()));
                }
            }
        }
    }
    for (_, obj) in doomed {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let kind = obj["kind"].as_str().unwrap_or_default();
        let Some(rt) = sim
            .all_types()
            .into_iter()
            .find(|t| t.group == group && t.version == version && t.kind == kind)
        else {
            continue;
        };
        let ns = obj["metadata"]["namespace"].as_str();
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let _ = sim.delete(&rt, ns, name, &DeleteOptions::default());
    }
}
