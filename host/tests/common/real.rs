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

    fn operator_evictions_since(&self, mark: usize) -> Vec<u16> {
        self.cp
            .audit()
            .into_iter()
            .skip(mark)
            .filter(|r| r.user_agent == nmo::client::USER_AGENT && r.verb == "create")
            .filter(|r| {
                r.uri
                    .split('?')
                    .next()
                    .is_some_and(|p| p.ends_with("/eviction"))
            })
            .map(|r| r.code)
            .collect()
    }
}

/// The repository's `deploy/` folder.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// `deploy/<overlay>` as `kubectl kustomize` renders it, one value a
/// document.
pub fn rendered(overlay: &str) -> Vec<serde_json::Value> {
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(deploy_dir().join(overlay))
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "kustomize {overlay}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    nmo::yaml::documents::<serde_json::Value>(std::str::from_utf8(&out.stdout).unwrap())
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
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

/// Applies the operator's CRD (server-side, taking its fields over from
/// another manager, as the migration guide says), namespace, ServiceAccount
/// and RBAC as `deploy/default` renders them; returns a client with the
/// ServiceAccount's token, and the token.
pub async fn install_operator_objects(cp: &ControlPlane) -> (Client, String) {
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
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ],
    );
    cp.apply_forcing(&objects).await.unwrap();
    let token = cp
        .service_account_token(NAMESPACE, SERVICE_ACCOUNT)
        .await
        .unwrap();
    let operator = nmo::client::client_from_kubeconfig(&cp.kubeconfig_with_token(&token))
        .await
        .unwrap();
    (operator, token)
}

impl RealEnv {
    /// The real control plane with `opts`' nodes and nothing of the
    /// operator's (a cluster that runs another operator, say).
    pub async fn start_bare(opts: Options) -> RealEnv {
        let cp = ControlPlane::start(opts)
            .await
            .expect("the real control plane starts");
        let admin = cp.client().await.unwrap();
        RealEnv {
            operator: admin.clone(),
            cp,
            admin,
            token: String::new(),
            controller: None,
        }
    }

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
        let (operator, token) = install_operator_objects(&cp).await;
        let admin = cp.client().await.unwrap();
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

/// The `nmo` binary as its Deployment runs it, under the shipped
/// ServiceAccount, its servers off (no pod network here), `args` added;
/// its log (info) in `log`.
pub fn operator_process(
    env: &RealEnv,
    instance: &str,
    log: &Path,
    args: &[String],
) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args([
            "--metrics-bind-address=0",
            "--health-probe-bind-address=0",
            "--webhook-bind-address=0",
            "--zap-log-level=info",
        ])
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KUBECONFIG", env.operator_kubeconfig())
        .env("HOSTNAME", instance)
        .env("POD_NAMESPACE", NAMESPACE)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}
