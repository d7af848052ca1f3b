//! The cluster a command talks to, as kubectl's flags name it, and how
//! its answers are printed.

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use kube::Client;
use std::path::PathBuf;

/// Which cluster, as kubectl's flags say it.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Path to the kubeconfig file (default: KUBECONFIG, ~/.kube/config,
    /// else in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long)]
    pub context: Option<String>,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

pub(super) async fn client(args: &ClusterArgs) -> anyhow::Result<Client> {
    let config = kube_config(args.kubeconfig.as_deref(), args.context.clone()).await?;
    Ok(nmo::client::operator_client(config)?)
}

/// The client configuration of a kubeconfig file and context when given
/// (`--kubeconfig`, `--context`), else inferred (KUBECONFIG,
/// ~/.kube/config, in-cluster).
pub(super) async fn kube_config(
    kubeconfig: Option<&std::path::Path>,
    context: Option<String>,
) -> anyhow::Result<kube::Config> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let options = KubeConfigOptions {
        context,
        ..Default::default()
    };
    Ok(match kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?
        }
        None if options.context.is_some() => kube::Config::from_kubeconfig(&options).await?,
        None => kube::Config::infer().await?,
    })
}
