//! Protected metrics (`--metrics-secure`), as controller-runtime's
//! `WithAuthenticationAndAuthorization`: `/metrics` over HTTPS (HTTP/1.1
//! only), served only to a client whose bearer token the cluster
//! authenticates (a TokenReview) and whose user the cluster authorizes to
//! `get` the non-resource URL `/metrics` (a SubjectAccessReview, as the
//! `metrics-reader` ClusterRole grants). No token: 401; a token the cluster
//! does not know: 401; a user not allowed: 403.

use std::path::Path;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::net::TcpListener;

use crate::error::Result;
use crate::server::{ConnLimits, Handler};

/// Why a request was refused: the status and the body.
type Refusal = (StatusCode, &'static str);

/// Authenticates and authorizes one request with the cluster.
async fn authorize(client: &Client, req: &Request<Incoming>) -> std::result::Result<(), Refusal> {
    const UNAUTHORIZED: Refusal = (StatusCode::UNAUTHORIZED, "Unauthorized\n");
    let token = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or(UNAUTHORIZED)?;
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviewed = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| {
            tracing::warn!(logger = "metrics", error = %e, "TokenReview failed");
            UNAUTHORIZED
        })?;
    let status = reviewed.status.unwrap_or_default();
    if status.authenticated != Some(true) {
        return Err(UNAUTHORIZED);
    }
    let user = status.user.unwrap_or_default();
    let access = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            groups: user.groups.clone(),
            uid: user.uid.clone(),
            extra: user.extra.clone(),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(req.uri().path().to_owned()),
                verb: Some(req.method().as_str().to_lowercase()),
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let decided = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &access)
        .await
        .map_err(|e| {
            tracing::warn!(logger = "metrics", error = %e, "SubjectAccessReview failed");
            (StatusCode::FORBIDDEN, "Forbidden\n")
        })?;
    if decided.status.is_some_and(|s| s.allowed) {
        Ok(())
    } else {
        tracing::warn!(logger = "metrics", user = %user.username.unwrap_or_default(), "metrics request refused: the user may not get /metrics");
        Err((StatusCode::FORBIDDEN, "Forbidden\n"))
    }
}

/// Wraps `inner` so that only authorized clients reach it.
fn guarded(inner: Handler, client: Client) -> Handler {
    Arc::new(move |req: Request<Incoming>| {
        let inner = inner.clone();
        let client = client.clone();
        Box::pin(async move {
            match authorize(&client, &req).await {
                Ok(()) => inner(req).await,
                Err((code, body)) => crate::server::text(code, body),
            }
        })
    })
}

/// Serves `handler` (the metrics) over HTTPS to authorized clients only,
/// with the certificate in `cert_dir` (`tls.crt`, `tls.key`, re-read when
/// they change) or, without one, a self-signed certificate made at start.
pub async fn serve(
    listener: TcpListener,
    handler: Handler,
    client: Client,
    cert_dir: Option<&Path>,
    limits: ConnLimits,
) -> Result<()> {
    let resolver: Arc<dyn tokio_rustls::rustls::server::ResolvesServerCert> = match cert_dir {
        Some(dir) => Arc::new(crate::tls::ReloadingCert::new(dir)?),
        None => Arc::new(crate::tls::FixedCert(crate::tls::self_signed(vec![
            "localhost".into(),
            "127.0.0.1".into(),
        ])?)),
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(crate::tls::tls_config(resolver)?));
    crate::server::serve_tls(listener, acceptor, guarded(handler, client), limits).await;
    Ok(())
}
