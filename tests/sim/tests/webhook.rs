//! ValidatingWebhookConfigurations: the simulated server calls the webhook
//! over HTTPS with an AdmissionReview and honours its answer and the
//! failurePolicy, as kubectl sees it.

use std::convert::Infallible;
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use nmo_sim::{SimCluster, SimOptions};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio_rustls::rustls::ServerConfig;

/// A webhook that refuses ConfigMaps whose `data.v` is "bad".
async fn webhook_server() -> (u16, String, tokio::task::JoinHandle<()>) {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("cert");
    let cert_pem = cert.cert.pem();
    let key_pem = cert.signing_key.serialize_pem();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
    let config = ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let review: Value = serde_json::from_slice(&body).unwrap();
                        let request = &review["request"];
                        let bad = request["object"]["data"]["v"] == "bad";
                        let mut response = json!({"uid": request["uid"], "allowed": !bad});
                        if bad {
                            response["status"] = json!({"code": 403, "reason": "Forbidden", "message": "v must not be bad"});
                        }
                        let answer = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response});
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(
                            serde_json::to_vec(&answer).unwrap(),
                        ))))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (
        port,
        base64::engine::general_purpose::STANDARD.encode(cert_pem),
        task,
    )
}

fn webhook_config(port: u16, ca: &str, policy: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "deny-bad"},
        "webhooks": [{
            "name": "deny-bad.example.com",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": policy,
            "timeoutSeconds": 2,
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/validate"), "caBundle": ca},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"], "scope": "*"}],
        }],
    })
}

/// A ConfigMap manifest on stdin: `kubectl create configmap` would send
/// protobuf, which the simulation does not speak.
fn cm_yaml(name: &str, v: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  v: {v}\n")
}

async fn kubectl(
    kubeconfig: &std::path::Path,
    cache: &std::path::Path,
    args: &[&str],
) -> (bool, String) {
    use tokio::io::AsyncWriteExt;
    let (args, stdin) = match args {
        ["create", "configmap", name, lit] => {
            let v = lit.strip_prefix("--from-literal=v=").expect("v literal");
            (vec!["create", "-f", "-"], Some(cm_yaml(name, v)))
        }
        _ => (args.to_vec(), None),
    };
    let mut child = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(cache)
        .args(&args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).await.unwrap();
    }
    drop(input);
    let out = child.wait_with_output().await.expect("kubectl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_called_and_obeyed() {
    let c = SimCluster::start(SimOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    let cache = dir.path().join("cache");
    c.write_kubeconfig(&kc).unwrap();
    let (port, ca, server) = webhook_server().await;
    c.create(webhook_config(port, &ca, "Fail")).unwrap();

    let (ok, out) = kubectl(
        &kc,
        &cache,
        &["create", "configmap", "good", "--from-literal=v=fine"],
    )
    .await;
    assert!(ok, "{out}");
    let (ok, out) = kubectl(
        &kc,
        &cache,
        &["create", "configmap", "evil", "--from-literal=v=bad"],
    )
    .await;
    assert!(!ok);
    assert!(
        out.contains(
            "admission webhook \"deny-bad.example.com\" denied the request: v must not be bad"
        ),
        "{out}"
    );
    let (ok, out) = kubectl(
        &kc,
        &cache,
        &[
            "patch",
            "configmap",
            "good",
            "--type=merge",
            "-p",
            r#"{"data":{"v":"bad"}}"#,
        ],
    )
    .await;
    assert!(!ok, "an update is checked too: {out}");
    assert!(out.contains("v must not be bad"), "{out}");
    let (_, v) = kubectl(
        &kc,
        &cache,
        &["get", "configmap", "good", "-o", "jsonpath={.data.v}"],
    )
    .await;
    assert_eq!(v, "fine", "nothing was written");

    // Unreachable webhook: Fail refuses, Ignore lets the request through.
    server.abort();
    let _ = server.await;
    let (ok, out) = kubectl(
        &kc,
        &cache,
        &["create", "configmap", "while-down", "--from-literal=v=x"],
    )
    .await;
    assert!(!ok);
    assert!(
        out.contains("failed calling webhook \"deny-bad.example.com\""),
        "{out}"
    );
    let (ok, _) = kubectl(
        &kc,
        &cache,
        &["delete", "validatingwebhookconfiguration", "deny-bad"],
    )
    .await;
    assert!(ok);
    c.create(webhook_config(port, &ca, "Ignore")).unwrap();
    let (ok, out) = kubectl(
        &kc,
        &cache,
        &["create", "configmap", "while-down", "--from-literal=v=x"],
    )
    .await;
    assert!(ok, "failurePolicy Ignore: {out}");
    c.stop().await;
}

#[tokio::test]
async fn a_webhook_with_an_untrusted_certificate_is_refused() {
    let c = SimCluster::start(SimOptions::default()).await.unwrap();
    let (port, _ca, _server) = webhook_server().await;
    let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    let wrong_ca = base64::engine::general_purpose::STANDARD.encode(other.cert.pem());
    c.create(webhook_config(port, &wrong_ca, "Fail")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    c.write_kubeconfig(&kc).unwrap();
    let (ok, out) = kubectl(
        &kc,
        &dir.path().join("cache"),
        &["create", "configmap", "x", "--from-literal=v=ok"],
    )
    .await;
    assert!(!ok);
    assert!(
        out.contains("failed calling webhook") && out.contains("tls"),
        "{out}"
    );
    c.stop().await;
}
