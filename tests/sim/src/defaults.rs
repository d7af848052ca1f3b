//! Server-side defaulting, as the real API server applies it when it
//! decodes an object (on create, update and patch alike) and as its
//! default admission plugins complete a new pod. The README's table lists
//! what is defaulted here; everything else is stored as sent.

use serde_json::{Value, json};

use crate::resources::ResourceType;

/// Sets `obj[key]` to `value` when it is missing or null (nothing when
/// `obj` is not an object).
fn or(obj: &mut Value, key: &str, value: Value) {
    if let Some(m) = obj.as_object_mut()
        && m.get(key).is_none_or(Value::is_null)
    {
        m.insert(key.to_owned(), value);
    }
}

/// The object at `path` below `v`, made (`{}`) where it is missing or
/// null; `None` when something on the way is not an object (a client sent
/// `"spec": "x"`: left for validation to refuse, never indexed into).
fn object_at<'a>(v: &'a mut Value, path: &[&str]) -> Option<&'a mut Value> {
    let mut cur = v;
    for key in path {
        or(cur, key, json!({}));
        cur = cur.as_object_mut()?.get_mut(*key)?;
        if !cur.is_object() {
            return None;
        }
    }
    Some(cur)
}

/// The array at `key` of `v`, if there is one (nothing is inserted).
fn array_at<'a>(v: &'a mut Value, key: &str) -> impl Iterator<Item = &'a mut Value> {
    v.as_object_mut()
        .and_then(|m| m.get_mut(key))
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
}

/// A container's defaults (`SetDefaults_Container`).
fn container(c: &mut Value) {
    or(c, "terminationMessagePath", json!("/dev/termination-log"));
    or(c, "terminationMessagePolicy", json!("File"));
    // Always for `:latest` or no tag, IfNotPresent otherwise.
    let image = c["image"].as_str().unwrap_or_default();
    let tag = image
        .rsplit('/')
        .next()
        .and_then(|last| last.split_once(':').map(|(_, t)| t.to_owned()));
    let always = !image.contains('@') && tag.as_deref().is_none_or(|t| t == "latest");
    or(
        c,
        "imagePullPolicy",
        json!(if always { "Always" } else { "IfNotPresent" }),
    );
    or(c, "resources", json!({}));
}

/// A pod spec's defaults (`SetDefaults_PodSpec`), for pods and templates.
fn pod_spec(spec: &mut Value) {
    or(spec, "restartPolicy", json!("Always"));
    or(spec, "terminationGracePeriodSeconds", json!(30));
    or(spec, "dnsPolicy", json!("ClusterFirst"));
    or(spec, "securityContext", json!({}));
    or(spec, "schedulerName", json!("default-scheduler"));
    or(spec, "enableServiceLinks", json!(true));
    for list in ["containers", "initContainers"] {
        for c in array_at(spec, list) {
            container(c);
        }
    }
}

/// What the default admission plugins add to a new pod: the priority
/// (Priority), the not-ready/unreachable tolerations
/// (DefaultTolerationSeconds), the service account (ServiceAccount).
fn pod_admission(spec: &mut Value) {
    or(spec, "priority", json!(0));
    or(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
    or(spec, "serviceAccountName", json!("default"));
    or(spec, "serviceAccount", spec["serviceAccountName"].clone());
    let mut tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let has = tolerations.iter().any(|t| {
            (t["key"] == key || t["key"].is_null() && t["operator"] == "Exists")
                && (t["effect"].is_null() || t["effect"] == "NoExecute")
        });
        if !has {
            tolerations.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
        }
    }
    spec["tolerations"] = json!(tolerations);
}

/// Defaults applied whenever the server decodes an object.
pub fn apply(rt: &ResourceType, obj: &mut Value) {
    let spec_defaults: &[(&str, Value)] = match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "nodes") | ("coordination.k8s.io", "leases") | ("", "pods") => &[],
        ("", "namespaces") => &[("finalizers", json!(["kubernetes"]))],
        ("", "services") => &[
            ("type", json!("ClusterIP")),
            ("sessionAffinity", json!("None")),
        ],
        ("apps", "deployments") => &[
            ("replicas", json!(1)),
            ("revisionHistoryLimit", json!(10)),
            ("progressDeadlineSeconds", json!(600)),
            (
                "strategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}),
            ),
        ],
        ("apps", "replicasets") => &[("replicas", json!(1))],
        ("apps", "statefulsets") => &[
            ("replicas", json!(1)),
            ("podManagementPolicy", json!("OrderedReady")),
            ("revisionHistoryLimit", json!(10)),
            (
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
            ),
        ],
        ("apps", "daemonsets") => &[
            ("revisionHistoryLimit", json!(10)),
            (
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
            ),
        ],
        ("batch", "jobs") => &[
            ("parallelism", json!(1)),
            ("completions", json!(1)),
            ("backoffLimit", json!(6)),
        ],
        _ => return,
    };
    let Some(spec) = object_at(obj, &["spec"]) else {
        return;
    };
    for (key, value) in spec_defaults {
        or(spec, key, value.clone());
    }
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => pod_spec(spec),
        ("", "services") => {
            for p in array_at(spec, "ports") {
                or(p, "protocol", json!("TCP"));
                let port = p.get("port").cloned().unwrap_or(Value::Null);
                or(p, "targetPort", port);
            }
        }
        ("apps", _) | ("batch", "jobs") => {
            if let Some(template) = object_at(spec, &["template", "spec"]) {
                if rt.plural == "jobs" {
                    or(template, "restartPolicy", json!("Never"));
                }
                pod_spec(template);
            }
        }
        _ => {}
    }
}

/// What a new pod gets beyond decoding: admission plugins' additions.
pub fn on_create(rt: &ResourceType, obj: &mut Value) {
    if rt.group.is_empty()
        && rt.plural == "pods"
        && let Some(spec) = object_at(obj, &["spec"])
    {
        pod_admission(spec);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(group: &str, plural: &str) -> ResourceType {
        crate::resources::builtin()
            .into_iter()
            .find(|r| r.group == group && r.plural == plural)
            .unwrap()
    }

    /// What a client sent that is not an object is left for validation:
    /// never indexed into, never a panic, nothing inserted beside it.
    #[test]
    fn malformed_objects_are_left_as_sent() {
        for (group, plural) in [
            ("", "pods"),
            ("", "services"),
            ("apps", "deployments"),
            ("batch", "jobs"),
        ] {
            let r = rt(group, plural);
            for bad in [
                json!({"spec": "x"}),
                json!({"spec": {"template": 5}}),
                json!({"spec": {"template": {"spec": []}}}),
                json!({"spec": {"ports": "80", "containers": {"a": 1}}}),
            ] {
                let mut obj = bad.clone();
                apply(&r, &mut obj);
                on_create(&r, &mut obj);
                if !bad["spec"].is_object() {
                    assert_eq!(obj, bad, "{plural}");
                }
            }
            let mut not_an_object = json!("x");
            apply(&r, &mut not_an_object);
            assert_eq!(not_an_object, json!("x"));
        }
        // No key is added as null.
        let mut pod = json!({"spec": {"containers": []}});
        apply(&rt("", "pods"), &mut pod);
        assert!(pod["spec"].get("initContainers").is_none());
    }

    #[test]
    fn a_node_without_spec_gets_an_empty_one() {
        let mut node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}});
        apply(&rt("", "nodes"), &mut node);
        assert_eq!(node["spec"], json!({}));
    }

    #[test]
    fn a_bare_pod_gets_the_api_defaults_and_admissions_additions() {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "image": "nginx"}, {"name": "b", "image": "nginx:1.27"}]}});
        let pods = rt("", "pods");
        apply(&pods, &mut pod);
        on_create(&pods, &mut pod);
        let spec = &pod["spec"];
        assert_eq!(spec["terminationGracePeriodSeconds"], 30);
        assert_eq!(spec["restartPolicy"], "Always");
        assert_eq!(spec["dnsPolicy"], "ClusterFirst");
        assert_eq!(spec["schedulerName"], "default-scheduler");
        assert_eq!(spec["enableServiceLinks"], true);
        assert_eq!(spec["priority"], 0);
        assert_eq!(spec["serviceAccountName"], "default");
        assert_eq!(spec["tolerations"].as_array().unwrap().len(), 2);
        assert_eq!(spec["tolerations"][0]["tolerationSeconds"], 300);
        assert_eq!(spec["containers"][0]["imagePullPolicy"], "Always");
        assert_eq!(spec["containers"][1]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(
            spec["containers"][0]["terminationMessagePath"],
            "/dev/termination-log"
        );
        // What was set is kept.
        let mut pod = json!({"spec": {"terminationGracePeriodSeconds": 5, "containers": []}});
        apply(&pods, &mut pod);
        assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 5);
    }
}
