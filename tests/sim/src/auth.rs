//! Authentication and authorization reviews, as the API server answers
//! `TokenReview` (authentication.k8s.io/v1) and `SubjectAccessReview`
//! (authorization.k8s.io/v1), so a client that delegates its own
//! authentication and authorization to the cluster (controller-runtime's
//! secure metrics) can be tested against the simulated cluster.
//!
//! Who a bearer token is:
//! - the kubeconfig's token (`nmo-sim`) is the cluster administrator
//!   (group `system:masters`);
//! - `serviceaccount:<namespace>:<name>` is that ServiceAccount
//!   (`system:serviceaccount:<namespace>:<name>`), if it exists;
//! - anything else is not authenticated.
//!
//! What a user may do is RBAC over the stored ClusterRoles, Roles and their
//! bindings: `system:masters` may do anything; otherwise a rule of a role
//! bound to the user, one of its groups or its ServiceAccount must match
//! the request's verb and its resource (group, resource with subresource:
//! `pods/eviction`, `pods/*`, `*/scale`; resourceNames; namespace) or
//! non-resource URL (exact, or a prefix ending in `*`).
//!
//! With authorization on (`SimCluster::set_authorization`), every resource
//! request must carry a known bearer token (401 otherwise) and be allowed
//! (403 in the real server's words otherwise); `Impersonate-User` /
//! `Impersonate-Group` work for administrators (`kubectl --as`).
//! Discovery, OpenAPI, `/version` and health stay open, as the default
//! `system:discovery` / `system:public-info-viewer` roles keep them.

use serde_json::{Value, json};

use crate::store::Store;

/// The kubeconfig's bearer token.
pub const ADMIN_TOKEN: &str = "nmo-sim";

/// A user as authentication names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

/// The cluster administrator (the kubeconfig's user).
pub fn admin() -> User {
    User {
        name: "nmo-sim".into(),
        groups: vec!["system:masters".into(), "system:authenticated".into()],
    }
}

/// Who `token` is, if anyone.
pub fn authenticate(store: &Store, token: &str) -> Option<User> {
    if token == ADMIN_TOKEN {
        return Some(admin());
    }
    let rest = token.strip_prefix("serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    store.get("serviceaccounts", &crate::store::ObjKey::new(ns, name))?;
    Some(User {
        name: format!("system:serviceaccount:{ns}:{name}"),
        groups: vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{ns}"),
            "system:authenticated".into(),
        ],
    })
}

/// What is asked: a verb on a resource or on a non-resource URL.
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub verb: String,
    pub group: String,
    /// The resource, with its subresource after a slash (`pods/eviction`).
    pub resource: String,
    pub namespace: String,
    /// The object's name, when the request names one.
    pub name: String,
    /// A non-resource URL (`/metrics`), when the request is for one.
    pub path: Option<String>,
}

impl Access {
    /// The real server's words for a denial, e.g. `pods "web" is
    /// forbidden: User "system:serviceaccount:a:b" cannot delete resource
    /// "pods" in API group "" in the namespace "default"`.
    pub fn denial(&self, user: &User) -> String {
        let (base, _) = self
            .resource
            .split_once('/')
            .unwrap_or((self.resource.as_str(), ""));
        let qualified = if self.group.is_empty() {
            base.to_owned()
        } else {
            format!("{base}.{}", self.group)
        };
        let what = if self.name.is_empty() {
            format!("{qualified} is forbidden")
        } else {
            format!("{qualified} \"{}\" is forbidden", self.name)
        };
        let scope = if self.namespace.is_empty() {
            "at the cluster scope".to_owned()
        } else {
            format!("in the namespace \"{}\"", self.namespace)
        };
        format!(
            "{what}: User \"{}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
            user.name, self.verb, self.resource, self.group
        )
    }
}

/// The user a request's `Authorization: Bearer` token names.
pub fn bearer_user(store: &Store, header: Option<&str>) -> Option<User> {
    let token = header?.strip_prefix("Bearer ")?.trim();
    authenticate(store, token)
}

/// The user a request acts as: its token's, or the one it impersonates
/// (`kubectl --as NAME --as-group G`) when its token's user is a cluster
/// administrator. None: unknown token, or impersonation by someone else.
pub fn request_user(
    store: &Store,
    authorization: Option<&str>,
    impersonate: Option<&str>,
    impersonate_groups: Vec<String>,
) -> Option<User> {
    let user = bearer_user(store, authorization)?;
    let Some(name) = impersonate else {
        return Some(user);
    };
    if !user.groups.iter().any(|g| g == "system:masters") {
        return None;
    }
    let mut groups = impersonate_groups;
    if let Some(rest) = name.strip_prefix("system:serviceaccount:")
        && let Some((ns, _)) = rest.split_once(':')
    {
        groups.push("system:serviceaccounts".into());
        groups.push(format!("system:serviceaccounts:{ns}"));
    }
    groups.push("system:authenticated".into());
    Some(User {
        name: name.to_owned(),
        groups,
    })
}

/// Whether a rule's `resources` entry covers `resource` (which may carry a
/// subresource): `*`, the exact name, `pods/*` (every subresource of pods)
/// or `*/scale` (that subresource of everything).
fn resource_matches(pattern: &str, resource: &str) -> bool {
    if pattern == "*" || pattern == resource {
        return true;
    }
    let (base, sub) = resource.split_once('/').unwrap_or((resource, ""));
    match pattern.split_once('/') {
        Some((b, "*")) => b == base && !sub.is_empty(),
        Some(("*", s)) => s == sub,
        _ => false,
    }
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn matches_any(list: &[&str], want: &str) -> bool {
    list.iter().any(|x| *x == "*" || *x == want)
}

fn rule_allows(rule: &Value, access: &Access) -> bool {
    if !matches_any(&strings(&rule["verbs"]), &access.verb) {
        return false;
    }
    match &access.path {
        Some(path) => strings(&rule["nonResourceURLs"]).iter().any(|u| {
            *u == path
                || u.strip_suffix('*')
                    .is_some_and(|prefix| path.starts_with(prefix))
        }),
        None => {
            let names = strings(&rule["resourceNames"]);
            matches_any(&strings(&rule["apiGroups"]), &access.group)
                && strings(&rule["resources"])
                    .iter()
                    .any(|r| resource_matches(r, &access.resource))
                && (names.is_empty() || names.contains(&access.name.as_str()))
        }
    }
}

fn subject_is(subject: &Value, user: &User) -> bool {
    let name = subject["name"].as_str().unwrap_or_default();
    match subject["kind"].as_str() {
        Some("User") => name == user.name,
        Some("Group") => user.groups.iter().any(|g| g == name),
        Some("ServiceAccount") => {
            let ns = subject["namespace"].as_str().unwrap_or_default();
            user.name == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

/// Whether `user` may do `access`.
pub fn authorize(store: &Store, user: &User, access: &Access) -> bool {
    if user.groups.iter().any(|g| g == "system:masters") {
        return true;
    }
    let role_rules = |kind: &str, name: &str, ns: Option<&str>| -> Vec<Value> {
        let found = match (kind, ns) {
            ("ClusterRole", _) => store.get(
                "clusterroles.rbac.authorization.k8s.io",
                &crate::store::ObjKey::new("", name),
            ),
            ("Role", Some(ns)) => store.get(
                "roles.rbac.authorization.k8s.io",
                &crate::store::ObjKey::new(ns, name),
            ),
            _ => None,
        };
        found
            .and_then(|r| r["rules"].as_array().cloned())
            .unwrap_or_default()
    };
    let bound = |b: &Value| {
        b["subjects"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| subject_is(s, user)))
    };
    for b in store.list("clusterrolebindings.rbac.authorization.k8s.io", None) {
        if bound(&b) {
            let rules = role_rules(
                "ClusterRole",
                b["roleRef"]["name"].as_str().unwrap_or_default(),
                None,
            );
            if rules.iter().any(|r| rule_allows(r, access)) {
                return true;
            }
        }
    }
    if access.path.is_none() && !access.namespace.is_empty() {
        for b in store.list(
            "rolebindings.rbac.authorization.k8s.io",
            Some(&access.namespace),
        ) {
            if bound(&b) {
                let kind = b["roleRef"]["kind"].as_str().unwrap_or_default();
                let rules = role_rules(
                    kind,
                    b["roleRef"]["name"].as_str().unwrap_or_default(),
                    Some(&access.namespace),
                );
                if rules.iter().any(|r| rule_allows(r, access)) {
                    return true;
                }
            }
        }
    }
    false
}

/// Answers a TokenReview: the object with its `status`.
pub fn token_review(store: &Store, mut review: Value) -> Value {
    let token = review["spec"]["token"].as_str().unwrap_or_default();
    review["status"] = match authenticate(store, token) {
        Some(user) => {
            json!({"authenticated": true, "user": {"username": user.name, "groups": user.groups}})
        }
        None => json!({"authenticated": false, "error": "invalid bearer token"}),
    };
    review
}

/// Answers a SubjectAccessReview: the object with its `status`.
pub fn subject_access_review(store: &Store, review: Value) -> Value {
    let spec = &review["spec"];
    let user = User {
        name: spec["user"].as_str().unwrap_or_default().to_owned(),
        groups: strings(&spec["groups"])
            .into_iter()
            .map(str::to_owned)
            .collect(),
    };
    access_review(store, &user, review)
}

/// Answers a SelfSubjectAccessReview (`kubectl auth can-i`) for `user`.
pub fn self_subject_access_review(store: &Store, user: &User, review: Value) -> Value {
    access_review(store, user, review)
}

fn access_review(store: &Store, user: &User, mut review: Value) -> Value {
    let spec = &review["spec"];
    let access = if spec["nonResourceAttributes"].is_object() {
        let a = &spec["nonResourceAttributes"];
        Access {
            verb: a["verb"].as_str().unwrap_or_default().to_owned(),
            path: Some(a["path"].as_str().unwrap_or_default().to_owned()),
            ..Default::default()
        }
    } else {
        let a = &spec["resourceAttributes"];
        let resource = a["resource"].as_str().unwrap_or_default();
        let resource = match a["subresource"].as_str().filter(|s| !s.is_empty()) {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource.to_owned(),
        };
        Access {
            verb: a["verb"].as_str().unwrap_or_default().to_owned(),
            group: a["group"].as_str().unwrap_or_default().to_owned(),
            resource,
            namespace: a["namespace"].as_str().unwrap_or_default().to_owned(),
            name: a["name"].as_str().unwrap_or_default().to_owned(),
            path: None,
        }
    };
    let allowed = authorize(store, user, &access);
    review["status"] = if allowed {
        json!({"allowed": true, "reason": "RBAC: allowed"})
    } else {
        // The real RBAC authorizer gives no reason for a denial.
        json!({"allowed": false})
    };
    review
}
