//! The real Kubernetes control plane on 127.0.0.1, for the test suites:
//! etcd, kube-apiserver (RBAC on, static tokens, service-account tokens),
//! kube-controller-manager (node lifecycle, garbage collector, ReplicaSet,
//! Deployment, StatefulSet, DaemonSet, disruption and the rest of its
//! default controllers), kube-scheduler and kwok (fake nodes whose pods
//! run, take their time to stop and go away), optionally cert-manager.
//!
//! The binaries come from `build.sh` (versions in `versions.env`), built
//! once into a cache folder. Every process is stopped, by pid, when the
//! [`ControlPlane`] is dropped, whatever the test's outcome.
//!
//! ```no_run
//! # async fn f() -> Result<(), nmo_control_plane::ControlPlaneError> {
//! let cp = nmo_control_plane::ControlPlane::start(nmo_control_plane::Options::workers(3)).await?;
//! let client = cp.client().await?;
//! # Ok(()) }
//! ```

mod binaries;
mod node;
mod olm;
mod pki;
mod ports;
mod process;
mod proxy;
mod registry;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;

pub use binaries::{Binaries, versions};
pub use node::{
    APISERVER_ADDRESS, CLUSTER_CIDR, SERVICE_RANGE, isolated, node_address, scratch_image,
    scratch_image_with,
};
pub use olm::{OLM_NAMESPACE, OLM_OPM_IMAGE, OLM_UTIL_IMAGE, olm_images};
pub use pki::TokenUser;
pub use ports::free_port;
use process::Process;
pub use registry::OciRegistry;

/// Shown the same by `{}` and `{:?}`, so a test's `unwrap` prints what
/// went wrong and how to fix it.
#[derive(thiserror::Error)]
pub enum ControlPlaneError {
    #[error(
        "the real control plane could not be built: {0}\n\
         It is built from Go modules by tests/control-plane/build.sh (versions in \
         tests/control-plane/versions.env): install Go 1.26 or later (https://go.dev/doc/install) \
         and let it reach the Go module proxy (GOPROXY, https://proxy.golang.org by default), \
         or point NMO_CONTROL_PLANE_BIN at a folder that holds the built binaries."
    )]
    Build(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("making the control plane's certificates: {0}")]
    Pki(#[from] rcgen::Error),
    #[error("{component} exited before it was stopped ({status})\n{log}")]
    Exited {
        component: String,
        status: String,
        log: String,
    },
    #[error("{what} after {after:?}\n{log}")]
    NotReady {
        what: String,
        after: Duration,
        log: String,
    },
    #[error("API: {0}")]
    Kube(#[from] kube::Error),
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("kubectl {args}: {output}")]
    Kubectl { args: String, output: String },
    #[error("real node: {0}")]
    Node(String),
}

impl std::fmt::Debug for ControlPlaneError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl ControlPlaneError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        ControlPlaneError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// A fake node kwok manages.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// How many pods it takes (its `pods` capacity; 110 as a kubelet's).
    pub max_pods: u32,
}

impl NodeSpec {
    pub fn new(name: impl Into<String>) -> Self {
        NodeSpec {
            name: name.into(),
            labels: BTreeMap::new(),
            max_pods: 110,
        }
    }

    /// Takes up to `n` pods.
    pub fn max_pods(mut self, n: u32) -> Self {
        self.max_pods = n;
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }
}

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Nodes created (and Ready) before `start` returns.
    pub nodes: Vec<NodeSpec>,
    /// The API server writes an audit log (every request, metadata level).
    pub audit: bool,
    /// Real nodes (a kubelet with containerd each, and kube-proxy), Ready
    /// before `start` returns. Only inside [`isolated`]: their addresses
    /// and the API server's then live in the test's own network namespace.
    pub real_nodes: Vec<String>,
    /// Image archives imported into every real node's containerd.
    pub images: Vec<PathBuf>,
}

impl Options {
    /// `worker-1` … `worker-N`.
    pub fn workers(n: usize) -> Self {
        Options {
            nodes: (1..=n)
                .map(|i| NodeSpec::new(format!("worker-{i}")))
                .collect(),
            ..Options::default()
        }
    }
}

/// One request of the API server's audit log.
#[derive(Debug, Clone)]
pub struct AuditRecord {
    pub verb: String,
    pub uri: String,
    pub user: String,
    pub user_agent: String,
    pub code: u16,
}

/// A running control plane. Dropping it stops every process it started.
pub struct ControlPlane {
    // Declared first: dropped (stopped) before the folder goes.
    real: Option<node::RealNodes>,
    processes: Vec<Process>,
    dir: tempfile::TempDir,
    bin: Binaries,
    port: u16,
    ca_pem: String,
    admin: TokenUser,
    audit_log: Option<PathBuf>,
    started: Duration,
    routes: proxy::Routes,
    proxy: tokio::task::JoinHandle<()>,
}

const ADMIN: &str = "admin";
const KCM: &str = "system:kube-controller-manager";
const SCHEDULER: &str = "system:kube-scheduler";
const KWOK: &str = "kwok";
const KUBELET: &str = "kubelet";
const KUBE_PROXY: &str = "system:kube-proxy";

impl ControlPlane {
    /// Builds what is missing (with a line saying so), starts etcd, the API
    /// server, the controller manager, the scheduler and kwok on free
    /// loopback ports, creates `opts.nodes` and waits until they are Ready
    /// and the `default` ServiceAccount exists.
    pub async fn start(opts: Options) -> Result<ControlPlane, ControlPlaneError> {
        let bin = tokio::task::spawn_blocking(Binaries::ensure)
            .await
            .map_err(|e| ControlPlaneError::Build(e.to_string()))??;
        let begun = Instant::now();
        let dir = tempfile::Builder::new()
            .prefix("nmo-control-plane-")
            .tempdir()
            .map_err(|e| ControlPlaneError::io(&std::env::temp_dir(), e))?;
        let pki = pki::write(
            dir.path(),
            &[
                (ADMIN, &["system:masters"]),
                (KCM, &[]),
                (SCHEDULER, &[]),
                (KWOK, &["system:masters"]),
                (KUBELET, &["system:masters"]),
                (KUBE_PROXY, &[]),
            ],
        )?;
        let admin = pki.tokens[0].clone();
        let proxy_addr = dir.path().join("cluster-network.sock");
        let listener = tokio::net::UnixListener::bind(&proxy_addr)
            .map_err(|e| ControlPlaneError::io(&proxy_addr, e))?;
        let routes = proxy::Routes::default();
        let proxy = tokio::spawn(proxy::serve(listener, routes.clone()));
        let mut cp = ControlPlane {
            real: None,
            processes: Vec::new(),
            dir,
            bin,
            port: 0,
            ca_pem: pki.ca_pem.clone(),
            admin,
            audit_log: None,
            started: Duration::ZERO,
            routes,
            proxy,
        };
        cp.start_etcd().await?;
        let real = !opts.real_nodes.is_empty();
        cp.start_apiserver(opts.audit, (!real).then_some(proxy_addr))
            .await?;
        // The API server's port is known now.
        for user in &pki.tokens[1..] {
            cp.write_kubeconfig(&format!("{}.kubeconfig", short(&user.user)), &user.token)?;
        }
        let admin_token = cp.admin.token.clone();
        cp.write_kubeconfig("admin.kubeconfig", &admin_token)?;
        let client = cp.client().await?;
        cp.wait_apiserver(&client).await?;
        cp.start_controllers()?;
        for node in &opts.nodes {
            cp.add_node(&client, node).await?;
        }
        if real {
            let wiring = node::Wiring {
                bin: &cp.bin,
                dir: cp.dir.path(),
                kubelet_kubeconfig: cp.dir.path().join("kubelet.kubeconfig"),
                proxy_kubeconfig: cp.dir.path().join("kube-proxy.kubeconfig"),
                images: &opts.images,
            };
            cp.real = Some(node::RealNodes::start(&wiring, &opts.real_nodes).await?);
        }
        let names: Vec<&str> = opts
            .nodes
            .iter()
            .map(|n| n.name.as_str())
            .chain(opts.real_nodes.iter().map(String::as_str))
            .collect();
        cp.wait_nodes_ready(&client, &names).await?;
        cp.wait_default_service_account(&client).await?;
        cp.started = begun.elapsed();
        Ok(cp)
    }

    /// How long the last `start` took once the binaries were there.
    pub fn time_to_ready(&self) -> Duration {
        self.started
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The control plane's working folder (logs, certificates, kubeconfigs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn binaries(&self) -> &Binaries {
        &self.bin
    }

    /// A kubeconfig for the cluster admin (`system:masters`).
    pub fn kubeconfig(&self) -> String {
        self.kubeconfig_with_token(&self.admin.token)
    }

    /// The admin kubeconfig's file.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    /// A kubeconfig that authenticates with `token` (a ServiceAccount's, say).
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\n\
             users:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: real\n  context:\n    cluster: real\n    user: user\ncurrent-context: real\n",
            self.url()
        )
    }

    /// Writes a kubeconfig with `token` to `<dir>/<name>`; returns its path.
    pub fn write_kubeconfig(&self, name: &str, token: &str) -> Result<PathBuf, ControlPlaneError> {
        let path = self.dir.path().join(name);
        std::fs::write(&path, self.kubeconfig_with_token(token))
            .map_err(|e| ControlPlaneError::io(&path, e))?;
        Ok(path)
    }

    /// A kube client as the cluster admin.
    pub async fn client(&self) -> Result<Client, ControlPlaneError> {
        self.client_with_token(&self.admin.token).await
    }

    /// A kube client that authenticates with `token`.
    pub async fn client_with_token(&self, token: &str) -> Result<Client, ControlPlaneError> {
        let kc = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_with_token(token))
            .map_err(|e| ControlPlaneError::Kubeconfig(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| ControlPlaneError::Kubeconfig(e.to_string()))?;
        Ok(Client::try_from(config)?)
    }

    /// A token for ServiceAccount `namespace/name` (TokenRequest, 1 hour).
    pub async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<String, ControlPlaneError> {
        use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
        let sas: Api<ServiceAccount> = Api::namespaced(self.client().await?, namespace);
        let req = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![],
                expiration_seconds: Some(3600),
                ..Default::default()
            },
            ..Default::default()
        };
        let out: TokenRequest = sas
            .create_subresource("token", name, &PostParams::default(), &req)
            .await?;
        out.status.map(|s| s.token).ok_or_else(|| {
            ControlPlaneError::Kubeconfig(format!("no token for {namespace}/{name}"))
        })
    }

    /// Creates a fake node kwok manages (32 CPUs, 256 GiB, 110 pods unless
    /// the spec says otherwise).
    pub async fn add_node(
        &self,
        client: &Client,
        node: &NodeSpec,
    ) -> Result<(), ControlPlaneError> {
        let mut labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_owned(), node.name.clone()),
            ("kubernetes.io/os".to_owned(), "linux".to_owned()),
            ("kubernetes.io/arch".to_owned(), "amd64".to_owned()),
            ("type".to_owned(), "kwok".to_owned()),
        ]);
        labels.extend(node.labels.clone());
        let resources = json!({"cpu": "32", "memory": "256Gi", "pods": node.max_pods.to_string()});
        let obj: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": node.name,
                "labels": labels,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            },
            "status": {"allocatable": resources, "capacity": resources},
        }))
        .map_err(|e| ControlPlaneError::Kubeconfig(e.to_string()))?;
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &obj)
            .await?;
        Ok(())
    }

    /// Waits until every node of `names` is Ready (kwok took it over).
    pub async fn wait_nodes_ready(
        &mut self,
        client: &Client,
        names: &[&str],
    ) -> Result<(), ControlPlaneError> {
        let nodes: Api<Node> = Api::all(client.clone());
        let limit = Duration::from_secs(60 + names.len() as u64 / 10);
        self.wait_for("the nodes Ready", limit, || {
            let nodes = nodes.clone();
            async move {
                for name in names {
                    let Ok(node) = nodes.get(name).await else {
                        return false;
                    };
                    let ready = node
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    if !ready {
                        return false;
                    }
                }
                true
            }
        })
        .await
    }

    /// The API server's audit log, if `Options::audit` asked for one: the
    /// files it rotated out (at 100 MB, `audit-<time>.log` beside it, kept
    /// all), oldest first, then the one it writes.
    pub fn audit(&self) -> Vec<AuditRecord> {
        let Some(path) = &self.audit_log else {
            return Vec::new();
        };
        let mut rotated: Vec<PathBuf> = path
            .parent()
            .and_then(|d| std::fs::read_dir(d).ok())
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("audit-") && n.ends_with(".log"))
            })
            .collect();
        // Their names carry the time they were rotated at.
        rotated.sort();
        rotated.push(path.clone());
        let text: String = rotated
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        text.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|e| e["stage"] == "ResponseComplete")
            .map(|e| AuditRecord {
                verb: e["verb"].as_str().unwrap_or_default().to_owned(),
                uri: e["requestURI"].as_str().unwrap_or_default().to_owned(),
                user: e["user"]["username"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                user_agent: e["userAgent"].as_str().unwrap_or_default().to_owned(),
                code: e["responseStatus"]["code"].as_u64().unwrap_or_default() as u16,
            })
            .collect()
    }

    /// Runs the real kubectl as the admin, `stdin` as its input; fails with
    /// what it printed when it fails.
    pub async fn kubectl(
        &self,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, ControlPlaneError> {
        let (ok, out) = kubectl_with(&self.kubeconfig_path(), args, stdin).await?;
        if ok {
            Ok(out)
        } else {
            Err(ControlPlaneError::Kubectl {
                args: args.join(" "),
                output: out,
            })
        }
    }

    /// Applies YAML documents as the admin (`kubectl apply --server-side`);
    /// when they hold CustomResourceDefinitions, waits until every CRD is
    /// established, so their resources can be created at once.
    pub async fn apply(&self, yaml: &str) -> Result<String, ControlPlaneError> {
        self.apply_with(yaml, &[]).await
    }

    /// [`apply`](Self::apply), taking over the fields other field managers
    /// own (`--force-conflicts`: another operator's CRD, say).
    pub async fn apply_forcing(&self, yaml: &str) -> Result<String, ControlPlaneError> {
        self.apply_with(yaml, &["--force-conflicts"]).await
    }

    async fn apply_with(&self, yaml: &str, extra: &[&str]) -> Result<String, ControlPlaneError> {
        let mut args = vec!["apply", "--server-side"];
        args.extend_from_slice(extra);
        args.extend(["-f", "-"]);
        let out = self.kubectl(&args, Some(yaml)).await?;
        if yaml.contains("kind: CustomResourceDefinition") {
            self.kubectl(
                &[
                    "wait",
                    "--for=condition=Established",
                    "--timeout=60s",
                    "crd",
                    "--all",
                ],
                None,
            )
            .await?;
        }
        Ok(out)
    }

    /// Starts cert-manager (its CRDs, controller and cainjector) and waits
    /// until its CRDs are established.
    pub async fn start_cert_manager(&mut self) -> Result<(), ControlPlaneError> {
        let path = self.bin.path("cert-manager-crds.yaml");
        let crds = std::fs::read_to_string(&path).map_err(|e| ControlPlaneError::io(&path, e))?;
        self.apply(&crds).await?;
        self.kubectl(&["create", "namespace", "cert-manager"], None)
            .await?;
        let kc = self.kubeconfig_path().display().to_string();
        for name in ["cert-manager-controller", "cert-manager-cainjector"] {
            let program = self.bin.path(name);
            let p = Process::spawn(
                name,
                &program,
                &[format!("--kubeconfig={kc}")],
                self.dir.path(),
            )?;
            self.processes.push(p);
        }
        Ok(())
    }

    /// Sends the API server's connections to Service `namespace/name`'s
    /// `port` (a webhook's, say) to `to` on loopback: the one stand-in for
    /// the pod network, with the Service's objects left as shipped. The
    /// API server dials a Service by its cluster IP (its service
    /// resolver), and TLS is checked against the Service's DNS name.
    pub async fn route_service(
        &self,
        namespace: &str,
        name: &str,
        port: u16,
        to: std::net::SocketAddr,
    ) -> Result<(), ControlPlaneError> {
        use k8s_openapi::api::core::v1::Service;
        let svc = Api::<Service>::namespaced(self.client().await?, namespace)
            .get(name)
            .await?;
        if let Some(ip) = svc.spec.and_then(|s| s.cluster_ip) {
            self.routes.add(&format!("{ip}:{port}"), to);
        }
        self.routes
            .add(&format!("{name}.{namespace}.svc:{port}"), to);
        Ok(())
    }

    /// Fails if a component has exited.
    pub fn check_running(&mut self) -> Result<(), ControlPlaneError> {
        for p in &mut self.processes {
            p.check_running()?;
        }
        if let Some(r) = &mut self.real {
            r.check_running()?;
        }
        Ok(())
    }

    /// Stops real node `name`'s kubelet (its pods keep running, as when a
    /// kubelet dies).
    pub fn stop_kubelet(&mut self, name: &str) {
        if let Some(r) = &mut self.real {
            r.stop_kubelet(name);
        }
    }

    /// The pids of the running components, by name.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.processes
            .iter()
            .map(|p| (p.name.clone(), p.pid()))
            .chain(self.real.iter().flat_map(|r| r.pids()))
            .collect()
    }

    /// The end of every component's log (for a failing test's message).
    pub fn logs_tail(&self, lines: usize) -> String {
        self.processes
            .iter()
            .map(|p| p.log.as_path())
            .chain(self.real.iter().flat_map(|r| r.logs()))
            .map(|log| process::tail(log, lines))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stops every component, newest first.
    pub fn stop(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        if let Some(r) = self.real.take() {
            r.stop();
        }
        self.proxy.abort();
        while let Some(mut p) = self.processes.pop() {
            p.stop(Duration::from_secs(5));
        }
    }

    async fn start_etcd(&mut self) -> Result<(), ControlPlaneError> {
        let data = self.dir.path().join("etcd");
        let ports = self
            .spawn_listening("etcd", 2, |p| {
                let (client, peer) = (p[0], p[1]);
                vec![
                    "--name=default".to_owned(),
                    format!("--data-dir={}", data.display()),
                    format!("--listen-client-urls=http://127.0.0.1:{client}"),
                    format!("--advertise-client-urls=http://127.0.0.1:{client}"),
                    format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
                    format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
                    format!("--initial-cluster=default=http://127.0.0.1:{peer}"),
                    "--unsafe-no-fsync".to_owned(),
                    "--log-level=warn".to_owned(),
                ]
            })
            .await?;
        std::fs::write(
            self.dir.path().join("etcd.url"),
            format!("http://127.0.0.1:{}", ports[0]),
        )
        .map_err(|e| ControlPlaneError::io(self.dir.path(), e))?;
        Ok(())
    }

    /// Starts `component` on `count` fresh loopback ports (`args` makes
    /// its arguments from them) and waits until it listens on the first.
    /// Should it exit because one was taken after all (another program
    /// bound it in between), it is started again on new ones, up to
    /// three times. Returns the ports.
    async fn spawn_listening(
        &mut self,
        component: &str,
        count: usize,
        args: impl Fn(&[u16]) -> Vec<String>,
    ) -> Result<Vec<u16>, ControlPlaneError> {
        const TRIES: usize = 3;
        let program = self.bin.path(component);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let ports = (0..count)
                .map(|_| free_port())
                .collect::<Result<Vec<u16>, _>>()?;
            let mut p = Process::spawn(component, &program, &args(&ports), self.dir.path())?;
            match p.wait_listening(ports[0], Duration::from_secs(60)).await {
                Ok(()) => {
                    self.processes.push(p);
                    return Ok(ports);
                }
                Err(ControlPlaneError::Exited { .. })
                    if attempt < TRIES && p.found_port_taken() =>
                {
                    let kept = self
                        .dir
                        .path()
                        .join(format!("{component}-port-taken-{attempt}.log"));
                    let _ = std::fs::rename(&p.log, kept);
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn start_apiserver(
        &mut self,
        audit: bool,
        proxy: Option<PathBuf>,
    ) -> Result<(), ControlPlaneError> {
        let d = self.dir.path();
        let etcd = std::fs::read_to_string(d.join("etcd.url"))
            .map_err(|e| ControlPlaneError::io(&d.join("etcd.url"), e))?;
        let f = |name: &str| d.join(name).display().to_string();
        let mut args = vec![
            format!("--etcd-servers={etcd}"),
            format!("--tls-cert-file={}", f("serving.crt")),
            format!("--tls-private-key-file={}", f("serving.key")),
            format!("--client-ca-file={}", f("ca.crt")),
            format!("--token-auth-file={}", f("tokens.csv")),
            "--authorization-mode=RBAC".to_owned(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!("--service-account-key-file={}", f("sa.pub")),
            format!("--service-account-signing-key-file={}", f("sa.key")),
            format!("--service-cluster-ip-range={}", node::SERVICE_RANGE),
            "--allow-privileged=true".to_owned(),
            "--profiling=false".to_owned(),
            "--v=0".to_owned(),
        ];
        if audit {
            let policy = d.join("audit-policy.yaml");
            std::fs::write(
                &policy,
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
            )
            .map_err(|e| ControlPlaneError::io(&policy, e))?;
            let log = d.join("audit.log");
            args.push(format!("--audit-policy-file={}", policy.display()));
            args.push(format!("--audit-log-path={}", log.display()));
            args.push("--audit-log-format=json".to_owned());
            args.push("--audit-log-mode=blocking".to_owned());
            self.audit_log = Some(log);
        }
        let Some(proxy) = proxy else {
            // Real nodes: the API server listens on the nodes' network too
            // (the `kubernetes` Service's endpoint) and reaches Services
            // and kubelets directly, through kube-proxy's rules.
            args.extend([
                "--bind-address=0.0.0.0".to_owned(),
                format!("--advertise-address={}", node::APISERVER_ADDRESS),
                "--kubelet-preferred-address-types=InternalIP".to_owned(),
            ]);
            return self.spawn_apiserver(args).await;
        };
        args.extend([
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            // No kubelet serves the address an Endpoints object would name.
            "--endpoint-reconciler-type=none".to_owned(),
        ]);
        // The cluster network: through the harness's CONNECT proxy.
        let egress = d.join("egress.yaml");
        std::fs::write(
            &egress,
            format!(
                "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n\
                 - name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      uds:\n        udsName: {}\n",
                proxy.display()
            ),
        )
        .map_err(|e| ControlPlaneError::io(&egress, e))?;
        args.push(format!(
            "--egress-selector-config-file={}",
            egress.display()
        ));
        self.spawn_apiserver(args).await
    }

    async fn spawn_apiserver(&mut self, args: Vec<String>) -> Result<(), ControlPlaneError> {
        let ports = self
            .spawn_listening("kube-apiserver", 1, |p| {
                let mut all = args.clone();
                all.push(format!("--secure-port={}", p[0]));
                all
            })
            .await?;
        self.port = ports[0];
        Ok(())
    }

    async fn wait_apiserver(&mut self, client: &Client) -> Result<(), ControlPlaneError> {
        self.wait_for(
            "kube-apiserver /readyz",
            Duration::from_secs(90),
            || async {
                let req = http::Request::get("/readyz")
                    .body(Vec::new())
                    .expect("a GET");
                client
                    .request_text(req)
                    .await
                    .is_ok_and(|t| t.trim() == "ok")
            },
        )
        .await
    }

    fn start_controllers(&mut self) -> Result<(), ControlPlaneError> {
        let d = self.dir.path().to_owned();
        let f = |name: &str| d.join(name).display().to_string();
        let kcm = vec![
            format!("--kubeconfig={}", f("kube-controller-manager.kubeconfig")),
            "--secure-port=0".to_owned(),
            "--leader-elect=false".to_owned(),
            "--use-service-account-credentials=true".to_owned(),
            format!("--service-account-private-key-file={}", f("sa.key")),
            format!("--root-ca-file={}", f("ca.crt")),
            "--controllers=*".to_owned(),
            "--v=0".to_owned(),
        ];
        let p = Process::spawn(
            "kube-controller-manager",
            &self.bin.path("kube-controller-manager"),
            &kcm,
            &d,
        )?;
        self.processes.push(p);
        let sched = vec![
            format!("--kubeconfig={}", f("kube-scheduler.kubeconfig")),
            "--secure-port=0".to_owned(),
            "--leader-elect=false".to_owned(),
            "--v=0".to_owned(),
        ];
        let p = Process::spawn(
            "kube-scheduler",
            &self.bin.path("kube-scheduler"),
            &sched,
            &d,
        )?;
        self.processes.push(p);
        let kwok = vec![
            format!("--kubeconfig={}", f("kwok.kubeconfig")),
            format!("--config={}", self.bin.path("kwok-stages.yaml").display()),
            "--manage-all-nodes=false".to_owned(),
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".to_owned(),
            "--node-lease-duration-seconds=40".to_owned(),
            "--cidr=10.128.0.1/9".to_owned(),
            "--node-ip=127.0.0.1".to_owned(),
        ];
        let p = Process::spawn("kwok", &self.bin.path("kwok"), &kwok, &d)?;
        self.processes.push(p);
        Ok(())
    }

    async fn wait_default_service_account(
        &mut self,
        client: &Client,
    ) -> Result<(), ControlPlaneError> {
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        self.wait_for(
            "the default ServiceAccount (kube-controller-manager)",
            Duration::from_secs(60),
            || {
                let sas = sas.clone();
                async move { sas.get_opt("default").await.ok().flatten().is_some() }
            },
        )
        .await
    }

    /// Polls `ready` until it holds, failing at `limit` or as soon as a
    /// component exits (with the ends of the logs).
    pub async fn wait_for<F, Fut>(
        &mut self,
        what: &str,
        limit: Duration,
        mut ready: F,
    ) -> Result<(), ControlPlaneError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let begun = Instant::now();
        loop {
            self.check_running()?;
            if ready().await {
                return Ok(());
            }
            if begun.elapsed() > limit {
                return Err(ControlPlaneError::NotReady {
                    what: format!("never {what}"),
                    after: limit,
                    log: self.logs_tail(15),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop_all();
    }
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("url", &self.url())
            .field("dir", &self.dir.path())
            .field("pids", &self.pids())
            .finish()
    }
}

/// `system:kube-controller-manager` → `kube-controller-manager`.
fn short(user: &str) -> &str {
    user.strip_prefix("system:").unwrap_or(user)
}

/// Runs kubectl with the kubeconfig `kc` (its cache beside it); whether it
/// succeeded and what it printed (stdout, then stderr).
pub async fn kubectl_with(
    kc: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<(bool, String), ControlPlaneError> {
    use tokio::io::AsyncWriteExt;
    let cache = kc.with_file_name("kubectl-cache");
    let mut child = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kc)
        .arg("--cache-dir")
        .arg(cache)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| ControlPlaneError::io(Path::new("kubectl"), e))?;
    // Dropped after writing: kubectl sees the end of its input.
    if let Some(mut input) = child.stdin.take()
        && let Some(text) = stdin
    {
        input
            .write_all(text.as_bytes())
            .await
            .map_err(|e| ControlPlaneError::io(Path::new("kubectl"), e))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| ControlPlaneError::io(Path::new("kubectl"), e))?;
    Ok((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}
