//! The resource types the simulated API server serves: the built-in ones and
//! those added by CustomResourceDefinitions.

use serde_json::{Value, json};

/// A printer column (`kubectl get` table column).
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub type_: String,
    pub description: String,
    /// JSONPath-like `.a.b.c` into the object, for CRD columns; built-in
    /// columns are computed in `tables.rs` and leave this empty.
    pub json_path: String,
    pub priority: i64,
    pub format: String,
}

/// One resource type (e.g. pods in core/v1).
#[derive(Debug, Clone)]
pub struct ResourceType {
    /// API group; empty for the core group.
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Has a `/status` subresource: the main resource ignores status
    /// changes, `/status` ignores everything else.
    pub status_subresource: bool,
    /// Where objects are kept: resources served in two groups (events)
    /// share one store.
    pub storage: String,
    /// CRD printer columns (after NAME, before AGE).
    pub columns: Vec<Column>,
    /// The CRD's openAPIV3Schema, for required-field validation.
    pub schema: Option<Value>,
}

impl ResourceType {
    /// `apiVersion` of objects of this type.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group` (as in error messages and CRD names).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The verbs advertised in discovery.
    pub fn verbs(&self) -> Vec<&'static str> {
        vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    }
}

#[allow(clippy::too_many_arguments)]
fn rt(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    namespaced: bool,
    short: &[&str],
    status: bool,
    storage: Option<&str>,
) -> ResourceType {
    ResourceType {
        group: group.into(),
        version: version.into(),
        kind: kind.into(),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        namespaced,
        short_names: short.iter().map(|s| s.to_string()).collect(),
        categories: Vec::new(),
        status_subresource: status,
        storage: storage.map(str::to_owned).unwrap_or_else(|| {
            if group.is_empty() {
                plural.to_owned()
            } else {
                format!("{plural}.{group}")
            }
        }),
        columns: Vec::new(),
        schema: None,
    }
}

/// The built-in resource types.
pub fn builtin() -> Vec<ResourceType> {
    let mut all = vec![
        rt(
            "",
            "v1",
            "Namespace",
            "namespaces",
            false,
            &["ns"],
            true,
            None,
        ),
        rt("", "v1", "Node", "nodes", false, &["no"], true, None),
        rt("", "v1", "Pod", "pods", true, &["po"], true, None),
        rt("", "v1", "Event", "events", true, &["ev"], false, None),
        rt(
            "",
            "v1",
            "ServiceAccount",
            "serviceaccounts",
            true,
            &["sa"],
            false,
            None,
        ),
        rt(
            "",
            "v1",
            "ConfigMap",
            "configmaps",
            true,
            &["cm"],
            false,
            None,
        ),
        rt("", "v1", "Secret", "secrets", true, &[], false, None),
        rt("", "v1", "Service", "services", true, &["svc"], true, None),
        rt(
            "",
            "v1",
            "Endpoints",
            "endpoints",
            true,
            &["ep"],
            false,
            None,
        ),
        rt(
            "events.k8s.io",
            "v1",
            "Event",
            "events",
            true,
            &["ev"],
            false,
            Some("events"),
        ),
        rt(
            "coordination.k8s.io",
            "v1",
            "Lease",
            "leases",
            true,
            &[],
            false,
            None,
        ),
        rt(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            true,
            &["pdb"],
            true,
            None,
        ),
        rt(
            "apps",
            "v1",
            "Deployment",
            "deployments",
            true,
            &["deploy"],
            true,
            None,
        ),
        rt(
            "apps",
            "v1",
            "ReplicaSet",
            "replicasets",
            true,
            &["rs"],
            true,
            None,
        ),
        rt(
            "apps",
            "v1",
            "StatefulSet",
            "statefulsets",
            true,
            &["sts"],
            true,
            None,
        ),
        rt(
            "apps",
            "v1",
            "DaemonSet",
            "daemonsets",
            true,
            &["ds"],
            true,
            None,
        ),
        rt("batch", "v1", "Job", "jobs", true, &[], true, None),
        rt(
            "storage.k8s.io",
            "v1",
            "VolumeAttachment",
            "volumeattachments",
            false,
            &[],
            true,
            None,
        ),
        rt(
            "authentication.k8s.io",
            "v1",
            "TokenReview",
            "tokenreviews",
            false,
            &[],
            false,
            None,
        ),
        rt(
            "authorization.k8s.io",
            "v1",
            "SubjectAccessReview",
            "subjectaccessreviews",
            false,
            &[],
            false,
            None,
        ),
        rt(
            "authentication.k8s.io",
            "v1",
            "SelfSubjectReview",
            "selfsubjectreviews",
            false,
            &[],
            false,
            None,
        ),
        rt(
            "authorization.k8s.io",
            "v1",
            "SelfSubjectAccessReview",
            "selfsubjectaccessreviews",
            false,
            &[],
            false,
            None,
        ),
        rt(
            "rbac.authorization.k8s.io",
            "v1",
            "Role",
            "roles",
            true,
            &[],
            false,
            None,
        ),
        rt(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
            true,
            &[],
            false,
            None,
        ),
        rt(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
            false,
            &[],
            false,
            None,
        ),
        rt(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
            false,
            &[],
            false,
            None,
        ),
        rt(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
            &["crd", "crds"],
            true,
            None,
        ),
        rt(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            false,
            &[],
            false,
            None,
        ),
        // Stored, not enforced: the real API server is where the
        // operator's write limits are tested (docs/simulator.md).
        rt(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicy",
            "validatingadmissionpolicies",
            false,
            &[],
            false,
            None,
        ),
        rt(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
            false,
            &[],
            false,
            None,
        ),
    ];
    for r in &mut all {
        if matches!(
            r.plural.as_str(),
            "pods" | "deployments" | "replicasets" | "statefulsets" | "daemonsets" | "jobs"
        ) {
            r.categories = vec!["all".into()];
        }
    }
    all
}

/// The resource types a CRD object defines (one per served version).
pub fn from_crd(crd: &Value) -> Vec<ResourceType> {
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default();
    let names = &spec["names"];
    let plural = names["plural"].as_str().unwrap_or_default();
    let kind = names["kind"].as_str().unwrap_or_default();
    let singular = names["singular"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| kind.to_lowercase());
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let namespaced = spec["scope"].as_str() != Some("Cluster");
    let mut out = Vec::new();
    for v in spec["versions"].as_array().into_iter().flatten() {
        if v["served"].as_bool() == Some(false) {
            continue;
        }
        let columns = v["additionalPrinterColumns"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| Column {
                name: c["name"].as_str().unwrap_or_default().into(),
                type_: c["type"].as_str().unwrap_or("string").into(),
                description: c["description"].as_str().unwrap_or_default().into(),
                json_path: c["jsonPath"].as_str().unwrap_or_default().into(),
                priority: c["priority"].as_i64().unwrap_or(0),
                format: c["format"].as_str().unwrap_or_default().into(),
            })
            .collect();
        out.push(ResourceType {
            group: group.into(),
            version: v["name"].as_str().unwrap_or_default().into(),
            kind: kind.into(),
            plural: plural.into(),
            singular: singular.clone(),
            namespaced,
            short_names: strings(&names["shortNames"]),
            categories: strings(&names["categories"]),
            status_subresource: v["subresources"]["status"].is_object(),
            storage: format!("{plural}.{group}"),
            columns,
            schema: Some(v["schema"]["openAPIV3Schema"].clone()),
        });
    }
    out
}

/// The `APIResource` entry of discovery for a resource type.
pub fn api_resource(r: &ResourceType) -> Value {
    let mut v = json!({
        "name": r.plural,
        "singularName": r.singular,
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": r.verbs(),
    });
    if !r.short_names.is_empty() {
        v["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        v["categories"] = json!(r.categories);
    }
    v
}

/// Discovery entries for subresources.
pub fn api_subresources(r: &ResourceType) -> Vec<Value> {
    let mut out = Vec::new();
    if r.status_subresource {
        out.push(json!({
            "name": format!("{}/status", r.plural),
            "singularName": "",
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": ["get", "patch", "update"],
        }));
    }
    if r.group == "apps"
        && matches!(
            r.plural.as_str(),
            "deployments" | "replicasets" | "statefulsets"
        )
    {
        out.push(json!({
            "name": format!("{}/scale", r.plural),
            "singularName": "",
            "namespaced": true,
            "group": "autoscaling",
            "version": "v1",
            "kind": "Scale",
            "verbs": ["get", "patch", "update"],
        }));
    }
    if r.group.is_empty() && r.plural == "pods" {
        out.push(json!({
            "name": "pods/eviction",
            "singularName": "",
            "namespaced": true,
            "group": "policy",
            "version": "v1",
            "kind": "Eviction",
            "verbs": ["create"],
        }));
    }
    out
}
