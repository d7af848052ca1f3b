//! The PodDisruptionBudget status controller: healthy pods, the pods
//! desired and the disruptions allowed.

use super::*;

pub(super) fn int_or_percent(v: &Value, total: i64, round_up: bool) -> Option<i64> {
    if let Some(i) = v.as_i64() {
        return Some(i);
    }
    let p: f64 = v.as_str()?.strip_suffix('%')?.parse().ok()?;
    let x = p / 100.0 * total as f64;
    Some(if round_up { x.ceil() } else { x.floor() } as i64)
}

/// A PodDisruptionBudget's status, computed from the pods now.
pub fn pdb_status(store: &Store, pdb: &Value) -> Value {
    let ns = pdb["metadata"]["namespace"].as_str().unwrap_or_default();
    let selector = LabelSelector::from_object(&pdb["spec"]["selector"]).unwrap_or_default();
    let pods: Vec<Arc<Value>> = store
        .list("pods", Some(ns))
        .into_iter()
        .filter(|p| !selector.is_empty() && selector.matches(&p["metadata"]["labels"]))
        .collect();
    // Expected pods: the scale of their controllers, as the disruption
    // controller counts them; a pod without one counts once.
    let mut expected = 0i64;
    let mut seen = HashSet::new();
    for p in &pods {
        match controller_uid(p) {
            Some(uid) if seen.insert(uid.to_owned()) => {
                expected += store
                    .by_uid(uid)
                    .and_then(|(_, o)| o["spec"]["replicas"].as_i64())
                    .unwrap_or(1);
            }
            Some(_) => {}
            None => expected += 1,
        }
    }
    let healthy = pods
        .iter()
        .filter(|p| is_ready(p) && !is_terminating(p))
        .count() as i64;
    let desired = if !pdb["spec"]["minAvailable"].is_null() {
        int_or_percent(&pdb["spec"]["minAvailable"], expected, true).unwrap_or(0)
    } else if !pdb["spec"]["maxUnavailable"].is_null() {
        (expected - int_or_percent(&pdb["spec"]["maxUnavailable"], expected, true).unwrap_or(0))
            .max(0)
    } else {
        0
    };
    let allowed = (healthy - desired).max(0);
    json!({
        "observedGeneration": pdb["metadata"]["generation"],
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [{
            "type": "DisruptionAllowed",
            "status": if allowed > 0 { "True" } else { "False" },
            "reason": if allowed > 0 { "SufficientPods" } else { "InsufficientPods" },
            "message": "",
            "observedGeneration": pdb["metadata"]["generation"],
            "lastTransitionTime": pdb["status"]["conditions"][0]["lastTransitionTime"].as_str().map_or_else(now_rfc3339, str::to_owned),
        }],
    })
}

pub(super) fn pdb_statuses(sim: &Sim) {
    let mut store = sim.store();
    for pdb in store.list("poddisruptionbudgets.policy", None) {
        let mut status = pdb_status(&store, &pdb);
        // As the disruption controller: an evicted pod stays in
        // disruptedPods (and out of the healthy count) until it is seen
        // going; then it leaves the map.
        let ns = pdb["metadata"]["namespace"].as_str().unwrap_or_default();
        if let Some(disrupted) = pdb["status"]["disruptedPods"].as_object() {
            let kept: serde_json::Map<String, Value> = disrupted
                .iter()
                .filter(|(name, _)| {
                    store
                        .get("pods", &ObjKey::new(ns, name))
                        .is_some_and(|p| !is_terminating(&p))
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !kept.is_empty() {
                let allowed = status["disruptionsAllowed"].as_i64().unwrap_or(0);
                status["disruptionsAllowed"] = json!((allowed - kept.len() as i64).max(0));
                status["disruptedPods"] = Value::Object(kept);
            }
        }
        let mut cmp_old = pdb["status"].clone();
        let mut cmp_new = status.clone();
        for s in [&mut cmp_old, &mut cmp_new] {
            if let Some(m) = s.as_object_mut() {
                m.remove("conditions");
            }
        }
        if cmp_old != cmp_new {
            let mut new = (*pdb).clone();
            new["status"] = status;
            store.put("poddisruptionbudgets.policy", new);
        }
    }
}
