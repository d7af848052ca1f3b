//! The operator's end-to-end tests on the real control plane
//! (`nmo_control_plane`): etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and kwok on 127.0.0.1. The operator runs in-process under
//! the shipped ServiceAccount's token, so the shipped RBAC is enforced by
//! the real authorizer.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kube::Client;
use nmo::policy::PolicyStore;
use nmo_control_plane::{ControlPlane, Options};

use super::{ClusterOps, policy_store, start_controller_with};

/// Where deploy/default puts the operator.
pub const NAMESPACE: &str = "node-maintenance-operator-system";
/// The shipped ServiceAccount.
pub const SERVICE_ACCOUNT: &str = "node-maintenance-operator-controller-manager";

pub struct RealEnv {
    pub cp: ControlPlane,
    /// The cluster admin's client (what the test itself does).
    pub admin: Client,
    /// The operator's client: the shipped ServiceAccount's token.
    pub operator: Client,
    /// The operator's ServiceAccount token.
    pub token: String,
    pub controller: Option<tokio::task::JoinHandle<()>>,
}

impl ClusterOps for RealEnv {
    fn client(&self) -> &Client {
        &self.admin
    }

    async fn apply(&self, yaml: &str) {
        self.cp.apply(yaml).await.unwrap();
    }

    async fn create_value(&self, obj: serde_json::Value) {
        self.cp
            .kubectl(&["create", "-f", "-"], Some(&obj.to_string()))
            .await
            .unwrap();
    }

    fn kubeconfig(&self) -> String {
        self.cp.kubeconfig()
    }

    /// Needs `Options::audit`.
    fn audit_mark(&self) -> usize {
        self.cp.audit().len()
    }

    fn admin_writes_since(&self, mark: usize) -> Vec<String> {
        self.cp
            .audit()
            .into_iter()
            .skip(mark)
            .filter(|r| r.user == "admin")
            .filter(|r| !matches!(r.verb.as_str(), "get" | "list" | "watch"))
            .map(|r| format!("{} {}", r.verb, r.uri))
            .collect()
    }
}

/// The repository's `deploy/` folder.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The documents of a rendered kustomization whose top-level kind is one
/// of `kinds`, as one multi-document YAML.
pub fn only_kinds(rendered: &str, kinds: &[&str]) -> String {
    rendered
        .split("\n---\n")
        .filter(|doc| {
            doc.lines()
                .filter_map(|l| l.strip_prefix("kind: "))
                .next()
                .is_some_and(|k| kinds.contains(&k.trim()))
        })
        .collect::<Vec<_>>()
        .join("\n---\n")
}

impl RealEnv {
    /// The real control plane with `opts`' nodes, the operator's CRD,
    /// namespace and RBAC applied as `deploy/default` renders them, and the
    /// controller running with the default policy.
    pub async fn start(opts: Options) -> RealEnv {
        Self::start_store(opts, policy_store(None)).await
    }

    pub async fn start_store(opts: Options, policies: Arc<PolicyStore>) -> RealEnv {
        let mut env = Self::start_without_operator(opts).await;
        env.controller = Some(start_controller_with(&env.operator, policies));
        env
    }

    /// The cluster with the operator's objects, the operator not running.
    pub async fn start_without_operator(opts: Options) -> RealEnv {
        let cp = ControlPlane::start(opts)
            .await
            .expect("the real control plane starts");
        let admin = cp.client().await.unwrap();
        let dir = deploy_dir().join("default").display().to_string();
        let rendered = cp.kubectl(&["kustomize", &dir], None).await.unwrap();
        let objects = only_kinds(
            &rendered,
            &[
                "Namespace",
                "CustomResourceDefinition",
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding",
            ],
        );
        cp.apply(&objects).await.unwrap();
        let token = cp
            .service_account_token(NAMESPACE, SERVICE_ACCOUNT)
            .await
            .unwrap();
        let operator = nmo::client::client_from_kubeconfig(&cp.kubeconfig_with_token(&token))
            .await
            .unwrap();
        RealEnv {
            cp,
            admin,
            operator,
            token,
            controller: None,
        }
    }

    /// A kubeconfig file for the operator's ServiceAccount.
    pub fn operator_kubeconfig(&self) -> PathBuf {
        self.cp
            .write_kubeconfig("operator.kubeconfig", &self.token)
            .unwrap()
    }

    pub fn stop(mut self) {
        if let Some(c) = self.controller.take() {
            c.abort();
        }
        self.cp.stop();
    }
}
