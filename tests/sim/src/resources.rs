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

fn rt(b: &Builtin) -> ResourceType {
    let Builtin {
        group,
        version,
        kind,
        plural,
        namespaced,
        short,
        status,
        storage,
    } = *b;
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

/// A built-in resource type, as data.
struct Builtin {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
    /// It has a `status` subresource.
    status: bool,
    /// Where it is stored, when not under its own name (events).
    storage: Option<&'static str>,
}

const BUILTIN: &[Builtin] = &[
    Builtin {
        group: "",
        version: "v1",
        kind: "Namespace",
        plural: "namespaces",
        namespaced: false,
        short: &["ns"],
        status: true,
        storage: None,
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Node",
        plural: "nodes",
        namespaced: false,
        short: &["no"],
        status: true,
        storage: None,
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Pod",
        plural: "pods",
        namespaced: true,
        short: &["po"],
        status: true,
        storage: None,
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Event",
        plural: "events",
        namespaced: true,
        short: &["ev"],
        status: false,
        storage: None,
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "ServiceAccount",
        plural: "serviceaccounts",
        namespaced: true,
        short: &["sa"],
        status: false,
        storage: None,
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "ConfigMap",
        plural: "configmaps",
        namespaced: true,
        short: &["cm"],
        status: false,
        storage: None,
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Secret",
        plural: "secrets",
        namespaced: true,
        short: &[],
        status: false,
        storage: None,
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Service",
        plural: "services",
        namespaced: true,
        short: &["svc"],
        status: true,
        storage: None,
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Endpoints",
        plural: "endpoints",
        namespaced: true,
        short: &["ep"],
        status: false,
        storage: None,
    },
    Builtin {
        group: "events.k8s.io",
        version: "v1",
        kind: "Event",
        plural: "events",
        namespaced: true,
        short: &["ev"],
        status: false,
        storage: Some("events"),
    },
    Builtin {
        group: "coordination.k8s.io",
        version: "v1",
        kind: "Lease",
        plural: "leases",
        namespaced: true,
        short: &[],
        status: false,
        storage: None,
    },
    Builtin {
        group: "policy",
        version: "v1",
        kind: "PodDisruptionBudget",
        plural: "poddisruptionbudgets",
        namespaced: true,
        short: &["pdb"],
        status: true,
        storage: None,
    },
    Builtin {
        group: "apps",
        version: "v1",
        kind: "Deployment",
        plural: "deployments",
        namespaced: true,
        short: &["deploy"],
        status: true,
        storage: None,
    },
    Builtin {
        group: "apps",
        version: "v1",
        kind: "ReplicaSet",
        plural: "replicasets",
        namespaced: true,
        short: &["rs"],
        status: true,
        storage: None,
    },
    Builtin {
        group: "apps",
        version: "v1",
        kind: "StatefulSet",
        plural: "statefulsets",
        namespaced: true,
        short: &["sts"],
        status: true,
        storage: None,
    },
    Builtin {
        group: "apps",
        version: "v1",
        kind: "DaemonSet",
        plural: "daemonsets",
        namespaced: true,
        short: &["ds"],
        status: true,
        storage: None,
    },
    Builtin {
        group: "batch",
        version: "v1",
        kind: "Job",
        plural: "jobs",
        namespaced: true,
        short: &[],
        status: true,
        storage: None,
    },
    Builtin {
        group: "storage.k8s.io",
        version: "v1",
        kind: "VolumeAttachment",
        plural: "volumeattachments",
        namespaced: false,
        short: &[],
        status: true,
        storage: None,
    },
    Builtin {
        group: "authentication.k8s.io",
        version: "v1",
        kind: "TokenReview",
        plural: "tokenreviews",
        namespaced: false,
        short: &[],
        status: false,
        storage: None,
    },
    Builtin {
        group: "authorization.k8s.io",
        version: "v1",
        kind: "SubjectAccessReview",
        plural: "subjectaccessreviews",
        namespaced: false,
        short: &[],
        status: false,
        storage: None,
    },
    Builtin {
        group: "authentication.k8s.io",
        version: "v1",
        kind: "SelfSubjectReview",
        plural: "selfsubjectreviews",
        namespaced: false,
        short: &[],
        status: false,
        storage: None,
    },
    Builtin {
        group: "authorization.k8s.io",
        version: "v1",
        kind: "SelfSubjectAccessReview",
        plural: "selfsubjectaccessreviews",
        namespaced: false,
        short: &[],
        status: false,
        storage: None,
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "Role",
        plural: "roles",
        namespaced: true,
        short: &[],
        status: false,
        storage: None,
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "RoleBinding",
        plural: "rolebindings",
        namespaced: true,
        short: &[],
        status: false,
        storage: None,
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "ClusterRole",
        plural: "clusterroles",
        namespaced: false,
        short: &[],
        status: false,
        storage: None,
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "ClusterRoleBinding",
        plural: "clusterrolebindings",
        namespaced: false,
        short: &[],
        status: false,
        storage: None,
    },
    Builtin {
        group: "apiextensions.k8s.io",
        version: "v1",
        kind: "CustomResourceDefinition",
        plural: "customresourcedefinitions",
        namespaced: false,
        short: &["crd", "crds"],
        status: true,
        storage: None,
    },
    Builtin {
        group: "admissionregistration.k8s.io",
        version: "v1",
        kind: "ValidatingWebhookConfiguration",
        plural: "validatingwebhookconfigurations",
        namespaced: false,
        short: &[],
        status: false,
        storage: None,
    },
    // Stored, not enforced: the real API server is where the
    // operator's write limits are tested (docs/simulator.md).
    Builtin {
        group: "admissionregistration.k8s.io",
        version: "v1",
        kind: "ValidatingAdmissionPolicy",
        plural: "validatingadmissionpolicies",
        namespaced: false,
        short: &[],
        status: false,
        storage: None,
    },
    Builtin {
        group: "admissionregistration.k8s.io",
        version: "v1",
        kind: "ValidatingAdmissionPolicyBinding",
        plural: "validatingadmissionpolicybindings",
        namespaced: false,
        short: &[],
        status: false,
        storage: None,
    },
];

/// The built-in resource types.
pub fn builtin() -> Vec<ResourceType> {
    BUILTIN
        .iter()
        .map(|b| {
            let mut r = rt(b);
            if matches!(
                b.plural,
                "pods" | "deployments" | "replicasets" | "statefulsets" | "daemonsets" | "jobs"
            ) {
                r.categories = vec!["all".into()];
            }
            r
        })
        .collect()
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
