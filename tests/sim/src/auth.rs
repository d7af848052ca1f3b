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
//! the request's verb and its resource (group, resource, namespace) or
//! non-resource URL (exact, or a prefix ending in `*`).

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

/// Who `token` is, if anyone.
pub fn authenticate(store: &Store, token: &str) -> Option<User> {
    if token == ADMIN_TOKEN {
        return Some(User {
            name: "nmo-sim".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
        });
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
    pub resource: String,
    pub namespace: String,
    /// A non-resource URL (`/metrics`), when the request is for one.
    pub path: Option<String>,
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
            matches_any(&strings(&rule["apiGroups"]), &access.group)
                && matches_any(&strings(&rule["resources"]), &access.resource)
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
pub fn subject_access_review(store: &Store, mut review: Value) -> Value {
    let spec = &review["spec"];
    let user = User {
        name: spec["user"].as_str().unwrap_or_default().to_owned(),
        groups: strings(&spec["groups"])
            .into_iter()
            .map(str::to_owned)
            .collect(),
    };
    let access = if spec["nonResourceAttributes"].is_object() {
        let a = &spec["nonResourceAttributes"];
        Access {
            verb: a["verb"].as_str().unwrap_or_default().to_owned(),
            path: Some(a["path"].as_str().unwrap_or_default().to_owned()),
            ..Default::default()
        }
    } else {
        let a = &spec["resourceAttributes"];
        Access {
            verb: a["verb"].as_str().unwrap_or_default().to_owned(),
            group: a["group"].as_str().unwrap_or_default().to_owned(),
            resource: a["resource"].as_str().unwrap_or_default().to_owned(),
            namespace: a["namespace"].as_str().unwrap_or_default().to_owned(),
            path: None,
        }
    };
    let allowed = authorize(store, &user, &access);
    review["status"] = if allowed {
        json!({"allowed": true, "reason": "RBAC: allowed"})
    } else {
        json!({"allowed": false, "reason": format!("RBAC: {} may not {} this", user.name, access.verb)})
    };
    review
}
