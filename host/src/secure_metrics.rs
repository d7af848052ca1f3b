//! Protected metrics (`--metrics-secure`), as controller-runtime's
//! `WithAuthenticationAndAuthorization`: `/metrics` over HTTPS (HTTP/1.1
//! only), served only to a client whose bearer token the cluster
//! authenticates (a TokenReview) and whose user the cluster authorizes to
//! `get` the non-resource URL `/metrics` (a SubjectAccessReview, as the
//! `metrics-reader` ClusterRole grants). No token: 401; a token the cluster
//! does not know: 401; a user not allowed: 403. The answers are kept as
//! controller-runtime keeps them (a token's for a minute, an allowed
//! access for five, a refused one for thirty seconds).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

use crate::error::Result;
use crate::server::{ConnLimits, Handler};
use crate::sync::Locked;

/// Why a request was refused: the status and the body.
type Refusal = (StatusCode, &'static str);

const UNAUTHORIZED: Refusal = (StatusCode::UNAUTHORIZED, "Unauthorized\n");
const FORBIDDEN: Refusal = (StatusCode::FORBIDDEN, "Forbidden\n");

/// How long a token's review is trusted, either way (controller-runtime's
/// delegating authenticator: one minute).
pub(crate) const TOKEN_TTL: Duration = Duration::from_secs(60);
/// How long an access the cluster allowed is trusted (controller-runtime's
/// delegating authorizer: five minutes).
pub(crate) const ALLOW_TTL: Duration = Duration::from_secs(5 * 60);
/// How long an access the cluster refused is trusted (thirty seconds).
pub(crate) const DENY_TTL: Duration = Duration::from_secs(30);
/// Answers kept at most, per kind: past it (a flood of made-up tokens),
/// new answers are not kept, and the ones kept stay.
const KEPT: usize = 4096;

/// Answers the cluster gave lately, by the sha256 of what was asked (a
/// token is never kept as it is), each until its time runs out.
struct Answers<V> {
    kept: Mutex<HashMap<[u8; 32], (V, Instant)>>,
}

impl<V: Clone> Answers<V> {
    fn new() -> Self {
        Answers {
            kept: Mutex::new(HashMap::new()),
        }
    }

    fn key(asked: &[u8]) -> [u8; 32] {
        Sha256::digest(asked).into()
    }

    fn get(&self, asked: &[u8]) -> Option<V> {
        let kept = self.kept.locked();
        kept.get(&Self::key(asked))
            .filter(|(_, until)| Instant::now() < *until)
            .map(|(v, _)| v.clone())
    }

    fn keep(&self, asked: &[u8], answer: V, ttl: Duration) {
        let now = Instant::now();
        let mut kept = self.kept.locked();
        if kept.len() >= KEPT {
            kept.retain(|_, (_, until)| now < *until);
        }
        if kept.len() < KEPT {
            kept.insert(Self::key(asked), (answer, now + ttl));
        }
    }
}

/// Asks the cluster who a token is and what its user may do, keeping the
/// answers for a while as controller-runtime does, so a scraper costs a
/// TokenReview and a SubjectAccessReview a few times an hour, not at
/// every scrape.
struct Reviewer {
    client: Client,
    /// A token's user (`None`: the cluster does not know the token).
    tokens: Answers<Option<UserInfo>>,
    /// Whether an access (user, groups, path, verb) is allowed.
    access: Answers<bool>,
}

impl Reviewer {
    fn new(client: Client) -> Self {
        Reviewer {
            client,
            tokens: Answers::new(),
            access: Answers::new(),
        }
    }

    /// Authenticates and authorizes one request with the cluster.
    async fn authorize(&self, req: &Request<Incoming>) -> std::result::Result<(), Refusal> {
        let token = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(UNAUTHORIZED)?;
        let user = self.user(token).await?.ok_or(UNAUTHORIZED)?;
        let spec = SubjectAccessReviewSpec {
            user: user.username.clone(),
            groups: user.groups.clone(),
            uid: user.uid.clone(),
            extra: user.extra.clone(),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(req.uri().path().to_owned()),
                verb: Some(req.method().as_str().to_lowercase()),
            }),
            ..Default::default()
        };
        if self.allowed(spec).await? {
            Ok(())
        } else {
            tracing::warn!(user = %user.username.unwrap_or_default(), "metrics request refused: the user may not get /metrics");
            Err(FORBIDDEN)
        }
    }

    /// The token's user, from a kept answer or a TokenReview; an API error
    /// refuses the request and is not kept.
    async fn user(&self, token: &str) -> std::result::Result<Option<UserInfo>, Refusal> {
        if let Some(known) = self.tokens.get(token.as_bytes()) {
            return Ok(known);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                tracing::warn!(error = %crate::text::api_error(&e), "TokenReview failed");
                UNAUTHORIZED
            })?;
        let status = reviewed.status.unwrap_or_default();
        let user = (status.authenticated == Some(true)).then(|| status.user.unwrap_or_default());
        self.tokens.keep(token.as_bytes(), user.clone(), TOKEN_TTL);
        Ok(user)
    }

    /// Whether the access is allowed, from a kept answer or a
    /// SubjectAccessReview; an API error refuses and is not kept.
    async fn allowed(&self, spec: SubjectAccessReviewSpec) -> std::result::Result<bool, Refusal> {
        let asked = serde_json::to_vec(&spec).map_err(|_| FORBIDDEN)?;
        if let Some(known) = self.access.get(&asked) {
            return Ok(known);
        }
        let access = SubjectAccessReview {
            spec,
            ..Default::default()
        };
        let decided = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
            .map_err(|e| {
                tracing::warn!(error = %crate::text::api_error(&e), "SubjectAccessReview failed");
                FORBIDDEN
            })?;
        let allowed = decided.status.is_some_and(|s| s.allowed);
        let ttl = if allowed { ALLOW_TTL } else { DENY_TTL };
        self.access.keep(&asked, allowed, ttl);
        Ok(allowed)
    }
}

/// Wraps `inner` so that only authorized clients reach it.
fn guarded(inner: Handler, client: Client) -> Handler {
    let reviewer = Arc::new(Reviewer::new(client));
    Arc::new(move |req: Request<Incoming>| {
        let inner = inner.clone();
        let reviewer = reviewer.clone();
        Box::pin(async move {
            match reviewer.authorize(&req).await {
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
