//! nmo-sim: a simulated Kubernetes API server and cluster.
//!
//! It serves enough of the real API, over HTTP on 127.0.0.1, for `kubectl`
//! and `kube::Client` to work against it unchanged: discovery, CRUD with
//! resourceVersion and optimistic concurrency, label and field selectors,
//! pagination, watches (resume, bookmarks, 410 Gone), JSON / merge /
//! strategic merge / apply patches, the status subresource, finalizers and
//! graceful deletion, the Eviction subresource with PodDisruptionBudgets,
//! CustomResourceDefinitions, server-side tables. Behind it runs a small
//! cluster: a scheduler, a kubelet, and the workload controllers, so drains
//! behave as on a real cluster. Faults (errors, latency, dropped watches, a
//! paused kubelet) can be switched on.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let cluster = nmo_sim::SimCluster::start(nmo_sim::SimOptions::default()).await?;
//! cluster.add_node("worker-1")?;
//! cluster.write_kubeconfig(std::path::Path::new("/tmp/sim.kubeconfig"))?;
//! // kubectl --kubeconfig /tmp/sim.kubeconfig get nodes
//! cluster.stop().await;
//! # Ok(()) }
//! ```

pub mod admission;
pub mod api;
pub mod auth;
pub mod cluster;
pub mod defaults;
pub mod error;
pub mod logs;
pub mod openapi;
pub mod patch;
pub mod proto;
pub mod resources;
pub mod selectors;
pub mod server;
pub mod state;
pub mod store;
pub mod tables;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;

pub use error::ApiError;
pub use state::{AuditRecord, FaultRule, Faults, OneShot, Sim, SlowAnswer};

/// How to start a simulated cluster.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Address to listen on; port 0 picks a free one.
    pub addr: SocketAddr,
    /// Simulated seconds per real second for the cluster's own waits
    /// (grace periods, startup): 10.0 makes a 30 s grace period 3 s.
    pub time_scale: f64,
    /// Changes kept for watches that resume from a resourceVersion; a
    /// watch from an older one gets 410 Gone.
    pub watch_history: usize,
    /// Serve HTTPS with a fresh self-signed certificate (for 127.0.0.1 and
    /// localhost) that the kubeconfig trusts. client-go (kubectl) sends a
    /// bearer token only over TLS, so authorization needs it.
    pub tls: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            addr: ([127, 0, 0, 1], 0).into(),
            time_scale: 1.0,
            watch_history: store::HISTORY,
            tls: false,
        }
    }
}

/// Errors of the simulation's own API (not the Kubernetes API's answers).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Api(#[from] ApiError),
    #[error("scenario: {0}")]
    Scenario(String),
    #[error("cannot make the server's certificate: {0}")]
    Tls(String),
}

/// A running simulated cluster.
pub struct SimCluster {
    sim: Arc<Sim>,
    addr: SocketAddr,
    /// The server certificate (PEM) when serving HTTPS.
    ca_pem: Option<String>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl SimCluster {
    /// Starts the API server and the cluster's controllers, with the
    /// namespaces a new cluster has.
    pub async fn start(opts: SimOptions) -> Result<SimCluster, SimError> {
        let listener = tokio::net::TcpListener::bind(opts.addr)
            .await
            .map_err(|source| SimError::Listen {
                addr: opts.addr,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| SimError::Listen {
            addr: opts.addr,
            source,
        })?;
        let sim = Arc::new(Sim::new(opts.time_scale, opts.watch_history));
        let (stop, stop_rx) = watch::channel(false);
        let (acceptor, ca_pem) = if opts.tls {
            let (acceptor, pem) = tls_acceptor()?;
            (Some(acceptor), Some(pem))
        } else {
            (None, None)
        };
        let cluster = SimCluster {
            tasks: vec![
                tokio::spawn(server::serve(
                    sim.clone(),
                    listener,
                    acceptor,
                    stop_rx.clone(),
                )),
                tokio::spawn(cluster::run(sim.clone(), stop_rx)),
            ],
            sim,
            addr,
            ca_pem,
            stop,
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            cluster.create(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            )?;
        }
        // The default roles every cluster has: cluster-admin (for
        // system:masters) and system:basic-user (every authenticated user
        // may ask what it may do: `kubectl auth can-i`).
        for obj in [
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "cluster-admin"},
                "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                          {"nonResourceURLs": ["*"], "verbs": ["*"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "cluster-admin"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:masters"}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "system:basic-user"},
                "rules": [{"apiGroups": ["authorization.k8s.io"],
                           "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                           "verbs": ["create"]},
                          {"apiGroups": ["authentication.k8s.io"],
                           "resources": ["selfsubjectreviews"],
                           "verbs": ["create"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "system:basic-user"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:basic-user"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}]}),
        ] {
            cluster.create(obj)?;
        }
        Ok(cluster)
    }

    /// Stops serving.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// The shared state, for direct access in tests.
    pub fn sim(&self) -> &Arc<Sim> {
        &self.sim
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (`https://` with [`SimOptions::tls`]).
    pub fn url(&self) -> String {
        let scheme = if self.ca_pem.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// A kubeconfig for this cluster (context `nmo-sim`), as its
    /// administrator.
    pub fn kubeconfig(&self) -> String {
        self.kubeconfig_with_token(auth::ADMIN_TOKEN)
    }

    /// A kubeconfig that authenticates with `token`: e.g. a ServiceAccount's
    /// (`serviceaccount:<namespace>:<name>`, what `kubectl create token`
    /// returns here) to act as that ServiceAccount under RBAC.
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        use base64::Engine;
        let ca = self.ca_pem.as_ref().map_or(String::new(), |pem| {
            format!(
                "\n    certificate-authority-data: {}",
                base64::engine::general_purpose::STANDARD.encode(pem)
            )
        });
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: nmo-sim\n  cluster:\n    server: {}{ca}\ncontexts:\n- name: nmo-sim\n  context:\n    cluster: nmo-sim\n    user: nmo-sim\n    namespace: default\ncurrent-context: nmo-sim\nusers:\n- name: nmo-sim\n  user:\n    token: {token:?}\n",
            self.url()
        )
    }

    /// The uid of a pod and the name of one of its containers (the only
    /// one when `container` is None).
    fn container_of(
        &self,
        namespace: &str,
        pod: &str,
        container: Option<&str>,
    ) -> Result<(String, String), SimError> {
        let p = self.get("v1", "Pod", Some(namespace), pod)?;
        let (name, _) = api::log_container(&p, container)?;
        Ok((
            p["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
            name,
        ))
    }

    /// Writes a line to a container's log (`kubectl logs`).
    pub fn append_log(
        &self,
        namespace: &str,
        pod: &str,
        container: Option<&str>,
        line: &str,
    ) -> Result<(), SimError> {
        let (uid, name) = self.container_of(namespace, pod, container)?;
        self.sim.logs.append(&uid, &name, line);
        Ok(())
    }

    /// Makes what `output` prints (a real process's stdout or stderr) a
    /// container's log, line by line, until it ends.
    pub fn attach_log(
        &self,
        namespace: &str,
        pod: &str,
        container: Option<&str>,
        output: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    ) -> Result<tokio::task::JoinHandle<()>, SimError> {
        use tokio::io::AsyncBufReadExt;
        let (uid, name) = self.container_of(namespace, pod, container)?;
        let sim = self.sim.clone();
        Ok(tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(output).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                sim.logs.append(&uid, &name, &line);
            }
        }))
    }

    /// Switches authentication and RBAC authorization of requests on or off
    /// (off by default: every request acts as the administrator).
    pub fn set_authorization(&self, on: bool) {
        self.sim
            .authorization
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), SimError> {
        std::fs::write(path, self.kubeconfig()).map_err(|source| SimError::Write {
            path: path.display().to_string(),
            source,
        })
    }

    fn type_of(&self, obj: &Value) -> Result<resources::ResourceType, SimError> {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        self.sim
            .all_types()
            .into_iter()
            .find(|t| t.group == group && t.version == version && t.kind == kind)
            .ok_or_else(|| SimError::Scenario(format!("no resource type for {api_version} {kind}")))
    }

    /// Creates any object (its apiVersion and kind say what it is).
    pub fn create(&self, obj: Value) -> Result<Value, SimError> {
        let rt = self.type_of(&obj)?;
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .map(str::to_owned)
            .or_else(|| rt.namespaced.then(|| "default".to_owned()));
        Ok(self.sim.create(&rt, ns.as_deref(), obj, false)?)
    }

    /// Creates every object of a multi-document YAML string, in order.
    pub fn apply_yaml(&self, yaml: &str) -> Result<Vec<Value>, SimError> {
        let mut out = Vec::new();
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(yaml).map_err(|e| SimError::Scenario(e.to_string()))?;
        for v in docs {
            if v.is_null() {
                continue;
            }
            out.push(self.create(v)?);
        }
        Ok(out)
    }

    /// Reads an object.
    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Value, SimError> {
        let rt = self.type_of(&json!({"apiVersion": api_version, "kind": kind}))?;
        Ok(self.sim.get(&rt, ns, name)?)
    }

    /// Changes an object with a JSON merge patch (as `kubectl patch
    /// --type merge`).
    pub fn patch(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<Value, SimError> {
        let rt = self.type_of(&json!({"apiVersion": api_version, "kind": kind}))?;
        Ok(self
            .sim
            .patch(&rt, ns, name, patch::PatchType::Merge, patch, None, false)?)
    }

    /// Deletes an object (as `kubectl delete`, background propagation).
    pub fn delete(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Value, SimError> {
        let rt = self.type_of(&json!({"apiVersion": api_version, "kind": kind}))?;
        Ok(self
            .sim
            .delete(&rt, ns, name, &api::DeleteOptions::default())?)
    }

    /// Every object of a kind (all namespaces).
    pub fn list(&self, api_version: &str, kind: &str) -> Result<Vec<Value>, SimError> {
        let rt = self.type_of(&json!({"apiVersion": api_version, "kind": kind}))?;
        let res = self.sim.list(&rt, None, &api::ListOptions::default())?;
        Ok(res.items.iter().map(|o| api::present(&rt, o)).collect())
    }

    /// Adds a Ready worker node.
    pub fn add_node(&self, name: &str) -> Result<Value, SimError> {
        self.create(node(name))
    }

    /// Switches faults.
    pub fn set_faults(&self, f: impl FnOnce(&mut Faults)) {
        self.sim.set_faults(f);
    }

    /// Simulated seconds per real second.
    pub fn set_time_scale(&self, scale: f64) {
        self.sim.clock.set_scale(scale);
    }

    /// Jumps simulated time forward.
    pub fn advance(&self, by: Duration) {
        self.sim.clock.advance(by);
        self.sim.wake.notify_one();
    }

    /// The cluster's objects now, to [`restore`](Self::restore) later.
    pub fn snapshot(&self) -> store::StoreSnapshot {
        self.sim.store().snapshot()
    }

    /// Goes back to a snapshot as an API server restored from a backup
    /// does: resourceVersions go backwards and open watches end.
    pub fn restore(&self, snapshot: store::StoreSnapshot) {
        self.sim.store().restore(snapshot);
        self.sim.wake.notify_one();
    }

    /// Starts recording every API request (see [`SimCluster::audit`]).
    pub fn record_audit(&self, on: bool) {
        self.sim
            .record_audit
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The requests recorded so far.
    pub fn audit(&self) -> Vec<AuditRecord> {
        self.sim
            .audit
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A TLS acceptor with a fresh self-signed certificate for 127.0.0.1 and
/// localhost, and the certificate's PEM.
fn tls_acceptor() -> Result<(tokio_rustls::TlsAcceptor, String), SimError> {
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .map_err(|e| SimError::Tls(e.to_string()))?;
    let pem = cert.cert.pem();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der()));
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| SimError::Tls(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(vec![CertificateDer::from(cert.cert.der().to_vec())], key)
    .map_err(|e| SimError::Tls(e.to_string()))?;
    Ok((tokio_rustls::TlsAcceptor::from(Arc::new(config)), pem))
}

/// A Ready node object, as a kubelet registers it.
pub fn node(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node-role.kubernetes.io/worker": "",
            },
        },
        "spec": {},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "250"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "250"},
            "nodeInfo": {"kubeletVersion": "v1.32.0", "osImage": "nmo-sim", "containerRuntimeVersion": "sim://1.0", "architecture": "amd64", "operatingSystem": "linux"},
            "addresses": [{"type": "Hostname", "address": name}],
        },
    })
}
