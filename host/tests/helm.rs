//! The Helm chart (`deploy/helm/node-maintenance-operator`) is generated
//! from `deploy/default` as kustomize renders it, so the two never drift:
//! its CRD goes to `crds/`, every other object to a template of its own
//! with the operator's namespace replaced by the release's, the image and
//! the replica count from the values, and the policies ConfigMap's files
//! read from `deploy/policies` (through the chart's `files/policies`
//! link). These tests check the chart on disk is that generation, and
//! that the real `helm` (built with the control plane) lints it and
//! renders exactly what kustomize renders. `real_deploy.rs` installs it.
//!
//! After a change under `deploy/`: `NMO_WRITE_CHART=1 cargo test -p nmo
//! --test suite helm::` rewrites the chart's generated files.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The operator's namespace in `deploy/default`, the release's in the chart.
const NS: &str = "node-maintenance-operator-system";
/// The leases namespace the medik8s operators share.
const LEASES_NS: &str = "medik8s-leases";
/// The image `deploy/default` names.
const IMAGE: &str = "nmo:latest";

fn chart_dir() -> PathBuf {
    common::real::deploy_dir().join("helm/node-maintenance-operator")
}

/// `deploy/<overlay>` as kustomize renders it.
fn kustomized(overlay: &str) -> Vec<Value> {
    common::real::rendered(overlay)
}

fn kind(o: &Value) -> &str {
    o["kind"].as_str().unwrap_or_default()
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or_default()
}

/// A template's file name: its kind and name, as `kubectl` spells them.
fn file_name(o: &Value) -> String {
    let short = name(o)
        .strip_prefix("node-maintenance-operator-")
        .unwrap_or(name(o));
    format!("{}-{short}.yaml", kind(o).to_lowercase())
}

/// Keeps `{{` and `}}` in the objects' own text (a dashboard's legends)
/// from being read as Helm directives.
fn escape_braces(text: &str) -> String {
    text.replace("{{", "\u{0}OPEN\u{0}")
        .replace("}}", "{{ \"}}\" }}")
        .replace("\u{0}OPEN\u{0}", "{{ \"{{\" }}")
}

/// Where the registry credentials' Secret is mounted when
/// `policies.registrySecret` names one.
const REGISTRY_MOUNT: &str = "/etc/nmo/registry";
const REGISTRY_SECRET: &str = ".Values.policies.registrySecret";

/// Objects that only some values install: the condition, by kind and name.
fn condition(o: &Value) -> Option<&'static str> {
    match (kind(o), name(o)) {
        // cert-manager issues the webhook's certificate and injects its CA:
        // without it, no webhook (as deploy/no-cert-manager).
        ("Certificate" | "Issuer" | "ValidatingWebhookConfiguration", _) => {
            Some(".Values.webhook.certManager")
        }
        // The rights the metrics' TokenReview and SubjectAccessReview need
        // (as deploy/metrics-open drops them).
        ("ClusterRole" | "ClusterRoleBinding", n) if n.contains("metrics-auth") => {
            Some(".Values.metrics.secure")
        }
        // The Prometheus Operator's objects (deploy/prometheus): only where
        // its CRDs are, so only when asked for.
        ("ServiceMonitor" | "PrometheusRule", _) => Some(".Values.prometheus.enabled"),
        _ => None,
    }
}

/// Lines kept only when a value is set.
fn when(condition: &str, lines: &[&str]) -> Vec<String> {
    let mut out = vec![format!("{{{{- if {condition} }}}}")];
    out.extend(lines.iter().map(|l| (*l).to_owned()));
    out.push("{{- end }}".into());
    out
}

/// The Deployment's values: image, replicas, the priority class, metrics
/// security, and the registry credentials of pulled policies.
fn template_deployment(
    o: &mut Value,
    directive: &mut impl FnMut(String) -> Value,
    block: &mut impl FnMut(Vec<String>) -> Value,
) {
    o["spec"]["replicas"] = directive("{{ .Values.replicas }}".into());
    let pod = &mut o["spec"]["template"]["spec"];
    if pod.get("priorityClassName").is_some() {
        pod["priorityClassName"] = directive("{{ .Values.priorityClassName | quote }}".into());
    }
    for c in pod["containers"].as_array_mut().into_iter().flatten() {
        if c["image"] != IMAGE {
            continue;
        }
        c["image"] = directive(
            "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
                .into(),
        );
        for arg in c["args"].as_array_mut().into_iter().flatten() {
            if arg == "--metrics-bind-address=:8443" {
                *arg = directive(
                    "--metrics-bind-address=:{{ if .Values.metrics.secure }}8443{{ else }}8080{{ end }}"
                        .into(),
                );
            } else if arg == "--metrics-secure=true" {
                *arg = directive("--metrics-secure={{ .Values.metrics.secure }}".into());
            }
        }
        if let Some(args) = c["args"].as_array_mut() {
            args.push(block(when(
                REGISTRY_SECRET,
                &[&format!(
                    "- --registry-config={REGISTRY_MOUNT}/.dockerconfigjson"
                )],
            )));
        }
        for port in c["ports"].as_array_mut().into_iter().flatten() {
            if port["containerPort"] == 8443 {
                port["containerPort"] =
                    directive("{{ if .Values.metrics.secure }}8443{{ else }}8080{{ end }}".into());
            }
        }
        if let Some(mounts) = c["volumeMounts"].as_array_mut() {
            mounts.push(block(when(
                REGISTRY_SECRET,
                &[
                    &format!("- mountPath: {REGISTRY_MOUNT}"),
                    "  name: policy-registry",
                    "  readOnly: true",
                ],
            )));
        }
    }
    if let Some(volumes) = pod["volumes"].as_array_mut() {
        volumes.push(block(when(
            REGISTRY_SECRET,
            &[
                "- name: policy-registry",
                "  secret:",
                "    secretName: {{ .Values.policies.registrySecret }}",
            ],
        )));
    }
}

/// The ServiceMonitor's endpoint follows `metrics.secure`: HTTPS with
/// Prometheus's token where the metrics are secure (deploy/prometheus),
/// plain HTTP on the `metrics` port where they are open
/// (deploy/metrics-open's patch, read from that overlay).
fn template_service_monitor(o: &mut Value, block: &mut impl FnMut(Vec<String>) -> Value) {
    let open = kustomized("metrics-open")
        .into_iter()
        .find(|m| kind(m) == "ServiceMonitor")
        .expect("deploy/metrics-open has the ServiceMonitor");
    let item = |endpoint: &Value| -> Vec<String> {
        nmo::yaml::to_string(endpoint)
            .unwrap()
            .lines()
            .enumerate()
            .map(|(i, l)| format!("{}{l}", if i == 0 { "- " } else { "  " }))
            .collect()
    };
    let mut lines = vec!["{{- if .Values.metrics.secure }}".to_owned()];
    lines.extend(item(&o["spec"]["endpoints"][0]));
    lines.push("{{- else }}".into());
    lines.extend(item(&open["spec"]["endpoints"][0]));
    lines.push("{{- end }}".into());
    o["spec"]["endpoints"] = Value::Array(vec![block(lines)]);
}

/// `text` (an object's YAML, which has labels) with the labels a value
/// holds added to its own (for a Prometheus that selects its
/// ServiceMonitors and rules by label, as kube-prometheus-stack's selects
/// `release`).
fn with_extra_labels(text: &str, value: &str) -> String {
    let labels = "\n  labels:\n";
    assert!(text.contains(labels), "no labels to add to: {text}");
    text.replacen(
        labels,
        &format!(
            "{labels}{{{{- with {value} }}}}\n{{{{ toYaml . | indent 4 }}}}\n{{{{- end }}}}\n"
        ),
        1,
    )
}

/// One object as a template.
fn template(o: &Value) -> String {
    let mut o = o.clone();
    let mut directives: Vec<(String, String)> = Vec::new();
    let mut blocks: Vec<(String, Vec<String>)> = Vec::new();
    // A placeholder for each directive: a plain scalar the serializer
    // leaves as it is.
    let mut directive = |text: String| {
        let key = format!("HELM_DIRECTIVE_{}", directives.len());
        directives.push((key.clone(), text));
        Value::String(key)
    };
    // A list item standing for lines of its own (a conditional item): its
    // line is replaced by them, at its indentation.
    let mut block = |lines: Vec<String>| {
        let key = format!("HELM_BLOCK_{}", blocks.len());
        blocks.push((key.clone(), lines));
        Value::String(key)
    };
    if kind(&o) == "Deployment" {
        template_deployment(&mut o, &mut directive, &mut block);
    }
    if kind(&o) == "Job" {
        o["spec"]["template"]["spec"]["containers"][0]["image"] = directive(
            "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
                .into(),
        );
    }
    if kind(&o) == "ServiceMonitor" {
        template_service_monitor(&mut o, &mut block);
    }
    if kind(&o) == "Service" && o["spec"]["ports"][0]["port"] == 8443 {
        o["spec"]["ports"][0]["name"] =
            directive("{{ if .Values.metrics.secure }}https{{ else }}metrics{{ end }}".into());
        o["spec"]["ports"][0]["port"] =
            directive("{{ if .Values.metrics.secure }}8443{{ else }}8080{{ end }}".into());
    }
    let policies_dir = common::real::deploy_dir().join("policies");
    if kind(&o) == "ConfigMap" {
        for (field, pipe) in [("binaryData", "b64enc"), ("data", "toJson")] {
            if let Some(entries) = o[field].as_object_mut() {
                for (key, value) in entries.iter_mut() {
                    if !policies_dir.join(key).is_file() {
                        continue;
                    }
                    let file = format!(".Files.Get \"files/policies/{key}\"");
                    *value = directive(if key == "policies.yaml" {
                        format!("{{{{ .Values.policies.config | default ({file}) | {pipe} }}}}")
                    } else {
                        format!("{{{{ {file} | {pipe} }}}}")
                    });
                }
            }
        }
    }
    let mut text = escape_braces(&nmo::yaml::to_string(&o).unwrap());
    text = text.replace(NS, "{{ .Release.Namespace }}");
    for (key, value) in directives {
        text = text.replace(&key, &value);
    }
    for (key, lines) in blocks {
        let item = format!("- {key}");
        text = text
            .lines()
            .map(|line| match line.find(&item) {
                Some(at) if line[at..] == item => {
                    let indent = &line[..at];
                    lines
                        .iter()
                        .map(|l| format!("{indent}{l}"))
                        .collect::<Vec<_>>()
                        .join("\n")
                }
                _ => line.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        text.push('\n');
    }
    if matches!(kind(&o), "ServiceMonitor" | "PrometheusRule") {
        text = with_extra_labels(&text, ".Values.prometheus.labels");
    }
    let mut out =
        String::from("# Generated from deploy/default by host/tests/helm.rs: do not edit.\n");
    if kind(&o) == "Namespace" {
        out.push_str(&leases_namespace(&text));
        return out;
    }
    match condition(&o) {
        Some(cond) => {
            out.push_str(&format!("{{{{- if {cond} }}}}\n"));
            out.push_str(&text);
            out.push_str("{{- end }}\n");
        }
        None => out.push_str(&text),
    }
    out
}

/// The shared leases namespace (`medik8s-leases`): the other medik8s
/// operators (and the Go Node Maintenance Operator) make it and use it too.
/// So the chart makes it only where it is not there, or is its own (an
/// upgrade), and `helm uninstall` keeps it: a Go-operator user's `helm
/// install` is not refused for a namespace it cannot import, and removing
/// the chart takes no other operator's leases with it. (`helm template`
/// has no cluster to look in: it renders the namespace, as kustomize does.)
fn leases_namespace(text: &str) -> String {
    let keep = text.replacen(
        "metadata:\n",
        "metadata:\n  annotations:\n    helm.sh/resource-policy: keep\n",
        1,
    );
    format!(
        "{{{{- $leases := lookup \"v1\" \"Namespace\" \"\" \"{LEASES_NS}\" }}}}\n\
         {{{{- $owner := dig \"metadata\" \"annotations\" \"meta.helm.sh/release-name\" \"\" ($leases | default dict) }}}}\n\
         {{{{- if and .Values.leases.createNamespace (or (not $leases) (eq $owner .Release.Name)) }}}}\n\
         {keep}{{{{- end }}}}\n"
    )
}

/// What `helm install` prints after installing: what was installed, how to
/// put a node into maintenance and follow it, and what is missing without
/// cert-manager.
const NOTES: &str = r#"nmo {{ .Chart.AppVersion }} (the Node Maintenance Operator, with WebAssembly
drain policies) runs in {{ .Release.Namespace }}: {{ .Values.replicas }} replica(s), one leading.

Put a node into maintenance (cordon, taint, drain) and follow it:

  kubectl apply -f - <<EOF
  apiVersion: nodemaintenance.medik8s.io/v1beta1
  kind: NodeMaintenance
  metadata: {name: maintenance-<node>}
  spec: {nodeName: <node>, reason: "kernel upgrade"}
  EOF
  kubectl get nm
  kubectl delete nm maintenance-<node>     # the node comes back

What a maintenance would do first, changing nothing: nmo plan <node>
(or kubectl nm plan <node>, with the nmo binary on PATH as kubectl-nm).
{{- if not .Values.webhook.certManager }}

The validating webhook is not registered (webhook.certManager=false): a
NodeMaintenance of a node that does not exist, or a second one of a node,
is not refused at creation.
{{- end }}
{{- if .Values.metrics.secure }}

Metrics: HTTPS on :8443, for clients bound to the ClusterRole
node-maintenance-operator-metrics-reader.
{{- end }}
"#;

/// The name of the CRD hook's objects.
const CRD_HOOK: &str = "node-maintenance-operator-crd-apply";
/// The name of the clean-up hook's objects.
const CLEANUP_HOOK: &str = "node-maintenance-operator-cleanup";

/// The hook that puts the CRD in place before every install and upgrade:
/// a Job running the release's own image, `nmo crd --apply` (server-side,
/// taking over the fields another manager set), under a ServiceAccount
/// that may create CRDs and read and patch this one only. Not in `crds/`:
/// Helm 4 applies those server-side without forcing, so a cluster where
/// the Go operator's CRD was put by OLM or `kubectl replace` refused the
/// install (`conflict with "kubectl-replace": .spec.versions`).
/// `helm uninstall` keeps the CRD (it is no release's).
fn crd_hook(deployment: &Value) -> Vec<Value> {
    hook(
        deployment,
        &Hook {
            name: CRD_HOOK,
            events: "pre-install,pre-upgrade",
            container: "crd",
            args: &["crd", "--apply"],
            cluster_wide: true,
            rules: serde_json::json!([
                {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                 "verbs": ["create"]},
                {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                 "resourceNames": [nmo::crd::CRD_NAME], "verbs": ["get", "patch"]},
            ]),
        },
    )
}

/// The hook that removes, after `helm uninstall` deleted the release's
/// objects, what nothing else would: `nmo cleanup` waits for the
/// operator's pods to go, then deletes the leader lease (its holder could
/// not release it: Helm deletes the Role as the pods terminate) and the
/// webhook's Secret (cert-manager keeps it when the Certificate goes).
/// Its rights: in the release's namespace only, those two objects by name.
fn cleanup_hook(deployment: &Value) -> Vec<Value> {
    hook(
        deployment,
        &Hook {
            name: CLEANUP_HOOK,
            events: "post-delete",
            container: "cleanup",
            args: &["cleanup", "--namespace", NS],
            cluster_wide: false,
            rules: serde_json::json!([
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                 "resourceNames": [nmo::controller::leader::LOCK_NAME], "verbs": ["get", "delete"]},
                {"apiGroups": [""], "resources": ["secrets"],
                 "resourceNames": [nmo::uninstall::WEBHOOK_SECRET], "verbs": ["delete"]},
                {"apiGroups": ["cert-manager.io"], "resources": ["certificates"],
                 "resourceNames": [nmo::uninstall::WEBHOOK_CERTIFICATE], "verbs": ["get"]},
            ]),
        },
    )
}

/// A Helm hook: a Job running the release's own image with `args`, under
/// a ServiceAccount of its own bound to `rules` (a ClusterRole when
/// `cluster_wide`, else a Role in the release's namespace). The Job's pod
/// is the Deployment's (security context, nodes it may run on), its one
/// container the manager's image. The RBAC objects come first (weight
/// -10); the hook's objects go once the Job succeeds, a failed one stays
/// with its log.
struct Hook<'a> {
    name: &'a str,
    events: &'a str,
    container: &'a str,
    args: &'a [&'a str],
    cluster_wide: bool,
    rules: Value,
}

fn hook(deployment: &Value, h: &Hook) -> Vec<Value> {
    let meta = |weight: &str, namespaced: bool| {
        let mut m = serde_json::json!({"name": h.name, "annotations": {
            "helm.sh/hook": h.events,
            "helm.sh/hook-weight": weight,
            "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded",
        }});
        if namespaced {
            m["namespace"] = Value::from(NS);
        }
        m
    };
    let pod = &deployment["spec"]["template"]["spec"];
    let manager = &pod["containers"][0];
    let mut job_pod = serde_json::json!({
        "serviceAccountName": h.name,
        "restartPolicy": "OnFailure",
        "containers": [{
            "name": h.container,
            "image": manager["image"],
            "command": manager["command"],
            "args": h.args,
            "securityContext": manager["securityContext"],
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
        }],
    });
    for field in ["securityContext", "nodeSelector", "tolerations", "affinity"] {
        if let Some(v) = pod.get(field) {
            job_pod[field] = v.clone();
        }
    }
    if job_pod["containers"][0]["command"].is_null() {
        job_pod["containers"][0]
            .as_object_mut()
            .unwrap()
            .remove("command");
    }
    let (role, binding) = if h.cluster_wide {
        ("ClusterRole", "ClusterRoleBinding")
    } else {
        ("Role", "RoleBinding")
    };
    vec![
        serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta("-10", true)}),
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": role,
            "metadata": meta("-10", !h.cluster_wide), "rules": h.rules}),
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": binding,
            "metadata": meta("-10", !h.cluster_wide),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role, "name": h.name},
            "subjects": [{"kind": "ServiceAccount", "name": h.name, "namespace": NS}]}),
        serde_json::json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta("0", true),
            "spec": {"backoffLimit": 4, "activeDeadlineSeconds": 300, "template": {"spec": job_pod}}}),
    ]
}

/// Whether a rendered object is one of a hook's (Helm runs it around the
/// release; kustomize has no such thing).
fn is_hook(o: &Value) -> bool {
    !o["metadata"]["annotations"]["helm.sh/hook"].is_null()
}

/// The chart's generated files: path under the chart, content.
fn generated() -> BTreeMap<PathBuf, String> {
    let mut files = BTreeMap::new();
    files.insert(Path::new("templates").join("NOTES.txt"), NOTES.to_owned());
    let objects = kustomized("default");
    let deployment = objects
        .iter()
        .find(|o| kind(o) == "Deployment")
        .expect("deploy/default has the Deployment");
    for o in crd_hook(deployment)
        .into_iter()
        .chain(cleanup_hook(deployment))
    {
        files.insert(Path::new("templates").join(file_name(&o)), template(&o));
    }
    let monitoring = kustomized("with-prometheus")
        .into_iter()
        .filter(|o| matches!(kind(o), "ServiceMonitor" | "PrometheusRule"));
    for o in objects.iter().cloned().chain(monitoring) {
        let o = &o;
        match kind(o) {
            // The release's namespace is made by Helm (--create-namespace).
            "Namespace" if name(o) == NS => {}
            // The hook applies it.
            "CustomResourceDefinition" => {}
            _ => {
                files.insert(Path::new("templates").join(file_name(o)), template(o));
            }
        }
    }
    files
}

/// The chart on disk is the generation from `deploy/default`.
#[test]
fn the_chart_is_generated_from_deploy_default() {
    let chart = chart_dir();
    common::generated::check(&chart, &["templates"], &generated(), "NMO_WRITE_CHART");
    // No `crds/`: Helm 4 would apply it unforced (see [`crd_hook`]).
    assert!(!chart.join("crds").exists(), "the chart has a crds/ again");
    // The policies it ships are deploy/policies' own files.
    let link = chart.join("files/policies");
    assert_eq!(
        std::fs::canonicalize(&link).unwrap(),
        std::fs::canonicalize(common::real::deploy_dir().join("policies")).unwrap()
    );
}

fn helm() -> PathBuf {
    nmo_control_plane::Binaries::ensure()
        .expect("the control plane's binaries build")
        .path("helm")
}

fn run(args: &[&str]) -> String {
    common::stdout_of(std::process::Command::new(helm()).args(args))
}

/// An object without what only one of the two tools adds: kustomize's
/// base64 is wrapped, Helm's not; compared as their decoded bytes.
fn comparable(mut o: Value) -> Value {
    use base64::Engine;
    // The chart keeps the shared leases namespace on uninstall.
    if kind(&o) == "Namespace"
        && let Some(metadata) = o.get_mut("metadata").and_then(Value::as_object_mut)
        && let Some(annotations) = metadata
            .get_mut("annotations")
            .and_then(Value::as_object_mut)
    {
        annotations.remove("helm.sh/resource-policy");
        if annotations.is_empty() {
            metadata.remove("annotations");
        }
    }
    if let Some(entries) = o["binaryData"].as_object_mut() {
        for value in entries.values_mut() {
            let text: String = value
                .as_str()
                .unwrap_or_default()
                .split_whitespace()
                .collect();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text)
                .unwrap();
            *value = Value::String(format!("{} bytes, sha256 {}", bytes.len(), sha(&bytes)));
        }
    }
    o
}

fn sha(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(bytes))
}

fn by_kind_and_name(objects: Vec<Value>) -> BTreeMap<(String, String), Value> {
    objects
        .into_iter()
        .map(|o| ((kind(&o).to_owned(), name(&o).to_owned()), comparable(o)))
        .collect()
}

/// `helm template` into the operator's namespace with `set` values: its
/// objects by kind and name, but the hook's.
fn helm_objects(set: &[&str]) -> BTreeMap<(String, String), Value> {
    helm_rendered(set)
        .into_iter()
        .filter(|(_, o)| !is_hook(o))
        .collect()
}

/// `helm template` into the operator's namespace with `set` values, the
/// hook's objects too.
fn helm_rendered(set: &[&str]) -> BTreeMap<(String, String), Value> {
    let chart = chart_dir().display().to_string();
    let mut args = vec![
        "template",
        "nmo",
        &chart,
        "--namespace",
        NS,
        "--include-crds",
    ];
    for s in set {
        args.extend(["--set", s]);
    }
    let rendered = run(&args);
    by_kind_and_name(
        nmo::yaml::documents::<Value>(&rendered)
            .unwrap()
            .into_iter()
            .filter(|o| !o.is_null())
            .collect(),
    )
}

/// `deploy/<overlay>` as kustomize renders it, but the operator's
/// namespace (Helm makes it), the CRD (the chart's hook applies it) and
/// the kinds given.
fn kustomize_objects(overlay: &str, without: &[&str]) -> BTreeMap<(String, String), Value> {
    by_kind_and_name(
        kustomized(overlay)
            .into_iter()
            .filter(|o| !(kind(o) == "Namespace" && name(o) == NS))
            .filter(|o| kind(o) != "CustomResourceDefinition")
            .filter(|o| !without.contains(&kind(o)))
            .collect(),
    )
}

fn assert_same(
    helm: &BTreeMap<(String, String), Value>,
    kustomize: &BTreeMap<(String, String), Value>,
) {
    assert_eq!(
        helm.keys().collect::<Vec<_>>(),
        kustomize.keys().collect::<Vec<_>>()
    );
    for (key, want) in kustomize {
        assert_eq!(&helm[key], want, "{key:?}");
    }
}

/// The chart's values for the variants the overlays ship: without
/// cert-manager it renders deploy/no-cert-manager, with open metrics
/// deploy/metrics-open (its Prometheus Operator objects with
/// `prometheus.enabled`), with `prometheus.enabled` deploy/with-prometheus;
/// a policies.yaml of one's own and a registry
/// Secret for pulled policies go where the operator reads them.
#[test]
fn the_charts_values_render_the_overlays_variants() {
    assert_same(
        &helm_objects(&["webhook.certManager=false"]),
        &kustomize_objects("no-cert-manager", &[]),
    );
    assert_same(
        &helm_objects(&["metrics.secure=false"]),
        &kustomize_objects("metrics-open", &["PrometheusRule", "ServiceMonitor"]),
    );
    assert_same(
        &helm_objects(&["metrics.secure=false", "prometheus.enabled=true"]),
        &kustomize_objects("metrics-open", &[]),
    );
    assert_same(
        &helm_objects(&["prometheus.enabled=true"]),
        &kustomize_objects("with-prometheus", &[]),
    );
    // Labels for a Prometheus that selects by label go on both objects,
    // beside their own.
    let labelled = helm_objects(&["prometheus.enabled=true", "prometheus.labels.release=kps"]);
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        let (_, o) = labelled
            .iter()
            .find(|((k, _), _)| k == kind)
            .unwrap_or_else(|| panic!("no {kind}"));
        assert_eq!(o["metadata"]["labels"]["release"], "kps", "{o}");
        assert_eq!(
            o["metadata"]["labels"]["control-plane"], "controller-manager",
            "{o}"
        );
    }
    let config = "default: never-force\npull:\n  gentle: r.example/p@sha256:00\n";
    let objects = helm_objects(&[
        "policies.registrySecret=regcred",
        &format!("policies.config={}", config.replace(',', "\\,")),
    ]);
    let cm = &objects[&(
        "ConfigMap".to_owned(),
        "node-maintenance-operator-policies".to_owned(),
    )];
    assert_eq!(cm["data"]["policies.yaml"], config);
    let deployment = &objects[&(
        "Deployment".to_owned(),
        "node-maintenance-operator-controller-manager".to_owned(),
    )];
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert!(
        container["args"]
            .as_array()
            .unwrap()
            .contains(&Value::from(format!(
                "--registry-config={REGISTRY_MOUNT}/.dockerconfigjson"
            ))),
        "{container}"
    );
    assert!(
        container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "policy-registry" && m["mountPath"] == REGISTRY_MOUNT),
        "{container}"
    );
    assert!(
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == "regcred"),
        "{pod}"
    );
}

/// `helm lint` passes, and `helm template` into the operator's namespace
/// renders exactly the objects kustomize renders for `deploy/default`
/// (but the namespace itself, which `helm install --create-namespace`
/// makes); into another namespace, every reference follows it.
#[test]
fn helm_renders_what_kustomize_renders() {
    let chart = chart_dir().display().to_string();
    run(&["lint", "--strict", &chart]);
    assert_same(&helm_objects(&[]), &kustomize_objects("default", &[]));

    let elsewhere = run(&[
        "template",
        "nmo",
        &chart,
        "--namespace",
        "ops",
        "--set",
        "image.repository=registry.example/nmo,image.tag=v1,replicas=3,leases.createNamespace=false",
    ]);
    assert!(!elsewhere.contains(NS), "{elsewhere}");
    assert!(elsewhere.contains("node-maintenance-operator-webhook-service.ops.svc"));
    assert!(
        elsewhere
            .contains("cert-manager.io/inject-ca-from: ops/node-maintenance-operator-serving-cert")
    );
    assert!(elsewhere.contains("image: registry.example/nmo:v1"));
    assert!(elsewhere.contains("replicas: 3"));
    assert!(!elsewhere.contains("\nkind: Namespace\n"), "{elsewhere}");
}

/// The objects of the hook named `name`, rendered with an image set.
fn hook_objects(name: &str) -> BTreeMap<(String, String), Value> {
    helm_rendered(&["image.repository=registry.example/nmo", "image.tag=v9"])
        .into_iter()
        .filter(|((_, n), o)| is_hook(o) && n == name)
        .collect()
}

/// The chart's hook runs the release's image to apply the CRD, with the
/// rights to do that and nothing else, before the release's objects, and
/// goes once it succeeded.
#[test]
fn the_charts_hook_applies_the_crd_with_the_releases_image() {
    let hook = hook_objects(CRD_HOOK);
    let kinds: Vec<&str> = hook.keys().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        ["ClusterRole", "ClusterRoleBinding", "Job", "ServiceAccount"]
    );
    let job = &hook[&("Job".to_owned(), CRD_HOOK.to_owned())];
    let annotations = &job["metadata"]["annotations"];
    assert_eq!(annotations["helm.sh/hook"], "pre-install,pre-upgrade");
    assert_eq!(
        annotations["helm.sh/hook-delete-policy"],
        "before-hook-creation,hook-succeeded"
    );
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], CRD_HOOK);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let c = &pod["containers"][0];
    assert_eq!(c["image"], "registry.example/nmo:v9");
    assert_eq!(c["args"], serde_json::json!(["crd", "--apply"]));
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    // Before the Job (a lower weight): its ServiceAccount and rights.
    for kind in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"] {
        let o = &hook[&(kind.to_owned(), CRD_HOOK.to_owned())];
        assert_eq!(o["metadata"]["annotations"]["helm.sh/hook-weight"], "-10");
    }
    let rules = &hook[&("ClusterRole".to_owned(), CRD_HOOK.to_owned())]["rules"];
    assert_eq!(
        rules,
        &serde_json::json!([
            {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
             "verbs": ["create"]},
            {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
             "resourceNames": [nmo::crd::CRD_NAME], "verbs": ["get", "patch"]},
        ])
    );
    let binding = &hook[&("ClusterRoleBinding".to_owned(), CRD_HOOK.to_owned())];
    assert_eq!(binding["subjects"][0]["namespace"], NS);
}

/// After `helm uninstall`, a hook runs the release's image to remove the
/// leader lease and the webhook's Secret, with the rights to read the
/// operator's pods and to delete those two objects by name, in the
/// release's namespace only.
#[test]
fn the_charts_uninstall_hook_cleans_up_with_rights_to_that_alone() {
    let hook = hook_objects(CLEANUP_HOOK);
    let kinds: Vec<&str> = hook.keys().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["Job", "Role", "RoleBinding", "ServiceAccount"]);
    let job = &hook[&("Job".to_owned(), CLEANUP_HOOK.to_owned())];
    assert_eq!(
        job["metadata"]["annotations"]["helm.sh/hook"],
        "post-delete"
    );
    let c = &job["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "registry.example/nmo:v9");
    assert_eq!(c["args"], serde_json::json!(["cleanup", "--namespace", NS]));
    let role = &hook[&("Role".to_owned(), CLEANUP_HOOK.to_owned())];
    assert_eq!(role["metadata"]["namespace"], NS);
    assert_eq!(
        role["rules"],
        serde_json::json!([
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": ["135b1886.medik8s.io"], "verbs": ["get", "delete"]},
            {"apiGroups": [""], "resources": ["secrets"],
             "resourceNames": ["webhook-server-cert"], "verbs": ["delete"]},
            {"apiGroups": ["cert-manager.io"], "resources": ["certificates"],
             "resourceNames": ["node-maintenance-operator-serving-cert"], "verbs": ["get"]},
        ])
    );
    // The Secret and Certificate it names are the install's.
    let installed = kustomize_objects("default", &[]);
    let certificate = installed
        .get(&(
            "Certificate".to_owned(),
            "node-maintenance-operator-serving-cert".to_owned(),
        ))
        .expect("deploy/default's Certificate");
    assert_eq!(certificate["spec"]["secretName"], "webhook-server-cert");
}
