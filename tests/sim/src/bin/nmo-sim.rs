//! `nmo-sim serve`: a simulated Kubernetes cluster for kubectl and kube-rs.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use nmo_sim::{SimCluster, SimOptions};

#[derive(Parser)]
#[command(
    name = "nmo-sim",
    version,
    about = "A simulated Kubernetes API server and cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve until interrupted; write a kubeconfig for kubectl.
    Serve {
        /// Where to write the kubeconfig.
        #[arg(long, default_value = "nmo-sim.kubeconfig")]
        kubeconfig: PathBuf,
        /// Address to listen on (port 0 picks a free port).
        #[arg(long, default_value = "127.0.0.1:0")]
        addr: std::net::SocketAddr,
        /// Objects to create at start: a multi-document YAML file.
        #[arg(long)]
        scenario: Option<PathBuf>,
        /// Nodes to create at start (worker-1, worker-2...).
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Simulated seconds per real second for grace periods and startup.
        #[arg(long, default_value_t = 1.0)]
        time_scale: f64,
        /// Serve HTTPS, require a bearer token and enforce RBAC on every
        /// resource request (the kubeconfig's user is cluster-admin;
        /// `kubectl create token SA` gives a ServiceAccount's token).
        #[arg(long)]
        authorization: bool,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let Command::Serve {
        kubeconfig,
        addr,
        scenario,
        nodes,
        time_scale,
        authorization,
    } = Cli::parse().command;
    let cluster = SimCluster::start(SimOptions {
        addr,
        time_scale,
        tls: authorization,
        ..SimOptions::default()
    })
    .await?;
    cluster.set_authorization(authorization);
    for i in 1..=nodes {
        cluster.add_node(&format!("worker-{i}"))?;
    }
    if let Some(path) = scenario {
        let yaml = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let created = cluster.apply_yaml(&yaml)?;
        eprintln!("created {} objects from {}", created.len(), path.display());
    }
    cluster.write_kubeconfig(&kubeconfig)?;
    eprintln!(
        "nmo-sim serving on {} ({} nodes); kubeconfig written to {}\n  kubectl --kubeconfig {} get nodes",
        cluster.url(),
        nodes,
        kubeconfig.display(),
        kubeconfig.display()
    );
    tokio::signal::ctrl_c().await?;
    cluster.stop().await;
    Ok(())
}
