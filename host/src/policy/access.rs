//! Who may take which node down, and who may choose a maintenance's
//! policy: the `access` section of `policies.yaml`, enforced by the
//! validating webhook (the one place that knows who asks).
//!
//! ```yaml
//! access:
//!   nodes:                       # every rule a node matches must be met
//!   - nodeSelector: node-role.kubernetes.io/control-plane
//!     groups: [system:masters, platform-admins]
//!     users: [alice]
//!   policyAnnotation:            # who may set nodemaintenance.medik8s.io/policy
//!     groups: [platform-admins]
//!     policies: [never-force]    # and to which policies; empty: any loaded
//! ```
//!
//! Without an `access` section the defaults hold: control-plane nodes
//! (`node-role.kubernetes.io/control-plane` or `.../master`) and the policy
//! annotation need the `system:masters` group. This is the one place the
//! operator is stricter than the Go operator, which lets anyone who may
//! create a NodeMaintenance drain any node with it.

use std::collections::BTreeMap;

use kube::core::{Selector, SelectorExt};
use serde::Deserialize;

use super::selector;

/// The annotation with which a NodeMaintenance picks its policy (who may
/// set it is this file's concern).
pub const POLICY_ANNOTATION: &str = "nodemaintenance.medik8s.io/policy";

/// The group every default grant names: cluster administrators by
/// certificate.
pub(crate) const ADMIN_GROUP: &str = "system:masters";

/// Who asks (the AdmissionReview's `userInfo`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Requester {
    pub username: String,
    pub groups: Vec<String>,
}

/// A list of who may.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub users: Vec<String>,
}

impl Grant {
    fn admins() -> Self {
        Grant {
            groups: vec![ADMIN_GROUP.to_owned()],
            users: Vec::new(),
        }
    }

    fn allows(&self, who: &Requester) -> bool {
        self.users.contains(&who.username) || self.groups.iter().any(|g| who.groups.contains(g))
    }

    fn shown(&self) -> String {
        let mut parts = Vec::new();
        if !self.groups.is_empty() {
            parts.push(format!("groups {}", self.groups.join(", ")));
        }
        if !self.users.is_empty() {
            parts.push(format!("users {}", self.users.join(", ")));
        }
        if parts.is_empty() {
            "no one".into()
        } else {
            parts.join(" or ")
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct AccessFile {
    nodes: Option<Vec<NodeRuleFile>>,
    policy_annotation: Option<AnnotationFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NodeRuleFile {
    node_selector: serde_json::Value,
    #[serde(flatten)]
    grant: Grant,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AnnotationFile {
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    policies: Vec<String>,
}

#[derive(Debug, Clone)]
struct NodeRule {
    selector: Selector,
    shown: String,
    grant: Grant,
}

/// The access rules in force.
#[derive(Debug, Clone)]
pub struct Access {
    nodes: Vec<NodeRule>,
    annotation: Grant,
    /// Policies the annotation may name; empty: any loaded one.
    annotation_policies: Vec<String>,
}

impl Default for Access {
    fn default() -> Self {
        let rule = |label: &str| NodeRule {
            selector: selector::parse(label).unwrap_or_default(),
            shown: label.to_owned(),
            grant: Grant::admins(),
        };
        Access {
            nodes: vec![
                rule("node-role.kubernetes.io/control-plane"),
                rule("node-role.kubernetes.io/master"),
            ],
            annotation: Grant::admins(),
            annotation_policies: Vec::new(),
        }
    }
}

impl Access {
    /// The rules of a `policies.yaml` `access` section (defaults for what
    /// it leaves out).
    pub(super) fn from_file(file: Option<AccessFile>) -> Result<Self, String> {
        let mut access = Access::default();
        let Some(file) = file else {
            return Ok(access);
        };
        if let Some(nodes) = file.nodes {
            access.nodes = Vec::new();
            for (i, r) in nodes.into_iter().enumerate() {
                let (selector, shown) = selector::from_value(&r.node_selector)
                    .map_err(|e| format!("access.nodes rule {}: {e}", i + 1))?;
                access.nodes.push(NodeRule {
                    selector,
                    shown,
                    grant: r.grant,
                });
            }
        }
        if let Some(a) = file.policy_annotation {
            access.annotation = Grant {
                groups: a.groups,
                users: a.users,
            };
            access.annotation_policies = a.policies;
        }
        Ok(access)
    }

    /// Why `who` may not put the node (with `labels`) into maintenance, if
    /// not: every rule the node matches must allow them.
    pub(crate) fn node_refused(
        &self,
        who: &Requester,
        node: &str,
        labels: &BTreeMap<String, String>,
    ) -> Option<String> {
        self.nodes
            .iter()
            .find(|r| r.selector.matches(labels) && !r.grant.allows(who))
            .map(|r| {
                format!(
                    "{} may not put node {node:?} into maintenance: nodes matching {} need {} \
                     (policies.yaml access.nodes)",
                    shown_user(who),
                    r.shown,
                    r.grant.shown()
                )
            })
    }

    /// Why `who` may not choose `policy` with the annotation, if not.
    pub(crate) fn annotation_refused(&self, who: &Requester, policy: &str) -> Option<String> {
        if !self.annotation.allows(who) {
            return Some(format!(
                "{} may not choose a policy with the {} annotation: it needs {} \
                 (policies.yaml access.policyAnnotation)",
                shown_user(who),
                POLICY_ANNOTATION,
                self.annotation.shown()
            ));
        }
        self.annotation_not_allowed(policy)
    }

    /// Why the annotation may not name `policy`, if not (whoever set it).
    pub(crate) fn annotation_not_allowed(&self, policy: &str) -> Option<String> {
        (!self.annotation_policies.is_empty()
            && !self.annotation_policies.iter().any(|p| p == policy))
        .then(|| {
            format!(
                "the {} annotation may name only {} (policies.yaml access.policyAnnotation.policies), not {policy:?}",
                POLICY_ANNOTATION,
                self.annotation_policies.join(", ")
            )
        })
    }
}

fn shown_user(who: &Requester) -> String {
    if who.username.is_empty() {
        "an unknown user".into()
    } else {
        format!("user {:?}", who.username)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(user: &str, groups: &[&str]) -> Requester {
        Requester {
            username: user.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn by_default_control_plane_nodes_and_the_annotation_need_system_masters() {
        let access = Access::default();
        let cp = labels(&[("node-role.kubernetes.io/control-plane", "")]);
        let worker = labels(&[("node-role.kubernetes.io/worker", "")]);
        let dev = who("dev", &["system:authenticated"]);
        let admin = who("root", &["system:masters"]);
        assert!(access.node_refused(&dev, "cp-1", &cp).is_some());
        assert!(access.node_refused(&admin, "cp-1", &cp).is_none());
        assert!(access.node_refused(&dev, "w-1", &worker).is_none());
        assert!(access.annotation_refused(&dev, "never-force").is_some());
        assert!(access.annotation_refused(&admin, "never-force").is_none());
    }

    #[test]
    fn a_file_grants_groups_users_and_policies() {
        let file: AccessFile = serde_json::from_value(serde_json::json!({
            "nodes": [{"nodeSelector": "zone=a", "groups": ["ops"]}, {"nodeSelector": "gpu", "users": ["alice"]}],
            "policyAnnotation": {"groups": ["ops"], "policies": ["never-force"]}
        }))
        .unwrap();
        let access = Access::from_file(Some(file)).unwrap();
        let ops = who("bob", &["ops"]);
        let alice = who("alice", &[]);
        let both = labels(&[("zone", "a"), ("gpu", "true")]);
        assert!(
            access
                .node_refused(&ops, "n", &labels(&[("zone", "a")]))
                .is_none()
        );
        // Every matching rule must allow.
        assert!(access.node_refused(&ops, "n", &both).is_some());
        assert!(access.node_refused(&alice, "n", &both).is_some());
        // Control-plane defaults are replaced by the file's rules.
        let cp = labels(&[("node-role.kubernetes.io/control-plane", "")]);
        assert!(access.node_refused(&alice, "cp", &cp).is_none());
        assert!(access.annotation_refused(&ops, "never-force").is_none());
        let e = access.annotation_refused(&ops, "give-up").unwrap();
        assert!(e.contains("may name only never-force"), "{e}");
        assert!(access.annotation_refused(&alice, "never-force").is_some());
    }
}
