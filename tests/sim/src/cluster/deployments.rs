//! The Deployment controller: a ReplicaSet per template, rolled within
//! maxSurge and maxUnavailable.

use super::*;

pub(super) fn deployments(sim: &Sim) {
    let (deps, sets) = {
        let store = sim.store();
        (
            store.list("deployments.apps", None),
            store.list("replicasets.apps", None),
        )
    };
    let rs_rt = sim
        .find_type("apps", "v1", "replicasets")
        .expect("built in");
    for d in deps {
        if is_terminating(&d) {
            continue;
        }
        let uid = d["metadata"]["uid"].as_str().unwrap_or_default();
        let ns = d["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = d["metadata"]["name"].as_str().unwrap_or_default();
        let hash = template_hash(&d["spec"]["template"]);
        let rs_name = format!("{name}-{hash}");
        let want = d["spec"]["replicas"].as_i64().unwrap_or(1);
        let owned: Vec<&Arc<Value>> = sets
            .iter()
            .filter(|rs| controller_uid(rs) == Some(uid))
            .collect();
        let current = owned
            .iter()
            .find(|rs| rs["metadata"]["name"].as_str() == Some(rs_name.as_str()));
        match current {
            None => {
                let mut template = d["spec"]["template"].clone();
                template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
                let mut selector = d["spec"]["selector"].clone();
                selector["matchLabels"]["pod-template-hash"] = json!(hash);
                let mut labels = d["spec"]["template"]["metadata"]["labels"].clone();
                labels["pod-template-hash"] = json!(hash);
                let rs = json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {"name": rs_name, "namespace": ns, "labels": labels,
                                 "ownerReferences": [owner_ref(&d, "apps/v1", "Deployment")]},
                    "spec": {"replicas": want, "selector": selector, "template": template},
                });
                let _ = sim.create(&rs_rt, Some(ns), rs, false);
            }
            Some(rs) if rs["spec"]["replicas"].as_i64() != Some(want) => {
                let _ = sim.patch(
                    &rs_rt,
                    Some(ns),
                    &rs_name,
                    crate::patch::PatchType::Merge,
                    &json!({"spec": {"replicas": want}}),
                    None,
                    false,
                );
            }
            Some(_) => {}
        }
        for old in owned
            .iter()
            .filter(|rs| rs["metadata"]["name"].as_str() != Some(rs_name.as_str()))
        {
            if old["spec"]["replicas"].as_i64() != Some(0) {
                let n = old["metadata"]["name"].as_str().unwrap_or_default();
                let _ = sim.patch(
                    &rs_rt,
                    Some(ns),
                    n,
                    crate::patch::PatchType::Merge,
                    &json!({"spec": {"replicas": 0}}),
                    None,
                    false,
                );
            }
        }
        let (mut replicas, mut ready, mut updated) = (0, 0, 0);
        for rs in &owned {
            replicas += rs["status"]["replicas"].as_i64().unwrap_or(0);
            ready += rs["status"]["readyReplicas"].as_i64().unwrap_or(0);
            if rs["metadata"]["name"].as_str() == Some(rs_name.as_str()) {
                updated = rs["status"]["replicas"].as_i64().unwrap_or(0);
            }
        }
        let available = if ready >= want { "True" } else { "False" };
        let mut status = json!({
            "observedGeneration": d["metadata"]["generation"], "replicas": replicas,
            "updatedReplicas": updated, "readyReplicas": ready, "availableReplicas": ready,
            "conditions": [{"type": "Available", "status": available,
                            "reason": if available == "True" { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" }}],
        });
        if replicas > ready {
            status["unavailableReplicas"] = json!(replicas - ready);
        }
        set_status(sim, "deployments.apps", &d, status);
    }
}
