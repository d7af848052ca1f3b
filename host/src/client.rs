//! The Kubernetes client the operator uses.

use kube::{Client, Config};

use crate::error::{Error, Result};

/// How long a watch lasts before the server ends it (and it is renewed):
/// below [`READ_TIMEOUT`], so an idle watch is never taken for a stalled
/// connection.
pub const WATCH_TIMEOUT_SECS: u32 = 45;

/// The longest any answer from the API server may take (between bytes of
/// an answer, counted from when the request was sent): no request hangs on
/// a stalled connection.
pub const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The operator's User-Agent.
pub const USER_AGENT: &str = concat!("nmo/", env!("CARGO_PKG_VERSION"));

/// A client as the operator needs it: kube's blanket retry of 429s off (a
/// PodDisruptionBudget refusal is an answer the drain handles, not an
/// overload to hide); every request bounded in time (connect 10 s, send
/// 30 s, answer [`READ_TIMEOUT`]), watches renewed every
/// [`WATCH_TIMEOUT_SECS`]; [`USER_AGENT`] unless the config names one.
pub fn operator_client(mut config: Config) -> Result<Client> {
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
    Client::try_from(config).map_err(|e| Error::Config(format!("building the client: {e}")))
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
