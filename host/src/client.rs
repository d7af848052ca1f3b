//! The Kubernetes client the operator uses.

use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::{Request, Response};
use kube::client::{Body, ClientBuilder};
use kube::{Client, Config};

use crate::error::{Error, Result};

/// How long a watch lasts before the server ends it (and it is renewed):
/// below [`READ_TIMEOUT`], so an idle watch is never taken for a stalled
/// connection.
pub(crate) const WATCH_TIMEOUT_SECS: u32 = 45;

/// The longest any answer from the API server may take (between bytes of
/// an answer, counted from when the request was sent): no request hangs on
/// a stalled connection.
pub(crate) const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The operator's User-Agent.
pub const USER_AGENT: &str = concat!("nmo/", env!("CARGO_PKG_VERSION"));

/// A client as the operator needs it: kube's blanket retry of 429s off (a
/// PodDisruptionBudget refusal is an answer the drain handles, not an
/// overload to hide); every request bounded in time (connect 10 s, send
/// 30 s, answer [`READ_TIMEOUT`]), watches renewed every
/// [`WATCH_TIMEOUT_SECS`]; [`USER_AGENT`] unless the config names one.
pub fn operator_client(config: Config) -> Result<Client> {
    operator_client_counted(config, None)
}

/// The client's metric: `rest_client_requests_total{code, method, host}`,
/// as client-go's. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ClientMetrics {
    requests: prometheus::IntCounterVec,
}

impl ClientMetrics {
    /// Registers the client's family on `registry`.
    pub fn register(registry: &prometheus::Registry) -> crate::metrics::Result<Self> {
        Ok(ClientMetrics {
            requests: crate::metrics::counter_vec(
                registry,
                "rest_client_requests_total",
                "Number of HTTP requests to the API server, partitioned by status code, method, and host.",
                &["code", "method", "host"],
            )?,
        })
    }
}

/// [`operator_client`], counting every request in `metrics`.
pub fn operator_client_counted(
    mut config: Config,
    metrics: Option<ClientMetrics>,
) -> Result<Client> {
    config.default_retry = false;
    if !config
        .headers
        .iter()
        .any(|(name, _)| *name == hyper::header::USER_AGENT)
    {
        // As client-go's `<binary>/<version>`: the API server's audit log
        // names the operator.
        config.headers.push((
            hyper::header::USER_AGENT,
            hyper::header::HeaderValue::from_static(USER_AGENT),
        ));
    }
    config.connect_timeout = Some(std::time::Duration::from_secs(10));
    config.write_timeout = Some(std::time::Duration::from_secs(30));
    config.read_timeout = Some(READ_TIMEOUT);
    config.reset_reader_on_write = true;
    let host = config
        .cluster_url
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let builder = ClientBuilder::try_from(config)
        .map_err(|e| Error::Config(format!("building the client: {e}")))?;
    Ok(match metrics {
        Some(metrics) => builder.with_layer(&CountRequests { metrics, host }).build(),
        None => builder.build(),
    })
}

/// A layer counting the requests of the client it wraps.
#[derive(Clone)]
struct CountRequests {
    metrics: ClientMetrics,
    host: String,
}

impl<S> tower::Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
struct Counted<S> {
    inner: S,
    layer: CountRequests,
}

impl<S, B> tower::Service<Request<Body>> for Counted<S>
where
    S: tower::Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<
        Box<dyn std::future::Future<Output = std::result::Result<S::Response, S::Error>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let method = req.method().as_str().to_owned();
        let CountRequests { metrics, host } = self.layer.clone();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let result = answer.await;
            // client-go's values: the HTTP status, or "<error>" when there
            // was no answer.
            let code = match &result {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "<error>".to_owned(),
            };
            metrics
                .requests
                .with_label_values(&[code.as_str(), method.as_str(), host.as_str()])
                .inc();
            result
        })
    }
}

/// [`operator_client`] from a kubeconfig's YAML (the simulated cluster's,
/// say).
pub async fn client_from_kubeconfig(yaml: &str) -> Result<Client> {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(yaml)
        .map_err(|e| Error::Config(format!("reading the kubeconfig: {e}")))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| Error::Config(format!("reading the kubeconfig: {e}")))?;
    operator_client(config)
}
