//! The Kubernetes client the operator uses.

use kube::{Client, Config};

use crate::error::{Error, Result};

/// A client as the operator needs it: kube's blanket retry of 429s off (a
/// PodDisruptionBudget refusal is an answer the drain handles, not an
/// overload to hide).
pub fn operator_client(mut config: Config) -> Result<Client> {
    config.default_retry = false;
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
