//! The operator's HTTP servers under idle and hostile connections: a
//! thousand idle connections neither block the probes nor stay open, and a
//! client that never finishes its TLS handshake is let go. One file, one
//! process: the memory figures are this test's.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use nmo::server::{self, ConnLimits};
use tokio::io::AsyncReadExt;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

async fn healthz(addr: std::net::SocketAddr) -> (u16, Duration) {
    let started = Instant::now();
    let code = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out.split_whitespace().nth(1).unwrap().parse().unwrap()
    })
    .await
    .unwrap();
    (code, started.elapsed())
}

/// Waits until every connection has been closed by the server (a read
/// gives end of file); returns how long that took.
async fn all_closed(conns: Vec<tokio::net::TcpStream>, limit: Duration) -> Duration {
    let started = Instant::now();
    let waits = conns.into_iter().map(|mut c| async move {
        let mut buf = [0u8; 64];
        matches!(
            tokio::time::timeout(limit, c.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    });
    let closed = futures::future::join_all(waits).await;
    let open = closed.iter().filter(|c| !**c).count();
    assert_eq!(
        open, 0,
        "{open} idle connection(s) still open after {limit:?}"
    );
    started.elapsed()
}

async fn idle_connections(addr: std::net::SocketAddr, n: usize) -> Vec<tokio::net::TcpStream> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    conns
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_neither_block_the_probes_nor_stay_open() {
    let limits = ConnLimits {
        header_read_timeout: Duration::from_secs(1),
        handshake_timeout: Duration::from_secs(1),
        ..ConnLimits::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server::serve_with(
        listener,
        server::probes(Vec::new()),
        limits.clone(),
    ));
    assert_eq!(healthz(addr).await.0, 200);
    let before = rss_kib();

    let conns = idle_connections(addr, 1000).await;
    let (code, took) = healthz(addr).await;
    assert_eq!(code, 200, "the probe answers beside 1,000 idle connections");
    assert!(took < Duration::from_secs(1), "probe took {took:?}");
    let during = rss_kib();
    let closed_in = all_closed(conns, Duration::from_secs(10)).await;
    assert_eq!(healthz(addr).await.0, 200);
    println!(
        "1,000 idle connections: probe answered in {took:?}; RSS {} -> {} KiB; all closed by the server within {closed_in:?}",
        before, during
    );
    assert!(
        during < before + 64 * 1024,
        "RSS grew from {before} to {during} KiB"
    );

    // The webhook: connections that never start their TLS handshake.
    let (certs, _) = {
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tls.crt"), cert.cert.pem()).unwrap();
        std::fs::write(dir.path().join("tls.key"), cert.signing_key.serialize_pem()).unwrap();
        (dir, ())
    };
    let (_cluster, client) = common::start_cluster(1).await;
    let validator = nmo::webhook::Validator::new(client).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = listener.local_addr().unwrap();
    let dir = certs.path().to_owned();
    tokio::spawn(async move {
        nmo::webhook::serve_with(listener, &dir, validator, limits)
            .await
            .unwrap()
    });
    let conns = idle_connections(hook, 300).await;
    let closed_in = all_closed(conns, Duration::from_secs(10)).await;
    println!("300 connections that never sent a TLS handshake: closed within {closed_in:?}");
}

/// One HTTPS request to the metrics server, trusting `ca_pem`; returns the
/// status code and the ALPN protocol the server chose.
async fn https_get(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    token: Option<&str>,
) -> (u16, Option<Vec<u8>>, String) {
    use rustls_pki_types::pem::PemObject;
    use tokio::io::AsyncWriteExt;
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    tls.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    tls.read_to_end(&mut out).await.unwrap();
    let out = String::from_utf8_lossy(&out).into_owned();
    let code = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, alpn, out)
}

/// `--metrics-secure`: HTTPS with HTTP/2 off; a request without a token or
/// with one the cluster does not know is 401, a ServiceAccount without the
/// metrics-reader role is 403, one bound to it gets the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secure_metrics_serve_only_clients_the_cluster_authorizes() {
    let (cluster, client) = common::start_cluster(1).await;
    for (kind, obj) in [
        (
            "sa",
            serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "prometheus", "namespace": "default"}}),
        ),
        (
            "sa",
            serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "stranger", "namespace": "default"}}),
        ),
        (
            "role",
            serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "metrics-reader"},
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}),
        ),
        (
            "binding",
            serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "prometheus-metrics-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "metrics-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "default"}]}),
        ),
    ] {
        cluster
            .create(obj)
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
    }
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), cert.cert.pem()).unwrap();
    std::fs::write(dir.path().join("tls.key"), cert.signing_key.serialize_pem()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cert_dir = dir.path().to_owned();
    tokio::spawn(async move {
        nmo::secure_metrics::serve(
            listener,
            server::metrics(common::metrics().registry, std::sync::Arc::new(|| {})),
            client,
            Some(&cert_dir),
            ConnLimits::default(),
        )
        .await
        .unwrap()
    });
    let ca = cert.cert.pem();
    let (code, alpn, _) = https_get(addr, &ca, None).await;
    assert_eq!(code, 401, "no token");
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]), "HTTP/2 is off");
    assert_eq!(
        https_get(addr, &ca, Some("made-up")).await.0,
        401,
        "unknown token"
    );
    assert_eq!(
        https_get(addr, &ca, Some("serviceaccount:default:stranger"))
            .await
            .0,
        403,
        "authenticated, not authorized"
    );
    let (code, _, body) = https_get(addr, &ca, Some("serviceaccount:default:prometheus")).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("# TYPE "), "Prometheus text: {body}");
    // The answers are kept as controller-runtime keeps them: scraped
    // again and again, refused again and again, the cluster is asked
    // once per token and access within their times.
    cluster.record_audit(true);
    for _ in 0..5 {
        assert_eq!(
            https_get(addr, &ca, Some("serviceaccount:default:prometheus"))
                .await
                .0,
            200
        );
        assert_eq!(https_get(addr, &ca, Some("made-up")).await.0, 401);
        assert_eq!(
            https_get(addr, &ca, Some("serviceaccount:default:stranger"))
                .await
                .0,
            403
        );
    }
    assert_eq!(
        https_get(addr, &ca, Some("made-up-too")).await.0,
        401,
        "another unknown token"
    );
    let reviews = |resource: &str| {
        cluster
            .audit()
            .iter()
            .filter(|r| r.verb == "create" && r.resource == resource)
            .count()
    };
    assert_eq!(
        (reviews("tokenreviews"), reviews("subjectaccessreviews")),
        (1, 0),
        "only the token not seen before is reviewed"
    );
    cluster.stop().await;
}

/// A TLS connection to `addr` trusting the certificate in `ca_pem`.
async fn tls_connect(
    addr: std::net::SocketAddr,
    ca_pem: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls_pki_types::pem::PemObject;
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    connector.connect(name, tcp).await
}

/// The real `nmo` binary against `kubeconfig`: probes on `probe`, no
/// metrics, no compiled-policy cache, `args` added; killed on drop.
fn spawn_operator(
    kubeconfig: &std::path::Path,
    probe: u16,
    args: &[String],
) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args([
            "--metrics-bind-address=0".to_owned(),
            format!("--health-probe-bind-address=127.0.0.1:{probe}"),
            "--policy-cache-dir=".to_owned(),
            "--zap-log-level=error".to_owned(),
        ])
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HOSTNAME", "nmo-servers")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// A simulated cluster, a scratch folder with its kubeconfig, and a
/// webhook certificate (its folder, and its PEM as the CA to trust).
async fn webhook_fixture() -> (
    nmo_sim::SimCluster,
    tempfile::TempDir,
    std::path::PathBuf,
    tempfile::TempDir,
    String,
) {
    let (cluster, _client) = common::start_cluster(1).await;
    let work = tempfile::tempdir().unwrap();
    let kubeconfig = work.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig).unwrap();
    let (certs, _) = common::webhook_cert();
    let ca = std::fs::read_to_string(certs.path().join("tls.crt")).unwrap();
    (cluster, work, kubeconfig, certs, ca)
}

/// Peak and current resident memory of a process, in MiB.
fn memory_mib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap()
            / 1024
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// The attack that once took the operator from 62 to 738 MiB: 220
/// connections to the webhook, each sending a 3 MiB body slowly. Bodies
/// are now read within a deadline and against one budget for the whole
/// server: the operator's peak memory stays well inside the Deployment's
/// 512 Mi, the attackers are answered (503, 408) or cut off, and a
/// genuine review sent during the attack is answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_large_bodies_cannot_grow_the_webhook_past_its_limit() {
    use tokio::io::AsyncWriteExt;
    const CONNECTIONS: usize = 220;
    const BODY: usize = 3 << 20;
    let (cluster, work, kubeconfig, certs, ca) = webhook_fixture().await;
    let (probe, hook) = (common::free_port(), common::free_port());
    let mut operator = spawn_operator(
        &kubeconfig,
        probe,
        &[
            format!("--webhook-bind-address=127.0.0.1:{hook}"),
            format!("--webhook-cert-dir={}", certs.path().display()),
            format!("--policy-dir={}", work.path().join("none").display()),
        ],
    );
    let pid = operator.id().unwrap();
    common::wait_until("the operator ready", Duration::from_secs(60), || {
        common::ready_on(probe)
    })
    .await;
    let (before, _) = memory_mib(pid);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{hook}").parse().unwrap();

    let attackers = (0..CONNECTIONS).map(|_| {
        let ca = ca.clone();
        tokio::spawn(async move {
            let Ok(mut tls) = tls_connect(addr, &ca).await else {
                return;
            };
            let head = format!(
                "POST {} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {BODY}\r\n\r\n",
                nmo::webhook::PATH
            );
            if tls.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let chunk = vec![b' '; 64 << 10];
            for _ in 0..BODY / chunk.len() {
                if tls.write_all(&chunk).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            tokio::time::sleep(Duration::from_secs(30)).await;
        })
    });
    let attack: Vec<_> = attackers.collect();
    // One that stalls after a few bytes is answered 408 at the body
    // deadline (10 s, the API server's own default webhook timeout).
    let stalled = {
        let ca = ca.clone();
        tokio::spawn(async move {
            let mut tls = tls_connect(addr, &ca).await.unwrap();
            let head = format!(
                "POST {} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{{\"apiVersion\"",
                nmo::webhook::PATH
            );
            tls.write_all(head.as_bytes()).await.unwrap();
            let started = Instant::now();
            let mut out = vec![0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(20), tls.read(&mut out))
                .await
                .expect("a stalled body is answered within its deadline")
                .unwrap();
            (
                String::from_utf8_lossy(&out[..n]).into_owned(),
                started.elapsed(),
            )
        })
    };
    // Mid-attack, an ordinary review is answered.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": "CREATE",
            "kind": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "kind": "NodeMaintenance"},
            "resource": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "resource": "nodemaintenances"},
            "userInfo": {"username": "admin", "groups": ["system:masters"]},
            "object": {"apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
                "metadata": {"name": "genuine"}, "spec": {"nodeName": "worker-1", "reason": "r"}}}
    })
    .to_string();
    let started = Instant::now();
    let mut tls = tls_connect(addr, &ca).await.unwrap();
    tls.write_all(
        format!(
            "POST {} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{review}",
            nmo::webhook::PATH,
            review.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut out))
        .await
        .expect("the genuine review is answered during the attack")
        .unwrap();
    let answer = String::from_utf8_lossy(&out);
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("\"allowed\":true"),
        "{answer}"
    );
    let genuine = started.elapsed();
    let (stalled, stalled_for) = stalled.await.unwrap();
    assert!(stalled.starts_with("HTTP/1.1 408"), "{stalled}");
    let (peak, during) = memory_mib(pid);
    for a in attack {
        a.abort();
    }
    println!(
        "{CONNECTIONS} connections x {} MiB slow bodies: operator peak {peak} MiB (from {before} MiB, {during} MiB at the end), a genuine review answered in {genuine:?}, a stalled body answered 408 after {stalled_for:?}",
        BODY >> 20
    );
    assert!(peak < 256, "peak {peak} MiB: bodies are not bounded");
    operator.kill().await.unwrap();
    cluster.stop().await;
}

/// GET `path` on the probe server; `None` while nothing answers.
async fn probe(port: u16, path: &str) -> Option<(u16, String)> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let code = out.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, out))
    })
    .await
    .unwrap()
}

/// With many policies to compile, the probe server answers from the start:
/// `/healthz` is 200 at once (the liveness probe never restarts a pod that
/// is compiling), `/readyz` says it is compiling the policies, and the
/// policies are compiled in parallel (four at a time at most).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probes_answer_while_many_policies_compile() {
    const POLICIES: usize = 24;
    let (cluster, _client) = common::start_cluster(1).await;
    let work = tempfile::tempdir().unwrap();
    let kubeconfig = work.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig).unwrap();
    let dir = work.path().join("policies");
    std::fs::create_dir(&dir).unwrap();
    let wasm = common::built_policy("never_force");
    for i in 0..POLICIES {
        std::fs::write(dir.join(format!("p{i}.wasm")), &wasm).unwrap();
    }
    let port = common::free_port();
    let started = Instant::now();
    let mut operator = spawn_operator(
        &kubeconfig,
        port,
        &[
            "--webhook-bind-address=0".to_owned(),
            format!("--policy-dir={}", dir.display()),
        ],
    );
    let mut alive_after = None;
    let mut said = String::new();
    while alive_after.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no probe answered"
        );
        if let Some((200, _)) = probe(port, "/healthz").await {
            alive_after = Some(started.elapsed());
            said = probe(port, "/readyz?verbose").await.unwrap().1;
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    common::wait_until("ready", Duration::from_secs(300), || async {
        matches!(probe(port, "/readyz").await, Some((200, _)))
    })
    .await;
    let ready_after = started.elapsed();
    println!(
        "{POLICIES} policies to compile: /healthz answered after {:?}, ready after {ready_after:?}",
        alive_after.unwrap()
    );
    assert!(
        said.contains("compiling and self-checking the policies"),
        "readiness during start-up: {said}"
    );
    operator.kill().await.unwrap();
    cluster.stop().await;
}

/// As a pod, the webhook's certificate usually arrives after the operator
/// started: cert-manager issues the Secret the Deployment mounts
/// (optional), and the kubelet fills the folder a minute later. The
/// operator used to switch the webhook off for good when the folder was
/// empty at start, so every admission through the Service was refused
/// (found running `deploy/default` on a real node). It now starts the
/// webhook when the certificate appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_starts_when_its_certificate_arrives_after_the_operator() {
    let (cluster, work, kubeconfig, certs, ca) = webhook_fixture().await;
    let mounted = work.path().join("serving-certs");
    std::fs::create_dir(&mounted).unwrap();
    let (probe, hook) = (common::free_port(), common::free_port());
    let mut operator = spawn_operator(
        &kubeconfig,
        probe,
        &[
            format!("--webhook-bind-address=127.0.0.1:{hook}"),
            format!("--webhook-cert-dir={}", mounted.display()),
            format!("--policy-dir={}", work.path().join("none").display()),
        ],
    );
    common::wait_until("the operator ready", Duration::from_secs(60), || {
        common::ready_on(probe)
    })
    .await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{hook}").parse().unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "nothing answers on the webhook's port without a certificate"
    );
    for f in ["tls.crt", "tls.key"] {
        std::fs::copy(certs.path().join(f), mounted.join(f)).unwrap();
    }
    common::wait_until(
        "the webhook serving its certificate",
        Duration::from_secs(30),
        || {
            let ca = ca.clone();
            async move { tls_connect(addr, &ca).await.is_ok() }
        },
    )
    .await;
    operator.kill().await.unwrap();
    cluster.stop().await;
}
