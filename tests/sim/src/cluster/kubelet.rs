//! The kubelet: pods on a node start, become Ready, run, complete, and
//! terminate after their grace period (or are killed when it runs out); the
//! node lifecycle controller marks nodes without a kubelet NotReady.

use super::*;

/// The pods the kubelet looks at this pass: every pod on a full pass;
/// otherwise those that changed, those on a node that changed (created,
/// deleted, its kubelet gone or back), those terminating and those whose
/// time may have come.
pub(super) fn kubelet_pods(
    sim: &Sim,
    state: &ControllerState,
    changes: &Changes,
    everything: bool,
) -> Vec<Arc<Value>> {
    let store = sim.store();
    if everything {
        return store.list("pods", None);
    }
    let mut seen = HashSet::new();
    let mut pods = Vec::new();
    let changed_pods = changes
        .list
        .iter()
        .filter(|c| c.storage == "pods")
        .filter_map(|c| store.get("pods", &ObjKey::of(&c.object)));
    let changed_nodes: HashSet<&str> = changes
        .list
        .iter()
        .filter(|c| c.storage == "nodes")
        .filter_map(|c| c.object["metadata"]["name"].as_str())
        .collect();
    let on_changed_nodes = changed_nodes.into_iter().flat_map(|n| store.pods_on(n));
    for p in changed_pods.chain(on_changed_nodes) {
        if seen.insert(p["metadata"]["uid"].as_str().unwrap_or_default().to_owned()) {
            pods.push(p);
        }
    }
    // The terminating pods whose time has come.
    let now = sim.clock.now();
    let due: Vec<String> = sim
        .terminating
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(_, t)| now >= t.ends)
        .map(|(uid, _)| uid.clone())
        .collect();
    for uid in due.iter().chain(&state.timed) {
        if !seen.contains(uid)
            && let Some((storage, p)) = store.by_uid(uid)
            && storage == "pods"
        {
            seen.insert(uid.clone());
            pods.push(p);
        }
    }
    pods
}

/// When a terminating pod goes, by its annotations: never, after its
/// shutdown time, or when its grace period runs out.
pub fn termination_ends(pod: &Value, started: f64, deadline: f64) -> f64 {
    let annotations = &pod["metadata"]["annotations"];
    if annotations[annotations::NEVER_TERMINATE].as_str() == Some("true") {
        return f64::INFINITY;
    }
    let shutdown = if annotations[annotations::IGNORE_SIGTERM].as_str() == Some("true") {
        f64::INFINITY
    } else {
        annotation_f64(pod, annotations::SHUTDOWN_SECONDS).unwrap_or(0.5)
    };
    deadline.min(started + shutdown)
}

pub(super) fn kubelet(sim: &Sim, state: &mut ControllerState, changes: &Changes) {
    let now = sim.clock.now();
    let everything = changes.full;
    let pods = kubelet_pods(sim, state, changes, everything);
    let (nodes, without_kubelet): (HashSet<String>, HashSet<String>) = {
        let nodes = sim.store().list("nodes", None);
        let name = |n: &Arc<Value>| n["metadata"]["name"].as_str().map(str::to_owned);
        (
            nodes.iter().filter_map(name).collect(),
            nodes
                .iter()
                .filter(|n| has_no_kubelet(n))
                .filter_map(name)
                .collect(),
        )
    };
    let pods_rt = pods_type(sim);
    let terminating: HashMap<String, crate::state::Termination> = {
        let all = sim.terminating.lock().unwrap_or_else(|p| p.into_inner());
        pods.iter()
            .filter_map(|p| {
                let uid = p["metadata"]["uid"].as_str()?;
                Some((uid.to_owned(), *all.get(uid)?))
            })
            .collect()
    };
    for pod in &pods {
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        state.timed.remove(uid);
        let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) else {
            continue;
        };
        if !nodes.contains(node) {
            // The pod garbage collector removes pods bound to nodes that
            // no longer exist.
            let _ = sim.delete(
                &pods_rt,
                Some(ns),
                name,
                &DeleteOptions {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            );
            continue;
        }
        if without_kubelet.contains(node) {
            // Nothing runs there: the pod neither starts nor stops.
            continue;
        }
        if let Some(t) = terminating.get(uid) {
            if now >= termination_ends(pod, t.started, t.deadline) {
                sim.finish_pod_deletion(ns, name, uid);
            }
            continue;
        }
        if is_terminating(pod) || is_finished(pod) {
            continue;
        }
        let placed = match state.placed.get(uid) {
            Some(t) => *t,
            None => {
                state.placed.insert(uid.to_owned(), now);
                now
            }
        };
        let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
        if phase == "Pending" {
            let startup = annotation_f64(pod, annotations::STARTUP_SECONDS).unwrap_or(0.0);
            if now - placed < startup {
                state.timed.insert(uid.to_owned());
            } else {
                set_pod_status(sim, pod, running_status(pod));
                for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
                    let name = c["name"].as_str().unwrap_or_default();
                    let image = c["image"].as_str().unwrap_or_default();
                    sim.logs.append(
                        uid,
                        name,
                        &format!("[nmo-sim] {name}: started, image {image}, on {node}"),
                    );
                }
            }
        } else if let Some(run) = annotation_f64(pod, annotations::RUN_SECONDS)
            && phase == "Running"
        {
            if now - placed >= run {
                let mut st = pod["status"].clone();
                st["phase"] = json!("Succeeded");
                st["conditions"] =
                    json!([{"type": "Ready", "status": "False", "reason": "PodCompleted"}]);
                set_pod_status(sim, pod, st);
            } else {
                state.timed.insert(uid.to_owned());
            }
        }
    }
    // The pods that went: what the kubelet kept of them goes too.
    if everything {
        let store = sim.store();
        state.placed.retain(|uid, _| store.has_uid(uid));
        state.timed.retain(|uid| store.has_uid(uid));
        sim.logs.retain(|uid| store.has_uid(uid));
    } else {
        let gone = changes
            .list
            .iter()
            .filter(|c| c.storage == "pods" && c.kind == ChangeKind::Deleted)
            .filter_map(|c| c.object["metadata"]["uid"].as_str());
        for uid in gone {
            state.placed.remove(uid);
            state.timed.remove(uid);
            sim.logs.forget(uid);
        }
    }
}

pub(super) fn running_status(pod: &Value) -> Value {
    let now = now_rfc3339();
    let containers: Vec<Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            json!({
                "name": c["name"], "image": c["image"], "ready": true, "started": true,
                "restartCount": 0, "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    let ip = format!(
        "10.244.{}.{}",
        fnv(pod["spec"]["nodeName"].as_str().unwrap_or_default()) % 250,
        fnv(pod["metadata"]["uid"].as_str().unwrap_or_default()) % 250 + 2
    );
    json!({
        "phase": "Running",
        "qosClass": pod["status"]["qosClass"].as_str().unwrap_or("BestEffort"),
        "startTime": now,
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "hostIP": "192.168.0.10",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
        ],
        "containerStatuses": containers,
    })
}

pub(super) fn fnv(s: &str) -> u32 {
    s.bytes().fold(0x811c9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x01000193)
    })
}

/// Writes a pod's status if the pod is still the same one.
pub(super) fn set_pod_status(sim: &Sim, pod: &Value, status: Value) {
    let mut store = sim.store();
    let key = ObjKey::of(pod);
    if let Some(cur) = store.get("pods", &key)
        && cur["metadata"]["uid"] == pod["metadata"]["uid"]
        && !is_terminating(&cur)
    {
        let mut new = (*cur).clone();
        new["status"] = status;
        store.put("pods", new);
    }
}

/// Whether a node runs no kubelet ([`annotations::NO_KUBELET`]).
pub(super) fn has_no_kubelet(node: &Value) -> bool {
    node["metadata"]["annotations"][annotations::NO_KUBELET].as_str() == Some("true")
}

/// What the node's kubelet (or, without one, the node controller) says of
/// the node: a node created through the API joins the cluster (Ready, with
/// nodeInfo, capacity and allocatable) unless it has no kubelet, when it
/// stays NotReady.
pub(super) fn node_lifecycle(sim: &Sim) {
    let nodes = sim.store().list("nodes", None);
    for node in nodes {
        let name = node["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let ready = node["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .map(|c| c["status"].as_str().unwrap_or_default().to_owned());
        let no_kubelet = has_no_kubelet(&node);
        let settled = if no_kubelet {
            ready.as_deref() == Some("Unknown")
        } else {
            ready.is_some()
        };
        if settled {
            continue;
        }
        let mut new = (*node).clone();
        if !new["status"].is_object() {
            // The kubelet owns the node's status: whatever a client wrote
            // there that is not an object, it writes over.
            new["status"] = json!({});
        }
        if no_kubelet {
            new["status"]["conditions"] = json!([{"type": "Ready", "status": "Unknown",
                "reason": "NodeStatusNeverUpdated", "message": "Kubelet never posted node status.",
                "lastTransitionTime": now_rfc3339()}]);
        } else {
            let joined = crate::node(&name);
            for field in ["capacity", "allocatable", "nodeInfo", "addresses"] {
                if new["status"][field].is_null() {
                    new["status"][field] = joined["status"][field].clone();
                }
            }
            new["status"]["conditions"] = json!([{"type": "Ready", "status": "True",
                "reason": "KubeletReady", "message": "kubelet is posting ready status",
                "lastTransitionTime": now_rfc3339()}]);
        }
        sim.store().put("nodes", new);
    }
}
