//! Server-side defaulting, as the real API server applies it when it
//! decodes an object (on create, update and patch alike) and as its
//! default admission plugins complete a new pod. The README's table lists
//! what is defaulted here; everything else is stored as sent.

use serde_json::{Value, json};

use crate::resources::ResourceType;

/// Sets `obj[key]` to `value` when it is missing or null.
fn or(obj: &mut Value, key: &str, value: Value) {
    if obj.is_object() && obj[key].is_null() {
        obj[key] = value;
    }
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
    if !spec.is_object() {
        *spec = json!({});
    }
    or(spec, "restartPolicy", json!("Always"));
    or(spec, "terminationGracePeriodSeconds", json!(30));
    or(spec, "dnsPolicy", json!("ClusterFirst"));
    or(spec, "securityContext", json!({}));
    or(spec, "schedulerName", json!("default-scheduler"));
    or(spec, "enableServiceLinks", json!(true));
    for list in ["containers", "initContainers"] {
        for c in spec[list].as_array_mut().into_iter().flatten() {
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
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "nodes") => or(obj, "spec", json!({})),
        ("", "pods") => pod_spec(&mut obj["spec"]),
        ("", "namespaces") => {
            or(obj, "spec", json!({}));
            or(&mut obj["spec"], "finalizers", json!(["kubernetes"]));
        }
        ("", "services") => {
            or(obj, "spec", json!({}));
            let spec = &mut obj["spec"];
            or(spec, "type", json!("ClusterIP"));
            or(spec, "sessionAffinity", json!("None"));
            for p in spec["ports"].as_array_mut().into_iter().flatten() {
                or(p, "protocol", json!("TCP"));
                if p["targetPort"].is_null() {
                    p["targetPort"] = p["port"].clone();
                }
            }
        }
        ("apps", "deployments") => {
            or(obj, "spec", json!({}));
            let spec = &mut obj["spec"];
            or(spec, "replicas", json!(1));
            or(spec, "revisionHistoryLimit", json!(10));
            or(spec, "progressDeadlineSeconds", json!(600));
            or(
                spec,
                "strategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}),
            );
            pod_spec(&mut spec["template"]["spec"]);
        }
        ("apps", "replicasets") => {
            or(obj, "spec", json!({}));
            or(&mut obj["spec"], "replicas", json!(1));
            pod_spec(&mut obj["spec"]["template"]["spec"]);
        }
        ("apps", "statefulsets") => {
            or(obj, "spec", json!({}));
            let spec = &mut obj["spec"];
            or(spec, "replicas", json!(1));
            or(spec, "podManagementPolicy", json!("OrderedReady"));
            or(spec, "revisionHistoryLimit", json!(10));
            or(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
            );
            pod_spec(&mut spec["template"]["spec"]);
        }
        ("apps", "daemonsets") => {
            or(obj, "spec", json!({}));
            let spec = &mut obj["spec"];
            or(spec, "revisionHistoryLimit", json!(10));
            or(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
            );
            pod_spec(&mut spec["template"]["spec"]);
        }
        ("batch", "jobs") => {
            or(obj, "spec", json!({}));
            for (k, d) in [("parallelism", 1), ("completions", 1), ("backoffLimit", 6)] {
                or(&mut obj["spec"], k, json!(d));
            }
            or(
                &mut obj["spec"]["template"]["spec"],
                "restartPolicy",
                json!("Never"),
            );
            pod_spec(&mut obj["spec"]["template"]["spec"]);
        }
        ("coordination.k8s.io", "leases") => or(obj, "spec", json!({})),
        _ => {}
    }
}

/// What a new pod gets beyond decoding: admission plugins' additions.
pub fn on_create(rt: &ResourceType, obj: &mut Value) {
    if rt.group.is_empty() && rt.plural == "pods" {
        pod_admission(&mut obj["spec"]);
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
