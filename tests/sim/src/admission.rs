//! Validating admission webhooks: on a matching create or update the server
//! sends an `admission.k8s.io/v1` AdmissionReview over HTTPS (trusting only
//! the configuration's caBundle) and refuses the request when the webhook
//! says no, or when it cannot be reached and `failurePolicy` is `Fail`.
//!
//! Webhooks are called with `clientConfig.url`. A `clientConfig.service`
//! has no cluster network to resolve in here; it is called at
//! `https://127.0.0.1:<port><path>` (the operator under test listens on
//! loopback), which is what a port-forward would give.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use crate::error::ApiError;
use crate::resources::ResourceType;
use crate::selectors::LabelSelector;
use crate::state::Sim;

/// A request to admit.
pub struct Attempt<'a> {
    pub rt: &'a ResourceType,
    pub operation: &'static str,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    pub object: &'a Value,
    pub old_object: Option<&'a Value>,
    pub dry_run: bool,
    /// Who asks, as the review's `userInfo` tells the webhook.
    pub user: &'a crate::auth::User,
}

fn rule_matches(rule: &Value, a: &Attempt<'_>) -> bool {
    let any = |field: &str, want: &str| {
        rule[field]
            .as_array()
            .is_some_and(|vs| vs.iter().any(|v| v == "*" || v == want))
    };
    let scope_ok = match rule["scope"].as_str() {
        Some("Cluster") => !a.rt.namespaced,
        Some("Namespaced") => a.rt.namespaced,
        _ => true,
    };
    any("operations", a.operation)
        && any("apiGroups", &a.rt.group)
        && any("apiVersions", &a.rt.version)
        && any("resources", &a.rt.plural)
        && scope_ok
}

/// Whether any validating webhook is registered (admission is skipped
/// entirely otherwise).
pub fn has_webhooks(sim: &Sim) -> bool {
    sim.store()
        .count("validatingwebhookconfigurations.admissionregistration.k8s.io")
        > 0
}

/// Runs every matching validating webhook. `Ok` means admitted.
pub async fn validate(sim: &Arc<Sim>, a: &Attempt<'_>) -> Result<(), ApiError> {
    let configs = sim.store().list(
        "validatingwebhookconfigurations.admissionregistration.k8s.io",
        None,
    );
    for config in configs {
        for hook in config["webhooks"].as_array().into_iter().flatten() {
            if !hook["rules"]
                .as_array()
                .is_some_and(|rs| rs.iter().any(|r| rule_matches(r, a)))
            {
                continue;
            }
            if !hook["objectSelector"].is_null() {
                let sel = LabelSelector::from_object(&hook["objectSelector"]).unwrap_or_default();
                if !sel.is_empty() && !sel.matches(&a.object["metadata"]["labels"]) {
                    continue;
                }
            }
            let name = hook["name"].as_str().unwrap_or("webhook");
            let fail_closed = hook["failurePolicy"].as_str() != Some("Ignore");
            match call(hook, a).await {
                Ok(response) => {
                    if response["allowed"].as_bool() == Some(true) {
                        continue;
                    }
                    return Err(denied(name, &response["status"]));
                }
                Err(e) if fail_closed => {
                    return Err(ApiError::internal(format!(
                        "failed calling webhook \"{name}\": {e}"
                    )));
                }
                Err(e) => {
                    tracing::warn!(webhook = name, error = %e, "webhook failed; failurePolicy Ignore");
                }
            }
        }
    }
    Ok(())
}

/// The API error for a denial, as the real server builds it.
fn denied(webhook: &str, status: &Value) -> ApiError {
    let code = status["code"].as_u64().unwrap_or(0).max(400) as u16;
    let by = format!("admission webhook \"{webhook}\" denied the request");
    let message = match (status["message"].as_str(), status["reason"].as_str()) {
        (Some(m), _) if !m.is_empty() => format!("{by}: {m}"),
        (_, Some(r)) if !r.is_empty() => format!("{by}: {r}"),
        _ => format!("{by} without explanation"),
    };
    let reason = match code {
        400 => "BadRequest",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        422 => "Invalid",
        _ => "BadRequest",
    };
    ApiError {
        code,
        reason,
        message,
        details: None,
        retry_after: None,
    }
}

fn url_of(hook: &Value) -> Result<String, String> {
    let cc = &hook["clientConfig"];
    if let Some(u) = cc["url"].as_str() {
        return Ok(u.to_owned());
    }
    if cc["service"].is_object() {
        let port = cc["service"]["port"].as_u64().unwrap_or(443);
        let path = cc["service"]["path"].as_str().unwrap_or("/");
        return Ok(format!("https://127.0.0.1:{port}{path}"));
    }
    Err("webhook has neither clientConfig.url nor clientConfig.service".into())
}

async fn call(hook: &Value, a: &Attempt<'_>) -> Result<Value, String> {
    let url = url_of(hook)?;
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| format!("webhook URL {url:?} must use https"))?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_matches(['[', ']']),
            p.parse::<u16>().map_err(|e| e.to_string())?,
        ),
        None => (authority, 443),
    };
    let timeout = Duration::from_secs(hook["timeoutSeconds"].as_u64().unwrap_or(10));

    let mut roots = RootCertStore::empty();
    let ca = hook["clientConfig"]["caBundle"]
        .as_str()
        .unwrap_or_default();
    let pem = base64::engine::general_purpose::STANDARD
        .decode(ca)
        .map_err(|e| format!("caBundle is not base64: {e}"))?;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        roots
            .add(cert.map_err(|e| format!("caBundle: {e}"))?)
            .map_err(|e| format!("caBundle: {e}"))?;
    }
    if roots.is_empty() {
        return Err("no caBundle to verify the webhook's certificate".into());
    }
    let tls = ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let server_name = ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;

    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uuid::Uuid::new_v4().to_string(),
            "kind": {"group": a.rt.group, "version": a.rt.version, "kind": a.rt.kind},
            "resource": {"group": a.rt.group, "version": a.rt.version, "resource": a.rt.plural},
            "requestKind": {"group": a.rt.group, "version": a.rt.version, "kind": a.rt.kind},
            "requestResource": {"group": a.rt.group, "version": a.rt.version, "resource": a.rt.plural},
            "name": a.name,
            "namespace": a.namespace.unwrap_or_default(),
            "operation": a.operation,
            "userInfo": {"username": a.user.name, "groups": a.user.groups},
            "object": a.object,
            "oldObject": a.old_object,
            "dryRun": a.dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": if a.operation == "CREATE" { "CreateOptions" } else { "UpdateOptions" }},
        },
    });
    let uid = review["request"]["uid"].clone();
    let body = serde_json::to_vec(&review).map_err(|e| e.to_string())?;

    let exchange = async {
        let tcp = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| format!("failed to call webhook: Post \"{url}\": {e}"))?;
        let stream = TlsConnector::from(Arc::new(tls))
            .connect(server_name, tcp)
            .await
            .map_err(|e| format!("failed to call webhook: Post \"{url}\": tls: {e}"))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = hyper::Request::post(path)
            .header("Host", authority)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !status.is_success() {
            return Err(format!(
                "webhook answered {status}: {}",
                String::from_utf8_lossy(&bytes)
            ));
        }
        serde_json::from_slice::<Value>(&bytes)
            .map_err(|e| format!("webhook answer is not an AdmissionReview: {e}"))
    };
    let answer = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| {
            format!("failed to call webhook: Post \"{url}\": context deadline exceeded")
        })??;
    let response = answer["response"].clone();
    if response.is_null() {
        return Err("webhook response was absent".into());
    }
    if response["uid"] != uid {
        return Err(format!(
            "expected response.uid={uid}, got {}",
            response["uid"]
        ));
    }
    Ok(response)
}
