//! Real nodes: per node a kubelet and its own containerd (runc, the CNI
//! bridge plugin, its own root, state, socket and cgroup root), and one
//! kube-proxy for all of them, so pods really run and a Service's cluster
//! IP reaches them.
//!
//! The network rule: every address of a pod, a Service or a node exists
//! only inside a network namespace the harness makes ([`isolated`]): the
//! API server, etcd, the kubelets, containerd, kube-proxy and the pods'
//! bridges all live in it; the nodes' addresses are on `nodes0` (one end
//! of a veth pair whose other end is in the same namespace), and the
//! default route is `unreachable`. Nothing is bridged to the host's interfaces.
//!
//! The nodes share that one namespace: node `i` has address
//! `10.99.0.<i+1>` on `nodes0`, pod range `10.244.<i>.0/24` on bridge
//! `cni<i>`; the API server advertises `10.99.0.254`. One kube-proxy
//! programs the namespace's iptables for every node (a kube-proxy per node
//! would fight over the same tables).
//!
//! Stopping (whatever the outcome, by pid): the kubelets and kube-proxy,
//! then every process in the nodes' cgroups (the pods), the containerd
//! shims of the nodes' sockets, containerd itself; then the mounts under
//! the nodes' folders and the cgroups go.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::ControlPlaneError;
use crate::process::Process;

/// The API server's address on the nodes' network.
pub const APISERVER_ADDRESS: &str = "10.99.0.254";
/// The Services' range (the API server's `--service-cluster-ip-range`).
pub const SERVICE_RANGE: &str = "10.96.0.0/16";
/// The pods' range, split into one /24 per node.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The sandbox image containerd runs for each pod (node/pause, imported).
const PAUSE_IMAGE: &str = "localhost/pause:nmo";

/// Node `i`'s address on the nodes' network.
pub fn node_address(i: usize) -> String {
    format!("10.99.0.{}", i + 1)
}

fn pod_cidr(i: usize) -> String {
    format!("10.244.{i}.0/24")
}

/// Runs `f` to its end on a new thread that is alone in a new network
/// namespace (loopback up, `nodes0` as above, IPv4 forwarding on): a
/// control plane started inside, its processes and every socket the
/// thread opens live in that namespace; when the thread ends and its
/// processes are gone, the namespace goes too. Fails, saying what is
/// missing, where namespaces cannot be made (not root, no `ip`).
pub fn isolated<F, Fut, T>(f: F) -> Result<T, ControlPlaneError>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
    T: Send + 'static,
{
    std::thread::spawn(move || {
        enter_new_network()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ControlPlaneError::io(Path::new("tokio runtime"), e))?;
        Ok(rt.block_on(f()))
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Moves the calling thread (only it) into a new network namespace and
/// sets up its loopback and `nodes0`.
fn enter_new_network() -> Result<(), ControlPlaneError> {
    // SAFETY: unshare(2) with CLONE_NEWNET changes only the calling
    // thread's network namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(ControlPlaneError::Node(format!(
            "could not make a network namespace for the real nodes: {} \
             (they need root, or CAP_SYS_ADMIN and CAP_NET_ADMIN)",
            std::io::Error::last_os_error()
        )));
    }
    run(
        "ip",
        &["link", "set", "lo", "up"],
        "ip (Debian: apt-get install iproute2)",
    )?;
    // A veth pair with both ends here (this kernel may have no dummy
    // interfaces): `nodes0` holds the addresses, its peer nothing.
    run(
        "ip",
        &[
            "link",
            "add",
            "nodes0",
            "type",
            "veth",
            "peer",
            "name",
            "nodes0-end",
        ],
        "ip",
    )?;
    run("ip", &["link", "set", "nodes0", "up"], "ip")?;
    run("ip", &["link", "set", "nodes0-end", "up"], "ip")?;
    run(
        "ip",
        &[
            "addr",
            "add",
            &format!("{APISERVER_ADDRESS}/24"),
            "dev",
            "nodes0",
        ],
        "ip",
    )?;
    // Nothing but the namespace's own addresses can be reached. The
    // Services' range needs a route of its own: a local connection's
    // route is chosen before kube-proxy's rules rewrite its address.
    run("ip", &["route", "add", "unreachable", "default"], "ip")?;
    run(
        "ip",
        &["route", "add", SERVICE_RANGE, "dev", "nodes0"],
        "ip",
    )?;
    // Per namespace: /proc/sys/net answers for the opening thread's.
    let forward = Path::new("/proc/sys/net/ipv4/ip_forward");
    std::fs::write(forward, "1").map_err(|e| ControlPlaneError::io(forward, e))?;
    Ok(())
}

/// Whether the calling thread is in a network namespace of its own (not
/// the process's, which is its main thread's: pid 1's cannot always be
/// read).
pub(crate) fn in_own_network() -> bool {
    let ns = |p: &str| std::fs::read_link(p).ok();
    matches!((ns("/proc/thread-self/ns/net"), ns("/proc/self/ns/net")), (Some(a), Some(b)) if a != b)
}

/// Runs a setup command, failing with its output (and what to install
/// when it is missing).
fn run(program: &str, args: &[&str], install: &str) -> Result<String, ControlPlaneError> {
    let out = Command::new(program).args(args).output().map_err(|e| {
        ControlPlaneError::Node(format!("{program}: {e}; the real nodes need {install}"))
    })?;
    if !out.status.success() {
        return Err(ControlPlaneError::Node(format!(
            "{program} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What the nodes need from the control plane.
pub(crate) struct Wiring<'a> {
    pub(crate) bin: &'a crate::Binaries,
    pub(crate) dir: &'a Path,
    pub(crate) kubelet_kubeconfig: PathBuf,
    pub(crate) proxy_kubeconfig: PathBuf,
    /// Image archives (OCI or Docker) imported into every node's containerd.
    pub(crate) images: &'a [PathBuf],
}

/// One real node's processes and places.
struct Node {
    name: String,
    base: PathBuf,
    socket: PathBuf,
    cgroup: String,
    containerd: Process,
    kubelet: Option<Process>,
}

/// The running real nodes.
pub(crate) struct RealNodes {
    nodes: Vec<Node>,
    proxy: Option<Process>,
    /// The folder whose mounts are undone at the end.
    dir: PathBuf,
}

/// The host tools a real node needs, with how to install them.
const TOOLS: &[(&str, &str)] = &[
    ("containerd", "apt-get install containerd"),
    ("ctr", "apt-get install containerd"),
    ("runc", "apt-get install runc"),
    ("iptables", "apt-get install iptables"),
    ("buildah", "apt-get install buildah"),
];
const CNI_BIN: &str = "/usr/lib/cni";

fn check_tools() -> Result<(), ControlPlaneError> {
    let missing: Vec<String> = TOOLS
        .iter()
        .filter(|(t, _)| !on_path(t))
        .map(|(t, how)| format!("{t} ({how})"))
        .chain((!Path::new(CNI_BIN).join("bridge").exists()).then(|| {
            format!("the CNI plugins in {CNI_BIN} (apt-get install containernetworking-plugins)")
        }))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(ControlPlaneError::Node(format!(
            "the real nodes need: {}",
            missing.join(", ")
        )))
    }
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

impl RealNodes {
    /// Lets every node's containerd pull from the plain-HTTP registry at
    /// `host` (`127.0.0.1:PORT`, a test's own, in its network namespace):
    /// its `hosts.toml`, which containerd reads at each pull.
    pub(crate) fn trust_registry(&self, host: &str) -> Result<(), ControlPlaneError> {
        for n in &self.nodes {
            let dir = n.base.join("containerd/certs.d").join(host);
            std::fs::create_dir_all(&dir).map_err(|e| ControlPlaneError::io(&dir, e))?;
            let file = dir.join("hosts.toml");
            std::fs::write(
                &file,
                format!(
                    "server = \"http://{host}\"\n\n[host.\"http://{host}\"]\n  \
                     capabilities = [\"pull\", \"resolve\"]\n"
                ),
            )
            .map_err(|e| ControlPlaneError::io(&file, e))?;
        }
        Ok(())
    }

    /// Starts containerd and a kubelet for each of `names`, then
    /// kube-proxy. The caller waits for the nodes to be Ready.
    pub(crate) async fn start(
        w: &Wiring<'_>,
        names: &[String],
    ) -> Result<RealNodes, ControlPlaneError> {
        if !in_own_network() {
            return Err(ControlPlaneError::Node(
                "real nodes start only inside a network namespace of the test's own: \
                 run the test's body through nmo_control_plane::isolated"
                    .to_owned(),
            ));
        }
        check_tools()?;
        let pause = pause_image(w.bin, w.dir)?;
        let mut all = RealNodes {
            nodes: Vec::new(),
            proxy: None,
            dir: w.dir.to_owned(),
        };
        for (i, name) in names.iter().enumerate() {
            let node = start_node(w, i, name, &pause).await?;
            all.nodes.push(node);
        }
        all.proxy = Some(start_proxy(
            w,
            names.first().map(String::as_str).unwrap_or("real-1"),
        )?);
        Ok(all)
    }

    /// Fails if a node's process has exited.
    pub(crate) fn check_running(&mut self) -> Result<(), ControlPlaneError> {
        for n in &mut self.nodes {
            n.containerd.check_running()?;
            if let Some(k) = &mut n.kubelet {
                k.check_running()?;
            }
        }
        if let Some(p) = &mut self.proxy {
            p.check_running()?;
        }
        Ok(())
    }

    pub(crate) fn logs(&self) -> Vec<&Path> {
        self.nodes
            .iter()
            .flat_map(|n| {
                std::iter::once(n.containerd.log.as_path())
                    .chain(n.kubelet.iter().map(|k| k.log.as_path()))
            })
            .chain(self.proxy.iter().map(|p| p.log.as_path()))
            .collect()
    }

    pub(crate) fn pids(&self) -> Vec<(String, u32)> {
        self.nodes
            .iter()
            .flat_map(|n| {
                std::iter::once((n.containerd.name.clone(), n.containerd.pid()))
                    .chain(n.kubelet.iter().map(|k| (k.name.clone(), k.pid())))
            })
            .chain(self.proxy.iter().map(|p| (p.name.clone(), p.pid())))
            .collect()
    }

    /// Stops a node's kubelet (its pods keep running, as when a kubelet
    /// dies): the node goes NotReady after the lease runs out.
    pub(crate) fn stop_kubelet(&mut self, name: &str) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.name == name)
            && let Some(mut k) = n.kubelet.take()
        {
            k.stop(Duration::from_secs(5));
        }
    }

    /// Stops everything, pods first; undoes mounts and cgroups.
    pub(crate) fn stop(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        if let Some(mut p) = self.proxy.take() {
            p.stop(Duration::from_secs(5));
        }
        for n in &mut self.nodes {
            if let Some(mut k) = n.kubelet.take() {
                k.stop(Duration::from_secs(5));
            }
        }
        for n in &self.nodes {
            kill_cgroup_processes(&n.cgroup);
            kill_shims(&n.socket);
        }
        for mut n in self.nodes.drain(..) {
            n.containerd.stop(Duration::from_secs(5));
            kill_shims(&n.socket);
            unmount_under(&n.base);
            remove_cgroups(&n.cgroup);
        }
        unmount_under(&self.dir);
    }
}

impl Drop for RealNodes {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// `<dir>/pause.tar`: the sandbox image, `FROM scratch` with the pause
/// binary the control plane's build made, written by buildah (storage in
/// `<dir>`, nothing system-wide).
fn pause_image(bin: &crate::Binaries, dir: &Path) -> Result<PathBuf, ControlPlaneError> {
    let out = dir.join("pause.tar");
    scratch_image(
        &bin.path("pause"),
        &out,
        PAUSE_IMAGE,
        "/pause",
        "65535:65535",
    )?;
    Ok(out)
}

/// Writes `out`, an OCI archive of the image `name`: `FROM scratch`, the
/// static `binary` at `path` (its entrypoint), run as `user` (buildah,
/// its storage a temporary folder). For [`Options::images`](crate::Options::images).
pub fn scratch_image(
    binary: &Path,
    out: &Path,
    name: &str,
    path: &str,
    user: &str,
) -> Result<(), ControlPlaneError> {
    scratch_image_with(binary, out, name, path, user, &[])
}

/// [`scratch_image`] with more files in it: each `(file, at)` copied in,
/// executable.
pub fn scratch_image_with(
    binary: &Path,
    out: &Path,
    name: &str,
    path: &str,
    user: &str,
    files: &[(&Path, &str)],
) -> Result<(), ControlPlaneError> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("node/scratch-image.sh");
    let mut args = vec![
        script.display().to_string(),
        binary.display().to_string(),
        out.display().to_string(),
        name.to_owned(),
        path.to_owned(),
        user.to_owned(),
    ];
    args.extend(files.iter().map(|(f, at)| format!("{}:{at}", f.display())));
    run(
        "bash",
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        "bash",
    )?;
    Ok(())
}

async fn start_node(
    w: &Wiring<'_>,
    i: usize,
    name: &str,
    pause: &Path,
) -> Result<Node, ControlPlaneError> {
    let base = w.dir.join(format!("node-{name}"));
    let io = |p: &Path, e| ControlPlaneError::io(p, e);
    for sub in ["containerd", "cni", "cni-ipam", "kubelet", "logs"] {
        let d = base.join(sub);
        std::fs::create_dir_all(&d).map_err(|e| io(&d, e))?;
    }
    let address = node_address(i);
    run(
        "ip",
        &["addr", "add", &format!("{address}/24"), "dev", "nodes0"],
        "ip",
    )?;
    let tag = w
        .dir
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let cgroup = format!("/{tag}-{name}");
    make_cgroups(&cgroup)?;
    let socket = base.join("containerd.sock");

    write_cni(&base, i, name)?;

    let config = base.join("containerd.toml");
    std::fs::write(&config, containerd_config(&base, &socket)).map_err(|e| io(&config, e))?;
    let mut containerd = Process::spawn(
        &format!("containerd-{name}"),
        Path::new("containerd"),
        &["--config".to_owned(), config.display().to_string()],
        w.dir,
    )?;
    wait_socket(&mut containerd, &socket).await?;
    let images = std::iter::once(pause).chain(w.images.iter().map(PathBuf::as_path));
    import_images(&socket, images)?;

    let kubelet_config = base.join("kubelet.yaml");
    let text = kubelet_config_text(&base, &socket, &cgroup, &address, i);
    std::fs::write(&kubelet_config, text).map_err(|e| io(&kubelet_config, e))?;
    let kubelet = Process::spawn(
        &format!("kubelet-{name}"),
        &w.bin.path("kubelet"),
        &[
            format!("--config={}", kubelet_config.display()),
            format!("--kubeconfig={}", w.kubelet_kubeconfig.display()),
            format!("--root-dir={}/kubelet", base.display()),
            format!("--hostname-override={name}"),
            format!("--node-ip={address}"),
            "--node-labels=nmo.medik8s.io/test-node=real".to_owned(),
            "--v=1".to_owned(),
        ],
        w.dir,
    )?;
    Ok(Node {
        name: name.to_owned(),
        base,
        socket,
        cgroup,
        containerd,
        kubelet: Some(kubelet),
    })
}

/// The node's CNI network: a bridge of its own, its pod range.
fn write_cni(base: &Path, i: usize, name: &str) -> Result<(), ControlPlaneError> {
    let cni = base.join("cni/10-bridge.conflist");
    std::fs::write(
        &cni,
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": format!("nmo-{name}"),
            "plugins": [{
                "type": "bridge", "bridge": format!("cni{i}"), "isGateway": true,
                "ipMasq": false, "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr(i)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": base.join("cni-ipam"),
                },
            }],
        })
        .to_string(),
    )
    .map_err(|e| ControlPlaneError::io(&cni, e))
}

/// The node's containerd configuration: its own root, state and socket,
/// the CRI plugin with the CNI network above.
fn containerd_config(base: &Path, socket: &Path) -> String {
    let b = base.display();
    format!(
        r#"version = 2
root = "{b}/containerd/root"
state = "{b}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  level = "warn"
[plugins."io.containerd.internal.v1.opt"]
  path = "{b}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  # These machines refuse a negative oom_score_adj (even to root): the
  # sandbox's -998 would fail every pod; kept at containerd's own instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{b}/cni"
  # Registries the node pulls from: a folder per host, read at each pull
  # (RealNodes::trust_registry writes one for a test's own registry).
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{b}/containerd/certs.d"
"#,
        sock = socket.display()
    )
}

/// Imports the image archives into the node's containerd.
fn import_images<'a>(
    socket: &Path,
    images: impl Iterator<Item = &'a Path>,
) -> Result<(), ControlPlaneError> {
    for image in images {
        run(
            "ctr",
            &[
                "--address",
                &socket.display().to_string(),
                "--namespace",
                "k8s.io",
                "images",
                "import",
                "--no-unpack=false",
                &image.display().to_string(),
            ],
            "containerd",
        )?;
    }

    Ok(())
}

/// The kubelet's configuration for node `i`.
fn kubelet_config_text(
    base: &Path,
    socket: &Path,
    cgroup: &str,
    address: &str,
    i: usize,
) -> String {
    let b = base.display();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: {cgroup}
containerRuntimeEndpoint: unix://{sock}
address: {address}
port: 10250
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization:
  mode: AlwaysAllow
podCIDR: {cidr}
failSwapOn: false
resolvConf: ""
podLogsDir: {b}/logs
localStorageCapacityIsolation: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
"#,
        sock = socket.display(),
        cidr = pod_cidr(i),
    )
}

fn start_proxy(w: &Wiring<'_>, name: &str) -> Result<Process, ControlPlaneError> {
    let config = w.dir.join("kube-proxy.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
             clientConnection:\n  kubeconfig: {}\nhostnameOverride: {name}\nbindAddress: 0.0.0.0\n\
             clusterCIDR: {CLUSTER_CIDR}\nmode: iptables\nhealthzBindAddress: \"\"\nmetricsBindAddress: \"\"\n\
             conntrack:\n  maxPerCore: 0\n  min: 0\n  tcpEstablishedTimeout: 0s\n  tcpCloseWaitTimeout: 0s\n",
            w.proxy_kubeconfig.display()
        ),
    )
    .map_err(|e| ControlPlaneError::io(&config, e))?;
    Process::spawn(
        "kube-proxy",
        &w.bin.path("kube-proxy"),
        &[format!("--config={}", config.display()), "--v=1".to_owned()],
        w.dir,
    )
}

async fn wait_socket(p: &mut Process, socket: &Path) -> Result<(), ControlPlaneError> {
    let begun = Instant::now();
    let limit = Duration::from_secs(30);
    loop {
        p.check_running()?;
        if socket.exists() {
            return Ok(());
        }
        if begun.elapsed() > limit {
            return Err(ControlPlaneError::NotReady {
                what: format!("{} serving {}", p.name, socket.display()),
                after: limit,
                log: crate::process::tail(&p.log, 20),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The cgroup v1 hierarchies (with the hybrid layout's `unified`, where
/// runc makes its cgroups too), or the v2 root, this machine mounts.
fn hierarchies() -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_owned()];
    }
    std::fs::read_dir(root)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_dir() && !p.is_symlink())
                .collect()
        })
        .unwrap_or_default()
}

/// Makes the node's cgroup root in every hierarchy (the kubelet refuses a
/// root that does not exist); cpuset's needs its parent's CPUs and memory
/// nodes before anything can join it.
fn make_cgroups(cgroup: &str) -> Result<(), ControlPlaneError> {
    for h in hierarchies() {
        let d = h.join(cgroup.trim_start_matches('/'));
        std::fs::create_dir_all(&d).map_err(|e| ControlPlaneError::io(&d, e))?;
        for f in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(v) = std::fs::read_to_string(h.join(f)) {
                let _ = std::fs::write(d.join(f), v.trim());
            }
        }
    }
    Ok(())
}

/// Every cgroup folder under `cgroup`, deepest first.
fn cgroup_tree(cgroup: &str) -> Vec<PathBuf> {
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(entries) = std::fs::read_dir(d) {
            for e in entries.filter_map(Result::ok) {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
        out.push(d.to_owned());
    }
    let mut out = Vec::new();
    for h in hierarchies() {
        walk(&h.join(cgroup.trim_start_matches('/')), &mut out);
    }
    out
}

fn kill_cgroup_processes(cgroup: &str) {
    for d in cgroup_tree(cgroup) {
        let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // SAFETY: kill(2) on a process of the node's own cgroup.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

fn remove_cgroups(cgroup: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for d in cgroup_tree(cgroup) {
        // A cgroup goes once its last process has; killed ones take a moment.
        while std::fs::remove_dir(&d).is_err() && d.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Kills the containerd shims serving `socket`'s containerd (they outlive
/// it by design).
fn kill_shims(socket: &Path) {
    let wanted = socket.as_os_str().as_encoded_bytes();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for p in procs.filter_map(Result::ok) {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        let shim = cmdline.split(|b| *b == 0).any(|a| a == wanted)
            && cmdline
                .windows(b"containerd-shim".len())
                .any(|w| w == b"containerd-shim");
        if shim {
            // SAFETY: kill(2) on a shim of this node's containerd.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Undoes every mount under `dir` (the pods' volumes, containerd's
/// snapshots and namespaces), deepest first.
fn unmount_under(dir: &Path) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for p in points {
        if let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) {
            // SAFETY: umount2(2) on a mount point under the test's folder.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}
