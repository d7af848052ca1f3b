//! `nmo plan`, and the kubectl plugin: installed as `kubectl-nm` (a
//! symlink or a copy on PATH), the binary answers `kubectl nm plan|start|
//! status|stop`.

use clap::{Args, Parser, Subcommand};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use nmo::crd::{NodeMaintenance, NodeMaintenanceSpec};
use std::path::PathBuf;
use std::process::ExitCode;

use super::cluster::*;
use super::policy_configmap::policy_source;

/// The name the binary answers to as a kubectl plugin.
pub const PLUGIN_NAME: &str = "kubectl-nm";

/// `plan`: what a maintenance would do.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// The node whose maintenance to plan.
    #[arg(required_unless_present_any = ["maintenance", "fleet"])]
    pub node: Option<String>,
    /// Plan the whole fleet: every maintenance that holds or waits for a
    /// node, in the order the operator takes them, the budgets' headroom
    /// spent across nodes, and an estimate (`kubectl nm plan --all`).
    #[arg(long, visible_alias = "all", conflicts_with_all = ["node", "maintenance"])]
    pub fleet: bool,
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
    /// Put NODE into maintenance (creates a NodeMaintenance), or every node
    /// a label selector picks (-l: one NodeMaintenance each, in one group;
    /// the policy's admission decides their order).
    Start {
        #[arg(required_unless_present = "selector", conflicts_with = "selector")]
        node: Option<String>,
        /// Every node this label selector picks (as kubectl's -l).
        #[arg(short = 'l', long)]
        selector: Option<String>,
        /// With -l: a selector that picks every node is refused unless
        /// this says it is meant.
        #[arg(long, requires = "selector")]
        all_nodes: bool,
        /// With -l: the group's name (the nodemaintenance.medik8s.io/group
        /// label of its NodeMaintenances; default: start-<unix time>).
        #[arg(long, requires = "selector")]
        group: Option<String>,
        /// Why (the NodeMaintenance's spec.reason).
        #[arg(long)]
        reason: Option<String>,
        /// The NodeMaintenance's name (default: the node's).
        #[arg(long, conflicts_with = "selector")]
        name: Option<String>,
        /// The policy to drain with (the nodemaintenance.medik8s.io/policy
        /// annotation).
        #[arg(long)]
        policy: Option<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Every maintenance: phase, progress, pending pods, age; and each
    /// group's progress (maintenances started together by start -l).
    Status {
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
        /// Only this group's maintenances.
        #[arg(long)]
        group: Option<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// End NODE's maintenance, or a whole group's (deletes the
    /// NodeMaintenances; the nodes are restored).
    Stop {
        #[arg(
            required_unless_present_any = ["group", "selector"],
            conflicts_with_all = ["group", "selector"]
        )]
        node: Option<String>,
        /// Every maintenance of this group (started together by start -l).
        #[arg(long, conflicts_with = "selector")]
        group: Option<String>,
        /// The maintenances of every node this label selector picks (as
        /// kubectl's -l); a selector that picks every node is refused
        /// unless --all-nodes says it is meant.
        #[arg(short = 'l', long)]
        selector: Option<String>,
        /// With -l: a selector that picks every node is meant.
        #[arg(long, requires = "selector")]
        all_nodes: bool,
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
                node: Some(node),
                reason,
                name,
                policy,
                cluster,
                ..
            } => start(&cluster, &node, reason, name, policy).await,
            PluginCommand::Start {
                selector,
                all_nodes,
                group,
                reason,
                policy,
                cluster,
                ..
            } => {
                let many = Many {
                    selector: selector.unwrap_or_default(),
                    all_nodes,
                    group,
                    reason,
                    policy,
                };
                start_many(&cluster, many).await
            }
            PluginCommand::Status {
                output,
                group,
                cluster,
            } => status(&cluster, output, group.as_deref()).await,
            PluginCommand::Stop {
                node,
                group,
                selector,
                all_nodes,
                cluster,
            } => {
                let which = match (node, group, selector) {
                    (Some(node), _, _) => Ending::Node(node),
                    (_, Some(group), _) => Ending::Group(group),
                    (_, _, Some(selector)) => Ending::Selected {
                        selector,
                        all_nodes,
                    },
                    (None, None, None) => anyhow::bail!("name a node, --group or -l"),
                };
                stop(&cluster, &which).await
            }
        }
    })
}

async fn plan(args: &PlanArgs) -> anyhow::Result<ExitCode> {
    let client = client(&args.cluster).await?;
    let engine = super::policy::engine()?;
    // A policy file stands alone; a name is looked up in the set.
    let file = args
        .policy
        .as_deref()
        .filter(|p| p.ends_with(".wasm"))
        .map(PathBuf::from);
    let source = policy_source(
        file.as_ref(),
        args.policy_dir.as_ref(),
        &args.policy_configmap,
    )?;
    let policy = if file.is_some() {
        None
    } else {
        args.policy.clone()
    };
    if args.fleet {
        let report = nmo::plan::plan_fleet(&client, &engine, &source, policy).await?;
        match args.output {
            Output::Table => out!("{}", report.table()),
            Output::Json => outln!("{}", serde_json::to_string_pretty(&report)?),
            Output::Yaml => out!("{}", nmo::yaml::to_string(&report)?),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let request = nmo::plan::Request {
        node: args.node.clone(),
        maintenance: args.maintenance.clone(),
        policy,
        source,
    };
    let report = nmo::plan::plan(&client, &engine, &request).await?;
    match args.output {
        Output::Table => out!("{}", report.table()),
        Output::Json => outln!("{}", serde_json::to_string_pretty(&report)?),
        Output::Yaml => out!("{}", nmo::yaml::to_string(&report)?),
    }
    Ok(ExitCode::SUCCESS)
}

/// The label that ties the NodeMaintenances one `start -l` made.
pub const GROUP_LABEL: &str = "nodemaintenance.medik8s.io/group";

/// The NodeMaintenance `start` creates for `node`.
fn maintenance(
    name: &str,
    node: &str,
    reason: Option<String>,
    policy: Option<String>,
    group: Option<&str>,
) -> NodeMaintenance {
    let mut nm = NodeMaintenance::new(
        name,
        NodeMaintenanceSpec {
            node_name: node.to_owned(),
            reason,
        },
    );
    if let Some(policy) = policy {
        nm.annotations_mut()
            .insert(nmo::policy::POLICY_ANNOTATION.to_owned(), policy);
    }
    if let Some(group) = group {
        nm.labels_mut()
            .insert(GROUP_LABEL.to_owned(), group.to_owned());
    }
    nm
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
    let nm = maintenance(&name, node, reason, policy, None);
    Api::<NodeMaintenance>::all(client)
        .create(&PostParams::default(), &nm)
        .await?;
    outln!("nodemaintenance.nodemaintenance.medik8s.io/{name} created");
    Ok(ExitCode::SUCCESS)
}

/// `start -l`: what to start.
struct Many {
    selector: String,
    all_nodes: bool,
    group: Option<String>,
    reason: Option<String>,
    policy: Option<String>,
}

/// One NodeMaintenance (named after its node) for every node `selector`
/// picks, labelled with their group. A selector that picks every node is
/// refused unless `all_nodes`. A node that cannot be started (it has a
/// maintenance already, the webhook refuses it) is reported and the
/// others go on; the exit code is 1 when any failed.
async fn start_many(cluster: &ClusterArgs, many: Many) -> anyhow::Result<ExitCode> {
    let client = client(cluster).await?;
    let picked = selected_nodes(&client, &many.selector, many.all_nodes).await?;
    let group = many
        .group
        .unwrap_or_else(|| format!("start-{}", Timestamp::now().as_second()));
    let api = Api::<NodeMaintenance>::all(client);
    let mut failed = 0;
    for name in &picked {
        let nm = maintenance(
            name,
            name,
            many.reason.clone(),
            many.policy.clone(),
            Some(&group),
        );
        match api.create(&PostParams::default(), &nm).await {
            Ok(_) => outln!("nodemaintenance.nodemaintenance.medik8s.io/{name} created"),
            Err(e) => {
                failed += 1;
                eprintln!(
                    "{name}: {}",
                    super::output::error_text(&anyhow::Error::new(e))
                );
            }
        }
    }
    outln!(
        "group {group}: {} of {} node(s) started; `kubectl nm status --group {group}` shows its progress",
        picked.len() - failed,
        picked.len()
    );
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
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
    /// Why the policy has set it aside (`status.parked`; the phase stays
    /// Running, the table says Parked).
    parked: Option<String>,
    /// The group it was started in (`start -l`).
    group: Option<String>,
    age_seconds: i64,
}

async fn status(
    cluster: &ClusterArgs,
    output: Output,
    group: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let client = client(cluster).await?;
    let params = match group {
        Some(g) => ListParams::default().labels(&format!("{GROUP_LABEL}={g}")),
        None => ListParams::default(),
    };
    let list = Api::<NodeMaintenance>::all(client).list(&params).await?;
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
                parked: s.parked.map(|p| p.reason),
                group: nm.labels().get(GROUP_LABEL).cloned(),
                age_seconds: nm
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or(0, |t| (now.as_second() - t.0.as_second()).max(0)),
            }
        })
        .collect();
    match output {
        Output::Json => outln!("{}", serde_json::to_string_pretty(&lines)?),
        Output::Yaml => out!("{}", nmo::yaml::to_string(&lines)?),
        Output::Table => {
            if lines.is_empty() {
                outln!("No NodeMaintenances.");
                return Ok(ExitCode::SUCCESS);
            }
            outln!(
                "{:<24} {:<20} {:<10} {:>8} {:>8} {:>6}  LAST ERROR / WAITING FOR",
                "NAME",
                "NODE",
                "PHASE",
                "PROGRESS",
                "PENDING",
                "AGE"
            );
            for l in &lines {
                let (phase, why) = match &l.parked {
                    Some(reason) => ("Parked", format!("parked: {reason}")),
                    None => (
                        l.phase.as_str(),
                        l.waiting
                            .as_deref()
                            .or(l.last_error.as_deref())
                            .unwrap_or("-")
                            .to_owned(),
                    ),
                };
                outln!(
                    "{:<24} {:<20} {:<10} {:>7}% {:>8} {:>6}  {}",
                    l.name,
                    l.node,
                    phase,
                    l.drain_progress,
                    l.pending_pods.len(),
                    age(l.age_seconds),
                    nmo::text::clean(&why, 120)
                );
            }
            for line in group_lines(&lines) {
                outln!("{line}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Each group's progress: how many of its maintenances are in each phase.
fn group_lines(lines: &[StatusLine]) -> Vec<String> {
    let mut groups: std::collections::BTreeMap<&str, std::collections::BTreeMap<&str, usize>> =
        Default::default();
    for l in lines {
        if let Some(g) = &l.group {
            *groups
                .entry(g.as_str())
                .or_default()
                .entry(l.phase.as_str())
                .or_default() += 1;
        }
    }
    groups
        .into_iter()
        .map(|(group, phases)| {
            let total: usize = phases.values().sum();
            let done = phases.get("Succeeded").copied().unwrap_or(0);
            let each: Vec<String> = phases.iter().map(|(p, n)| format!("{n} {p}")).collect();
            format!(
                "group {group}: {done} of {total} succeeded ({})",
                each.join(", ")
            )
        })
        .collect()
}

/// Which maintenances `stop` ends.
enum Ending {
    /// The maintenance of one node.
    Node(String),
    /// Every maintenance of a group (`start -l`'s label).
    Group(String),
    /// The maintenances of every node a label selector picks.
    Selected { selector: String, all_nodes: bool },
}

async fn stop(cluster: &ClusterArgs, which: &Ending) -> anyhow::Result<ExitCode> {
    let client = client(cluster).await?;
    let api = Api::<NodeMaintenance>::all(client.clone());
    let params = match which {
        Ending::Group(g) => ListParams::default().labels(&format!("{GROUP_LABEL}={g}")),
        _ => ListParams::default(),
    };
    let picked = match which {
        Ending::Selected {
            selector,
            all_nodes,
        } => Some(selected_nodes(&client, selector, *all_nodes).await?),
        _ => None,
    };
    let list = api.list(&params).await?;
    let mine: Vec<&NodeMaintenance> = list
        .items
        .iter()
        .filter(|nm| match (which, &picked) {
            (Ending::Node(n), _) => nm.spec.node_name == *n,
            (_, Some(nodes)) => nodes.contains(&nm.spec.node_name),
            _ => true,
        })
        .collect();
    if mine.is_empty() {
        match which {
            Ending::Node(n) => anyhow::bail!("node {n} has no NodeMaintenance"),
            Ending::Group(g) => anyhow::bail!("group {g} has no NodeMaintenance"),
            Ending::Selected { selector, .. } => anyhow::bail!(
                "none of the {} node(s) the selector {selector:?} picks has a NodeMaintenance",
                picked.as_ref().map_or(0, Vec::len)
            ),
        }
    }
    for nm in mine {
        api.delete(&nm.name_any(), &DeleteParams::default()).await?;
        outln!(
            "nodemaintenance.nodemaintenance.medik8s.io/{} deleted",
            nm.name_any()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The nodes `selector` picks; none, or every node without `all_nodes`,
/// is refused (as `start -l` refuses them).
async fn selected_nodes(
    client: &Client,
    selector: &str,
    all_nodes: bool,
) -> anyhow::Result<Vec<String>> {
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
    let picked: Vec<String> = nodes
        .list(&ListParams::default().labels(selector))
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    if picked.is_empty() {
        anyhow::bail!("no node matches the selector {selector:?}");
    }
    if !all_nodes {
        let total = nodes
            .list_metadata(&ListParams::default())
            .await?
            .items
            .len();
        if picked.len() == total {
            anyhow::bail!(
                "the selector {selector:?} picks every node ({total}): that is the whole cluster; say --all-nodes if it is meant"
            );
        }
    }
    Ok(picked)
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
