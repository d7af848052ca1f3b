//! The StatefulSet controller: ordinal pods, one at a time.

use super::*;

pub(super) fn statefulsets(sim: &Sim) {
    let (sets, by_owner) = workloads_and_pods(&sim.store(), "statefulsets.apps");
    let pods_rt = pods_type(sim);
    for s in sets {
        if is_terminating(&s) {
            continue;
        }
        let uid = s["metadata"]["uid"].as_str().unwrap_or_default();
        let ns = s["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = s["metadata"]["name"].as_str().unwrap_or_default();
        let want = s["spec"]["replicas"].as_i64().unwrap_or(1).max(0) as usize;
        let parallel = s["spec"]["podManagementPolicy"].as_str() == Some("Parallel");
        let empty = Vec::new();
        let owned = by_owner.get(uid).unwrap_or(&empty);
        let by_name: BTreeMap<&str, &Arc<Value>> = owned
            .iter()
            .map(|p| (p["metadata"]["name"].as_str().unwrap_or_default(), p))
            .collect();
        let existing_names: HashSet<String> = sim
            .store()
            .list("pods", Some(ns))
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        let revision = format!("{name}-{}", &template_hash(&s["spec"]["template"])[..8]);
        for i in 0..want {
            let pod_name = format!("{name}-{i}");
            match by_name.get(pod_name.as_str()) {
                Some(p) if is_ready(p) && !is_terminating(p) => continue,
                Some(_) if parallel => continue,
                Some(_) => break, // OrderedReady: wait for this one
                None if existing_names.contains(&pod_name) => break,
                None => {
                    let pod = pod_from_template(
                        &s,
                        &s["spec"]["template"],
                        owner_ref(&s, "apps/v1", "StatefulSet"),
                        Some(pod_name.clone()),
                        &[
                            ("statefulset.kubernetes.io/pod-name", pod_name.clone()),
                            ("apps.kubernetes.io/pod-index", i.to_string()),
                            ("controller-revision-hash", revision.clone()),
                        ],
                    );
                    let _ = sim.create(&pods_rt, Some(ns), pod, false);
                    if !parallel {
                        break;
                    }
                }
            }
        }
        for p in owned {
            let idx = p["metadata"]["name"]
                .as_str()
                .and_then(|n| n.rsplit('-').next())
                .and_then(|i| i.parse::<usize>().ok());
            if idx.is_some_and(|i| i >= want) && !is_terminating(p) {
                let _ = sim.delete(
                    &pods_rt,
                    Some(ns),
                    p["metadata"]["name"].as_str().unwrap_or_default(),
                    &DeleteOptions::default(),
                );
            }
        }
        let act = active(owned);
        let ready = act.iter().filter(|p| is_ready(p)).count();
        let status = json!({
            "observedGeneration": s["metadata"]["generation"], "replicas": act.len(),
            "readyReplicas": ready, "currentReplicas": act.len(), "updatedReplicas": act.len(),
            "availableReplicas": ready, "currentRevision": revision, "updateRevision": revision,
        });
        set_status(sim, "statefulsets.apps", &s, status);
    }
}
