//! The scheduler: an unscheduled pod goes to a node that is Ready,
//! schedulable, untainted for it (or tolerated), and matches its node
//! selector and affinity; otherwise an event says why not.

use super::*;

/// Whether `tolerations` tolerate `taint`.
pub fn tolerates(tolerations: &Value, taint: &Value) -> bool {
    tolerations.as_array().into_iter().flatten().any(|t| {
        let key_ok = t["key"]
            .as_str()
            .is_none_or(|k| k.is_empty() || Some(k) == taint["key"].as_str());
        let exists = t["operator"].as_str() == Some("Exists");
        let value_ok = exists
            || t["value"].as_str().unwrap_or_default()
                == taint["value"].as_str().unwrap_or_default();
        let effect_ok = t["effect"]
            .as_str()
            .is_none_or(|e| e.is_empty() || Some(e) == taint["effect"].as_str());
        let any_key = t["key"].as_str().is_none_or(str::is_empty);
        key_ok && value_ok && effect_ok && (!any_key || exists)
    })
}

/// Whether `node` satisfies a pod's required node affinity
/// (`nodeSelectorTerms`: any term; within one, every expression).
pub(super) fn affinity_allows(node: &Value, affinity: &Value) -> bool {
    let terms = &affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    let Some(terms) = terms.as_array() else {
        return true;
    };
    let labels = &node["metadata"]["labels"];
    let name = node["metadata"]["name"].clone();
    let matches = |e: &Value, value: &Value| -> bool {
        let values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let v = value.as_str();
        let number = |s: Option<&str>| s.and_then(|s| s.parse::<i64>().ok());
        match e["operator"].as_str().unwrap_or_default() {
            "In" => v.is_some_and(|v| values.contains(&v)),
            "NotIn" => v.is_none_or(|v| !values.contains(&v)),
            "Exists" => v.is_some(),
            "DoesNotExist" => v.is_none(),
            "Gt" => {
                matches!((number(v), number(values.first().copied())), (Some(a), Some(b)) if a > b)
            }
            "Lt" => {
                matches!((number(v), number(values.first().copied())), (Some(a), Some(b)) if a < b)
            }
            _ => false,
        }
    };
    terms.iter().any(|term| {
        let exprs = term["matchExpressions"].as_array().into_iter().flatten();
        let fields = term["matchFields"].as_array().into_iter().flatten();
        let empty = term["matchExpressions"]
            .as_array()
            .is_none_or(Vec::is_empty)
            && term["matchFields"].as_array().is_none_or(Vec::is_empty);
        !empty
            && exprs
                .clone()
                .all(|e| matches(e, &labels[e["key"].as_str().unwrap_or_default()]))
            && fields
                .clone()
                .all(|e| e["key"] == "metadata.name" && matches(e, &name))
    })
}

pub(super) fn schedulable_for(node: &Value, tolerations: &Value, node_selector: &Value) -> bool {
    let unsched_taint = json!({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"});
    if node["spec"]["unschedulable"].as_bool() == Some(true)
        && !tolerates(tolerations, &unsched_taint)
    {
        return false;
    }
    // Only a node whose kubelet says Ready takes pods.
    let ready = node["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    });
    if !ready {
        return false;
    }
    let taints_ok = node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|t| {
            !matches!(t["effect"].as_str(), Some("NoSchedule" | "NoExecute"))
                || tolerates(tolerations, t)
        });
    let selector_ok = node_selector
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| node["metadata"]["labels"][k] == *v);
    taints_ok && selector_ok
}

/// The pods waiting for a node: among every pod when a node changed,
/// otherwise among the pods that changed and those left unplaced last
/// pass.
pub(super) fn unscheduled(
    sim: &Sim,
    state: &ControllerState,
    changes: &Changes,
) -> Vec<Arc<Value>> {
    let store = sim.store();
    let waiting = |p: &Arc<Value>| {
        p["spec"]["nodeName"].as_str().is_none_or(str::is_empty) && !is_terminating(p)
    };
    if changes.touched("nodes") {
        // Every pod on no node (a node came, went, or changed).
        return store.pods_on("").into_iter().filter(waiting).collect();
    }
    let keys: std::collections::BTreeSet<ObjKey> = changes
        .list
        .iter()
        .filter(|c| c.storage == "pods" && c.kind != ChangeKind::Deleted)
        .map(|c| ObjKey::of(&c.object))
        .chain(state.unscheduled.iter().cloned())
        .collect();
    keys.iter()
        .filter_map(|k| store.get("pods", k))
        .filter(waiting)
        .collect()
}

pub(super) fn scheduler(sim: &Sim, state: &mut ControllerState, changes: &Changes) {
    let pending = unscheduled(sim, state, changes);
    state.unscheduled.clear();
    if pending.is_empty() {
        return;
    }
    let (pods, nodes) = {
        let store = sim.store();
        (store.list("pods", None), store.list("nodes", None))
    };
    let mut load: HashMap<String, usize> = nodes
        .iter()
        .map(|n| {
            (
                n["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                0,
            )
        })
        .collect();
    for p in &pods {
        if let Some(n) = p["spec"]["nodeName"].as_str()
            && let Some(c) = load.get_mut(n)
        {
            *c += 1;
        }
    }
    let mut failed_scheduling: Vec<(Arc<Value>, String)> = Vec::new();
    for pod in &pending {
        let candidates = nodes.iter().filter(|n| {
            schedulable_for(n, &pod["spec"]["tolerations"], &pod["spec"]["nodeSelector"])
                && affinity_allows(n, &pod["spec"]["affinity"])
        });
        let best = candidates.min_by_key(|n| {
            let name = n["metadata"]["name"].as_str().unwrap_or_default();
            (load.get(name).copied().unwrap_or(0), name.to_owned())
        });
        let mut store = sim.store();
        let key = ObjKey::of(pod);
        let Some(cur) = store.get("pods", &key) else {
            continue;
        };
        if cur["metadata"]["uid"] != pod["metadata"]["uid"]
            || cur["spec"]["nodeName"]
                .as_str()
                .is_some_and(|n| !n.is_empty())
        {
            continue;
        }
        let mut new = (*cur).clone();
        match best {
            Some(node) => {
                let name = node["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                new["spec"]["nodeName"] = json!(name);
                new["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()}]);
                *load.entry(name).or_default() += 1;
            }
            None => {
                state.unscheduled.insert(key.clone());
                let unmatched = nodes
                    .iter()
                    .filter(|n| {
                        !affinity_allows(n, &pod["spec"]["affinity"])
                            || !schedulable_for(
                                &json!({"metadata": n["metadata"], "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
                                &json!([{"operator": "Exists"}]),
                                &pod["spec"]["nodeSelector"],
                            )
                    })
                    .count();
                let mut reasons = Vec::new();
                if unmatched > 0 {
                    reasons.push(format!(
                        "{unmatched} node(s) didn't match Pod's node affinity/selector"
                    ));
                }
                if nodes.len() > unmatched {
                    reasons.push(format!(
                        "{} node(s) were unschedulable, not ready or had untolerated taints",
                        nodes.len() - unmatched
                    ));
                }
                let msg = format!(
                    "0/{} nodes are available: {}.",
                    nodes.len(),
                    reasons.join(", ")
                );
                if cur["status"]["conditions"][0]["message"].as_str() == Some(msg.as_str()) {
                    continue;
                }
                new["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg, "lastTransitionTime": now_rfc3339()}]);
                failed_scheduling.push((pod.clone(), msg));
            }
        }
        store.put("pods", new);
    }
    for (pod, message) in failed_scheduling {
        scheduling_event(sim, &pod, &message);
    }
}

/// The scheduler's Warning event for a pod that fits nowhere.
pub(super) fn scheduling_event(sim: &Sim, pod: &Value, message: &str) {
    let Some(rt) = sim.find_type("", "v1", "events") else {
        return;
    };
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let now = now_rfc3339();
    let event = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": format!("{}.", pod["metadata"]["name"].as_str().unwrap_or("pod")), "namespace": ns},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": ns,
            "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]},
        "reason": "FailedScheduling", "type": "Warning", "message": message,
        "source": {"component": "default-scheduler"},
        "reportingComponent": "default-scheduler",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    });
    let _ = sim.create(&rt, Some(ns), event, false);
}
