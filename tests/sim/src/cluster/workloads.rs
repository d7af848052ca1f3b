//! What the workload controllers share: their pods by controller, a pod
//! from a template, status writes.

use super::*;

/// The objects of one workload kind and the pods by the uid of their
/// controller (not gathered when there is no such object).
pub(super) fn workloads_and_pods(
    store: &Store,
    storage: &str,
) -> (Vec<Arc<Value>>, PodsByController) {
    let sets = store.list(storage, None);
    let pods = if sets.is_empty() {
        HashMap::new()
    } else {
        pods_by_controller(store)
    };
    (sets, pods)
}

pub(super) type PodsByController = HashMap<String, Vec<Arc<Value>>>;

/// Pods by the uid of their controller.
pub(super) fn pods_by_controller(store: &Store) -> PodsByController {
    let mut m = PodsByController::new();
    for p in store.list("pods", None) {
        if let Some(uid) = controller_uid(&p) {
            m.entry(uid.to_owned()).or_default().push(p.clone());
        }
    }
    m
}

pub(super) fn pod_from_template(
    owner: &Value,
    template: &Value,
    owner_ref: Value,
    name: Option<String>,
    extra_labels: &[(&str, String)],
) -> Value {
    let mut meta = json!({
        "namespace": owner["metadata"]["namespace"],
        "labels": template["metadata"]["labels"],
        "ownerReferences": [owner_ref],
    });
    if !template["metadata"]["annotations"].is_null() {
        meta["annotations"] = template["metadata"]["annotations"].clone();
    }
    match name {
        Some(n) => meta["name"] = json!(n),
        None => {
            meta["generateName"] = json!(format!(
                "{}-",
                owner["metadata"]["name"].as_str().unwrap_or_default()
            ))
        }
    }
    for (k, v) in extra_labels {
        meta["labels"][*k] = json!(v);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]})
}

/// Writes `status` on an object (through its storage) if it changed.
pub(super) fn set_status(sim: &Sim, storage: &str, obj: &Value, status: Value) {
    if obj["status"] == status {
        return;
    }
    let mut store = sim.store();
    if let Some(cur) = store.get(storage, &ObjKey::of(obj))
        && cur["metadata"]["uid"] == obj["metadata"]["uid"]
        && cur["status"] != status
    {
        let mut new = (*cur).clone();
        new["status"] = status;
        store.put(storage, new);
    }
}

pub(super) fn active(pods: &[Arc<Value>]) -> Vec<&Arc<Value>> {
    pods.iter()
        .filter(|p| !is_terminating(p) && !is_finished(p))
        .collect()
}

pub(super) fn template_hash(template: &Value) -> String {
    let h = fnv(&template.to_string());
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = h as u64 | ((fnv(&format!("{h}")) as u64) << 32);
    (0..10)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
            n /= ALPHABET.len() as u64;
            c
        })
        .collect()
}
