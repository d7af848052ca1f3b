//! `nmo plan`, and the kubectl plugin: installed as `kubectl-nm` (a
//! symlink or a copy on PATH), the binary answers `kubectl nm plan|start|
//! status|stop`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use nmo::crd::{NodeMaintenance, NodeMaintenanceSpec};

/// The name the binary answers to as a kubectl plugin.
pub const PLUGIN_NAME: &str = "kubectl-nm";

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

/// `plan`: what a maintenance would do.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// The node whose maintenance to plan.
    #[arg(required_unless_present = "maintenance")]
    pub node: Option<String>,
    /// Plan for this NodeMaintenance as it is now: the policy it records,
    /// the pods still on its node.
    #[arg(long, conflicts_with = "node")]
    pub maintenance: Option<String>,
    /// Another policy: a name in the policy set, or a policy file (.wasm).
    #[arg(long)]
    pub policy: Option<String>,
    /// Read the policies from this directory, as the operator reads its
    /// --policy-dir (instead of the cluster's ConfigMap).
    #[arg(long)]
    pub policy_dir: Option<PathBuf>,
    /// The operator's policies ConfigMap, NAMESPACE/NAME; when it does not
    /// exist, the embedded default policy plans.
    #[arg(
        long,
        default_value = "node-maintenance-operator-system/node-maintenance-operator-policies"
    )]
    pub policy_configmap: String,
    /// table, json or yaml (the fields are documented in the README).
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Output,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `kubectl nm`: node maintenance with nmo.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl nm",
    bin_name = "kubectl nm",
    version,
    about = "Node maintenance with nmo"
)]
pub struct Plugin {
    #[command(subcommand)]
    pub command: PluginCommand,
}

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// What a maintenance of NODE would do: the policy, every pod's action,
    /// wave and grace period, the budgets that would hold it up. Changes
    /// nothing.
    Plan(PlanArgs),
    /// Put NODE into maintenance (creates a NodeMaintenance).
    Start {
        node: String,
        /// Why (the NodeMaintenance's spec.reason).
        #[arg(long)]
        reason: Option<String>,
        /// The NodeMaintenance's name (default: the node's).
        #[arg(long)]
        name: Option<String>,
        /// The policy to drain with (the nodemaintenance.medik8s.io/policy
        /// annotation).
        #[arg(long)]
        policy: Option<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Every maintenance: phase, progress, pending pods, age.
    Status {
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// End NODE's maintenance (deletes its NodeMaintenances; the node is
    /// restored).
    Stop {
        node: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

/// Whether the binary was started as the kubectl plugin.
pub fn invoked_as_plugin() -> bool {
    std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .is_some_and(|n| n == PLUGIN_NAME)
}

/// Runs a plugin command.
pub fn run_plugin(plugin: Plugin) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        match plugin.command {
            PluginCommand::Plan(args) => plan(&args).await,
            PluginCommand::Start {
                node,
                reason,
                name,
                policy,
                cluster,
            } => start(&cluster, &node, reason, name, policy).await,
            PluginCommand::Status { output, cluster } => status(&cluster, output).await,
            PluginCommand::Stop { node, cluster } => stop(&cluster, &node).await,
        }
    })
}

/// `nmo plan`.
pub fn run_plan(args: &PlanArgs) -> anyhow::Result<ExitCode> {
    tokio::runtime::Runtime::new()?.block_on(plan(args))
}

async fn client(args: &ClusterArgs) -> anyhow::Result<Client> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?
        }
        None if args.context.is_some() => kube::Config::from_kubeconfig(&options).await?,
        None => kube::Config::infer().await?,
    };
    Ok(nmo::client::operator_client(config)?)
}

async fn plan(args: &PlanArgs) -> anyhow::Result<ExitCode> {
    let client = client(&args.cluster).await?;
    let engine = super::engine()?;
    // A policy file stands alone; a name is looked up in the set.
    let file = args
        .policy
        .as_deref()
        .filter(|p| p.ends_with(".wasm"))
        .map(PathBuf::from);
    let source = match (&file, &args.policy_dir) {
        (Some(f), _) => nmo::plan::Source::File(f.clone()),
        (None, Some(dir)) => nmo::plan::Source::Dir(dir.clone()),
        (None, None) => {
            let (namespace, name) = args
                .policy_configmap
                .split_once('/')
                .context("--policy-configmap is NAMESPACE/NAME")?;
            nmo::plan::Source::ConfigMap {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }
        }
    };
    let request = nmo::plan::Request {
        node: args.node.clone(),
        maintenance: args.maintenance.clone(),
        policy: if file.is_some() {
            None
        } else {
            args.policy.clone()
        },
        source,
    };
    let report = nmo::plan::plan(&client, &engine, &request).await?;
    match args.output {
        Output::Table => print!("{}", report.table()),
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Yaml => print!("{}", nmo::yaml::to_string(&report)?),
    }
    Ok(ExitCode::SUCCESS)
}

async fn start(
    cluster: &ClusterArgs,
    node: &str,
    reason: Option<String>,
    name: Option<String>,
    policy: Option<String>,
) -> anyhow::Result<ExitCode> {
    let client = client(cluster).await?;
    let name = name.unwrap_or_else(|| node.to_owned());
    let mut nm = NodeMaintenance::new(
        &name,
        NodeMaintenanceSpec {
            node_name: node.to_owned(),
            reason,
        },
    );
    if let Some(policy) = policy {
        nm.annotations_mut()
            .insert(nmo::policy::POLICY_ANNOTATION.to_owned(), policy);
    }
    Api::<NodeMaintenance>::all(client)
        .create(&PostParams::default(), &nm)
        .await
        .map_err(api_error)?;
    println!("nodemaintenance.nodemaintenance.medik8s.io/{name} created");
    Ok(ExitCode::SUCCESS)
}

/// One line of `kubectl nm status`; `-o json|yaml` prints a list of these.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusLine {
    name: String,
    node: String,
    phase: String,
    drain_progress: i32,
    pending_pods: Vec<String>,
    policy: Option<String>,
    last_error: Option<String>,
    /// Why the policy holds it back (phase `Waiting`).
    waiting: Option<String>,
    age_seconds: i64,
}

async fn status(cluster: &ClusterArgs, output: Output) -> anyhow::Result<ExitCode> {
    let client = client(cluster).await?;
    let list = Api::<NodeMaintenance>::all(client)
        .list(&ListParams::default())
        .await
        .map_err(api_error)?;
    let now = Timestamp::now();
    let lines: Vec<StatusLine> = list
        .items
        .iter()
        .map(|nm| {
            let s = nm.status.clone().unwrap_or_default();
            StatusLine {
                name: nm.name_any(),
                node: nm.spec.node_name.clone(),
                phase: match (s.phase, &s.waiting) {
                    (Some(p), _) => p.as_str(),
                    (None, Some(_)) => "Waiting",
                    (None, None) => "Pending",
                }
                .to_owned(),
                drain_progress: s.drain_progress,
                pending_pods: s.pending_pods.unwrap_or_default(),
                policy: s.policy,
                last_error: s.last_error,
                waiting: s.waiting.map(|w| w.reason),
                age_seconds: nm
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or(0, |t| (now.as_second() - t.0.as_second()).max(0)),
            }
        })
        .collect();
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&lines)?),
        Output::Yaml => print!("{}", nmo::yaml::to_string(&lines)?),
        Output::Table => {
            if lines.is_empty() {
                println!("No NodeMaintenances.");
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "{:<24} {:<20} {:<10} {:>8} {:>8} {:>6}  LAST ERROR / WAITING FOR",
                "NAME", "NODE", "PHASE", "PROGRESS", "PENDING", "AGE"
            );
            for l in &lines {
                println!(
                    "{:<24} {:<20} {:<10} {:>7}% {:>8} {:>6}  {}",
                    l.name,
                    l.node,
                    l.phase,
                    l.drain_progress,
                    l.pending_pods.len(),
                    age(l.age_seconds),
                    nmo::text::clean(
                        l.waiting
                            .as_deref()
                            .or(l.last_error.as_deref())
                            .unwrap_or("-"),
                        120
                    )
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn stop(cluster: &ClusterArgs, node: &str) -> anyhow::Result<ExitCode> {
    let client = client(cluster).await?;
    let api = Api::<NodeMaintenance>::all(client);
    let list = api.list(&ListParams::default()).await.map_err(api_error)?;
    let mine: Vec<&NodeMaintenance> = list
        .items
        .iter()
        .filter(|nm| nm.spec.node_name == node)
        .collect();
    if mine.is_empty() {
        anyhow::bail!("node {node} has no NodeMaintenance");
    }
    for nm in mine {
        api.delete(&nm.name_any(), &DeleteParams::default())
            .await
            .map_err(api_error)?;
        println!(
            "nodemaintenance.nodemaintenance.medik8s.io/{} deleted",
            nm.name_any()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// An age as kubectl shows it: 42s, 5m, 3h, 2d.
fn age(seconds: i64) -> String {
    match seconds.max(0) {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// An API error as kubectl shows it: the server's message.
fn api_error(e: kube::Error) -> anyhow::Error {
    match e {
        kube::Error::Api(s) => anyhow::anyhow!("{}", s.message),
        other => anyhow::Error::new(other),
    }
}
