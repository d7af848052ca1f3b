//! The plain-HTTP servers: probes (`/healthz`, `/readyz`) and Prometheus
//! metrics (`/metrics`), on hyper.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;

use crate::error::{Error, Result};
use crate::sync::Locked;

/// A readiness check: `Ok(detail)` when ready (the detail, if not empty,
/// is shown by `/readyz?verbose`), `Err(why)` when not.
pub type Check = Box<dyn Fn() -> std::result::Result<String, String> + Send + Sync>;

/// Readiness while the operator starts: the probe server answers from the
/// first moment (liveness: alive), and readiness names what it waits for
/// (the policies being compiled, the controller) until the real checks of
/// `probes::readiness_checks` take over.
#[derive(Default)]
pub struct Startup {
    checks: std::sync::OnceLock<Vec<(&'static str, Check)>>,
    waiting: std::sync::Mutex<String>,
}

impl Startup {
    /// Says what start-up waits for now.
    pub fn waiting_for(&self, what: impl Into<String>) {
        *self.waiting.locked() = what.into();
    }

    /// Start-up is over: the real checks answer from now on.
    pub fn started(&self, checks: Vec<(&'static str, Check)>) {
        let _ = self.checks.set(checks);
    }

    /// The probe server's checks, under the same names as the real ones.
    pub fn checks(self: &Arc<Self>) -> Vec<(&'static str, Check)> {
        ["informer-sync", "policy"]
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let startup = self.clone();
                let check: Check = Box::new(move || match startup.checks.get() {
                    Some(checks) => checks.get(i).map_or(Ok(String::new()), |(_, c)| c()),
                    None if i == 0 => Err("the controller has not started".into()),
                    None => Err(startup.waiting.locked().clone()),
                });
                (name, check)
            })
            .collect()
    }
}

/// Parses a Go-style bind address (`:8080`, `127.0.0.1:8080`); `0`
/// disables the server (controller-runtime's convention).
pub fn parse_bind(s: &str) -> Result<Option<SocketAddr>> {
    if s == "0" {
        return Ok(None);
    }
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_owned()
    };
    full.parse()
        .map(Some)
        .map_err(|e| Error::Config(format!("bad bind address {s:?}: {e}")))
}

/// A request handler.
pub(crate) type Handler = Arc<
    dyn Fn(Request<Incoming>) -> Pin<Box<dyn Future<Output = Response<Full<Bytes>>> + Send>>
        + Send
        + Sync,
>;

/// What every server of the operator (probes, metrics, webhook) holds a
/// client to, so that idle, slow or hostile connections can neither block
/// the probes nor grow memory without bound.
#[derive(Debug, Clone)]
pub struct ConnLimits {
    /// Connections served at once; more wait in the listen backlog until
    /// one closes.
    pub max_connections: usize,
    /// Time a client has to send a request's headers (from the
    /// connection's start, or from the previous response on a kept-alive
    /// connection): an idle connection is closed after this.
    pub header_read_timeout: std::time::Duration,
    /// Time a client has to finish the TLS handshake (the webhook).
    pub handshake_timeout: std::time::Duration,
    /// Time a client has to send a request's whole body, from its headers
    /// (the API server gives a webhook 10 s by default: a body slower than
    /// that has no one waiting for the answer).
    pub body_read_timeout: std::time::Duration,
    /// The largest body one request may have.
    pub max_body_bytes: usize,
    /// Body bytes all requests together may hold at once; a request whose
    /// body would go past it is answered 503 at once. With the per-body
    /// limit, the server's memory for bodies is bounded whatever the
    /// number of connections.
    pub max_buffered_body_bytes: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: 1024,
            header_read_timeout: std::time::Duration::from_secs(5),
            handshake_timeout: std::time::Duration::from_secs(10),
            body_read_timeout: std::time::Duration::from_secs(10),
            max_body_bytes: MAX_BODY,
            max_buffered_body_bytes: 32 << 20,
        }
    }
}

/// The largest request body a server reads by default (the webhook's:
/// the API server sends at most 3 MiB objects).
pub const MAX_BODY: usize = 3 << 20;

/// The part of each body that is not counted against the shared total:
/// a review of a NodeMaintenance is a few KiB, so ordinary requests are
/// never refused for others' bodies (and this much per connection is
/// bounded by the connection cap).
const UNCOUNTED: usize = 64 << 10;

/// The request bodies a server holds, against [`ConnLimits`]: shared by
/// every connection of one server.
#[derive(Clone)]
pub(crate) struct BodyBudget {
    bytes: Arc<tokio::sync::Semaphore>,
    per_body: usize,
    timeout: std::time::Duration,
}

/// Why a body was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("the body is over {0} bytes")]
    TooLarge(usize),
    #[error("too many request bodies in flight; try again")]
    Busy,
    #[error("the body did not arrive within {0:?}")]
    Timeout(std::time::Duration),
    #[error("reading the body: {0}")]
    Read(String),
}

impl BodyError {
    /// The HTTP status that answers it.
    pub fn status(&self) -> StatusCode {
        match self {
            BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::Busy => StatusCode::SERVICE_UNAVAILABLE,
            BodyError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            BodyError::Read(_) => StatusCode::BAD_REQUEST,
        }
    }
}

/// A body read within the budget; its share is given back when dropped.
pub(crate) struct HeldBody {
    pub bytes: Bytes,
    _held: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl BodyBudget {
    pub fn new(limits: &ConnLimits) -> Self {
        let total = limits
            .max_buffered_body_bytes
            .clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        BodyBudget {
            bytes: Arc::new(tokio::sync::Semaphore::new(total)),
            per_body: limits.max_body_bytes,
            timeout: limits.body_read_timeout,
        }
    }

    /// Reads `body` whole, within the deadline, the per-body limit and the
    /// server's total: each chunk is counted as it arrives, so a slow
    /// client holds only what it has sent, and for no longer than the
    /// deadline.
    pub async fn read(&self, body: Incoming) -> std::result::Result<HeldBody, BodyError> {
        tokio::time::timeout(self.timeout, self.read_all(body))
            .await
            .map_err(|_| BodyError::Timeout(self.timeout))?
    }

    async fn read_all(&self, mut body: Incoming) -> std::result::Result<HeldBody, BodyError> {
        use http_body_util::BodyExt;
        use hyper::body::Body;
        // A Content-Length over the limit is refused before a byte is
        // read: a client that waits for `100 Continue` sends nothing.
        if usize::try_from(body.size_hint().lower()).map_or(true, |n| n > self.per_body) {
            return Err(BodyError::TooLarge(self.per_body));
        }
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut len = 0usize;
        let mut held: Option<tokio::sync::OwnedSemaphorePermit> = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            len = len.saturating_add(data.len());
            if len > self.per_body {
                return Err(BodyError::TooLarge(self.per_body));
            }
            // Only what goes past the uncounted part is counted.
            let counted = len.saturating_sub(UNCOUNTED).min(data.len());
            if counted > 0 {
                let n = u32::try_from(counted).map_err(|_| BodyError::TooLarge(self.per_body))?;
                let permit = self
                    .bytes
                    .clone()
                    .try_acquire_many_owned(n)
                    .map_err(|_| BodyError::Busy)?;
                match held.as_mut() {
                    Some(h) => h.merge(permit),
                    None => held = Some(permit),
                }
            }
            chunks.push(data);
        }
        let bytes = match chunks.len() {
            0 => Bytes::new(),
            1 => chunks.pop().unwrap_or_default(),
            _ => Bytes::from(chunks.concat()),
        };
        Ok(HeldBody { bytes, _held: held })
    }
}

/// Accepts connections on `listener` while fewer than the cap are open,
/// handing each to `conn`. An accept error (out of file descriptors, say)
/// backs off, doubling from 10 ms to 1 s, instead of spinning.
pub(crate) async fn accept_loop<F, Fut>(listener: TcpListener, limits: &ConnLimits, conn: F)
where
    F: Fn(tokio::net::TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let mut backoff = std::time::Duration::from_millis(10);
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, _)) => {
                backoff = std::time::Duration::from_millis(10);
                let work = conn(stream);
                // In the server's span: its lines name the server.
                use tracing::Instrument;
                tokio::spawn(
                    async move {
                        work.await;
                        drop(permit);
                    }
                    .instrument(tracing::Span::current()),
                );
            }
            Err(e) => {
                tracing::debug!(error = %e, wait = %crate::text::duration(backoff), "accept failed; backing off");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(1));
            }
        }
    }
}

/// Serves one HTTP/1 connection under the limits' header timeout.
pub async fn serve_connection<I, S>(io: I, service: S, limits: &ConnLimits)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<
            Request<Incoming>,
            Response = Response<Full<Bytes>>,
            Error = Infallible,
        > + Send,
    S::Future: Send,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // Room for a request's headers, not more: a body is read by the
        // handler, against its budget.
        .max_buf_size(64 << 10);
    let _ = builder
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .await;
}

/// Serves HTTP/1 on `listener` with `handler` until the task is dropped,
/// under the default [`ConnLimits`].
pub async fn serve(listener: TcpListener, handler: Handler) {
    serve_with(listener, handler, ConnLimits::default()).await
}

/// [`serve`] under given limits.
pub async fn serve_with(listener: TcpListener, handler: Handler, limits: ConnLimits) {
    let conn_limits = limits.clone();
    accept_loop(listener, &limits, move |stream| {
        let handler = handler.clone();
        let limits = conn_limits.clone();
        async move {
            let service = hyper::service::service_fn(move |req| {
                let handler = handler.clone();
                async move { Ok::<_, Infallible>(handler(req).await) }
            });
            serve_connection(stream, service, &limits).await;
        }
    })
    .await
}

/// Serves `handler` over TLS (`acceptor`) on `listener` until dropped,
/// under `limits` (handshake and header timeouts, a connection cap).
pub(crate) async fn serve_tls(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    handler: Handler,
    limits: ConnLimits,
) {
    let conn_limits = limits.clone();
    accept_loop(listener, &limits, move |tcp| {
        let acceptor = acceptor.clone();
        let handler = handler.clone();
        let limits = conn_limits.clone();
        async move {
            let Ok(Ok(tls)) =
                tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await
            else {
                return;
            };
            let service = hyper::service::service_fn(move |req| {
                let handler = handler.clone();
                async move { Ok::<_, Infallible>(handler(req).await) }
            });
            serve_connection(tls, service, &limits).await;
        }
    })
    .await
}

/// A plain-text response.
pub fn text(code: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("Content-Type", "text/plain; charset=utf-8")
        .body(Full::new(body.into()))
        .expect("valid response")
}

/// `/healthz` (the process and its runtime answer) and `/readyz` (every
/// check passes; `?verbose` lists them as Kubernetes does).
pub fn probes(checks: Vec<(&'static str, Check)>) -> Handler {
    let checks = Arc::new(checks);
    Arc::new(move |req: Request<Incoming>| {
        let checks = checks.clone();
        Box::pin(async move {
            let verbose = req.uri().query().is_some_and(|q| {
                q.split('&')
                    .any(|p| p == "verbose" || p.starts_with("verbose="))
            });
            match req.uri().path() {
                "/healthz" | "/livez" => text(StatusCode::OK, "ok"),
                "/readyz" => {
                    let mut lines = Vec::new();
                    let mut ok = true;
                    for (name, check) in checks.iter() {
                        match check() {
                            Ok(detail) if detail.is_empty() => lines.push(format!("[+]{name} ok")),
                            Ok(detail) => lines.push(format!("[+]{name} ok: {detail}")),
                            Err(why) => {
                                ok = false;
                                lines.push(format!("[-]{name} failed: {why}"));
                            }
                        }
                    }
                    if ok && !verbose {
                        return text(StatusCode::OK, "ok");
                    }
                    lines.push(if ok {
                        "readyz check passed".into()
                    } else {
                        "readyz check failed".into()
                    });
                    let code = if ok {
                        StatusCode::OK
                    } else {
                        StatusCode::INTERNAL_SERVER_ERROR
                    };
                    text(code, lines.join("\n") + "\n")
                }
                _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
            }
        })
    })
}

/// `/metrics`: `registry` in the text format, calling `refresh` first so
/// gauges read from caches are current.
pub fn metrics(registry: prometheus::Registry, refresh: Arc<dyn Fn() + Send + Sync>) -> Handler {
    Arc::new(move |req: Request<Incoming>| {
        let refresh = refresh.clone();
        let registry = registry.clone();
        Box::pin(async move {
            if req.uri().path() != "/metrics" {
                return text(StatusCode::NOT_FOUND, "404 page not found\n");
            }
            refresh();
            match crate::metrics::render(&registry) {
                Ok(body) => Response::builder()
                    .status(StatusCode::OK)
                    .header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                    .body(Full::new(Bytes::from(body)))
                    .expect("valid response"),
                Err(e) => {
                    tracing::error!(error = %e, "rendering the metrics");
                    text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n"))
                }
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A handler that reads the body within `budget` and answers its
    /// length, or the reading's error.
    fn reading(budget: BodyBudget) -> Handler {
        Arc::new(move |req: Request<Incoming>| {
            let budget = budget.clone();
            Box::pin(async move {
                match budget.read(req.into_body()).await {
                    Ok(body) => text(StatusCode::OK, body.bytes.len().to_string()),
                    Err(e) => text(e.status(), e.to_string()),
                }
            })
        })
    }

    /// A client that announces a body over the limit and waits for
    /// `100 Continue` (as curl does for large bodies) is answered 413 at
    /// once, without sending a byte of it; a body within the limit is read.
    #[tokio::test]
    async fn an_announced_body_over_the_limit_is_refused_before_it_is_sent() {
        let limits = ConnLimits {
            max_body_bytes: 1000,
            ..ConnLimits::default()
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handler = reading(BodyBudget::new(&limits));
        tokio::spawn(serve_with(listener, handler, limits));
        let ask = |head: String, body: &'static [u8]| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(head.as_bytes()).await.unwrap();
            s.write_all(body).await.unwrap();
            let mut answer = vec![0u8; 512];
            let n = tokio::time::timeout(std::time::Duration::from_secs(30), s.read(&mut answer))
                .await
                .expect("an answer within 30 s")
                .unwrap();
            String::from_utf8_lossy(&answer[..n]).into_owned()
        };
        let big = ask(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\nExpect: 100-continue\r\n\r\n"
                .into(),
            b"",
        )
        .await;
        assert!(big.starts_with("HTTP/1.1 413"), "{big}");
        let small = ask(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\n".into(),
            b"hello",
        )
        .await;
        assert!(
            small.starts_with("HTTP/1.1 200") && small.ends_with('5'),
            "{small}"
        );
    }
}
