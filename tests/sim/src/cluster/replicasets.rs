//! The ReplicaSet controller: as many pods as the replicas, the newest
//! removed first.

use super::*;

pub(super) fn replicasets(sim: &Sim) {
    let (sets, by_owner) = workloads_and_pods(&sim.store(), "replicasets.apps");
    let pods_rt = pods_type(sim);
    for rs in sets {
        if is_terminating(&rs) {
            continue;
        }
        let uid = rs["metadata"]["uid"].as_str().unwrap_or_default();
        let empty = Vec::new();
        let owned = by_owner.get(uid).unwrap_or(&empty);
        let act = active(owned);
        let want = rs["spec"]["replicas"].as_i64().unwrap_or(1).max(0) as usize;
        let ns = rs["metadata"]["namespace"].as_str().unwrap_or_default();
        if act.len() < want {
            for _ in act.len()..want {
                let pod = pod_from_template(
                    &rs,
                    &rs["spec"]["template"],
                    owner_ref(&rs, "apps/v1", "ReplicaSet"),
                    None,
                    &[],
                );
                let _ = sim.create(&pods_rt, Some(ns), pod, false);
            }
        } else if act.len() > want {
            // As the ReplicaSet controller ranks them: not Ready first,
            // then the lowest controller.kubernetes.io/pod-deletion-cost.
            let mut extra: Vec<&&Arc<Value>> = act.iter().collect();
            extra.sort_by_key(|p| {
                let cost: i64 =
                    p["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"]
                        .as_str()
                        .and_then(|c| c.parse().ok())
                        .unwrap_or(0);
                (is_ready(p), cost)
            });
            for p in extra.into_iter().take(act.len() - want) {
                let _ = sim.delete(
                    &pods_rt,
                    Some(ns),
                    p["metadata"]["name"].as_str().unwrap_or_default(),
                    &DeleteOptions::default(),
                );
            }
        }
        let ready = act.iter().filter(|p| is_ready(p)).count();
        let status = json!({
            "replicas": act.len(), "fullyLabeledReplicas": act.len(), "readyReplicas": ready,
            "availableReplicas": ready, "observedGeneration": rs["metadata"]["generation"],
        });
        set_status(sim, "replicasets.apps", &rs, status);
    }
}
