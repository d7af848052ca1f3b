//! The DaemonSet controller: a pod on every node it may run on.

use super::*;

pub(super) fn daemonsets(sim: &Sim) {
    let (sets, by_owner, nodes) = {
        let store = sim.store();
        let (sets, by_owner) = workloads_and_pods(&store, "daemonsets.apps");
        (sets, by_owner, store.list("nodes", None))
    };
    let pods_rt = pods_type(sim);
    for ds in sets {
        if is_terminating(&ds) {
            continue;
        }
        let uid = ds["metadata"]["uid"].as_str().unwrap_or_default();
        let ns = ds["metadata"]["namespace"].as_str().unwrap_or_default();
        let template = &ds["spec"]["template"];
        // The DaemonSet controller adds these tolerations to its pods.
        let mut tolerations = template["spec"]["tolerations"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for key in [
            "node.kubernetes.io/unschedulable",
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
            "node.kubernetes.io/disk-pressure",
            "node.kubernetes.io/memory-pressure",
            "node.kubernetes.io/pid-pressure",
        ] {
            tolerations.push(json!({"key": key, "operator": "Exists", "effect": if key.ends_with("ready") || key.ends_with("unreachable") { "NoExecute" } else { "NoSchedule" }}));
        }
        let tolerations = Value::Array(tolerations);
        let empty = Vec::new();
        let owned = by_owner.get(uid).unwrap_or(&empty);
        let mut on_node: HashMap<&str, Vec<&Arc<Value>>> = HashMap::new();
        for p in owned.iter().filter(|p| !is_terminating(p)) {
            on_node
                .entry(p["spec"]["nodeName"].as_str().unwrap_or_default())
                .or_default()
                .push(p);
        }
        let (mut desired, mut ready) = (0, 0);
        for node in &nodes {
            let node_name = node["metadata"]["name"].as_str().unwrap_or_default();
            let here = on_node
                .get(node_name)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let evicting = node["spec"]["taints"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| t["effect"] == "NoExecute" && !tolerates(&tolerations, t));
            if !here.is_empty() {
                if evicting {
                    for p in here {
                        let _ = sim.delete(
                            &pods_rt,
                            Some(ns),
                            p["metadata"]["name"].as_str().unwrap_or_default(),
                            &DeleteOptions::default(),
                        );
                    }
                } else {
                    desired += 1;
                    ready += here.iter().filter(|p| is_ready(p)).count();
                }
                continue;
            }
            let mut unsched = (**node).clone();
            unsched["spec"]["unschedulable"] = json!(false);
            if schedulable_for(&unsched, &tolerations, &template["spec"]["nodeSelector"]) {
                desired += 1;
                let mut pod = pod_from_template(
                    &ds,
                    template,
                    owner_ref(&ds, "apps/v1", "DaemonSet"),
                    None,
                    &[],
                );
                pod["spec"]["nodeName"] = json!(node_name);
                pod["spec"]["tolerations"] = tolerations.clone();
                let _ = sim.create(&pods_rt, Some(ns), pod, false);
            }
        }
        let status = json!({
            "desiredNumberScheduled": desired, "currentNumberScheduled": desired,
            "numberReady": ready, "numberAvailable": ready, "updatedNumberScheduled": desired,
            "numberMisscheduled": 0, "observedGeneration": ds["metadata"]["generation"],
        });
        set_status(sim, "daemonsets.apps", &ds, status);
    }
}
