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

/// The operator's policies ConfigMap in a cluster, as `nmo policy add`,
/// `rm` and `inspect` name it.
#[derive(Debug, Clone, Args)]
pub struct PoliciesConfigMap {
    /// The operator's policies ConfigMap, NAMESPACE/NAME.
    #[arg(
        long,
        default_value = "node-maintenance-operator-system/node-maintenance-operator-policies"
    )]
    pub policy_configmap: String,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// A policies ConfigMap as read: the client, its API, its namespace and
/// name, and the object.
struct FetchedConfigMap {
    client: Client,
    api: Api<k8s_openapi::api::core::v1::ConfigMap>,
    namespace: String,
    name: String,
    current: k8s_openapi::api::core::v1::ConfigMap,
}

impl PoliciesConfigMap {
    /// Reads the ConfigMap from the cluster.
    async fn fetch(&self) -> anyhow::Result<FetchedConfigMap> {
        let (namespace, name) = self
            .policy_configmap
            .split_once('/')
            .context("--policy-configmap is NAMESPACE/NAME")?;
        let client = client(&self.cluster).await?;
        let api = Api::namespaced(client.clone(), namespace);
        let current = api.get(name).await?;
        Ok(FetchedConfigMap {
            client,
            api,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            current,
        })
    }
}

/// `nmo policy add`: one policy into the operator's policies ConfigMap.
#[derive(Debug, Clone, Args)]
pub struct AddArgs {
    /// The policy (.wasm), as `cargo build --target wasm32-wasip2` made it.
    pub file: PathBuf,
    /// Its name in the set (the ConfigMap key NAME.wasm; default: the
    /// file's name, without .wasm, `_` as `-`).
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub configmap: PoliciesConfigMap,
}

/// What one ConfigMap may hold, as the API server counts it.
const CONFIGMAP_LIMIT: usize = 1024 * 1024;

/// `nmo policy add`.
pub fn run_policy_add(args: &AddArgs) -> anyhow::Result<ExitCode> {
    tokio::runtime::Runtime::new()?.block_on(policy_add(args))
}

async fn policy_add(args: &AddArgs) -> anyhow::Result<ExitCode> {
    use kube::api::{Patch, PatchParams};
    let name = match &args.name {
        Some(n) => n.clone(),
        None => args
            .file
            .file_stem()
            .map(|s| s.to_string_lossy().replace('_', "-"))
            .unwrap_or_default(),
    };
    super::policy::check_policy_name(&name)?;
    let wasm =
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    // Checked as the operator will check it, before the cluster is touched.
    let engine = super::policy::engine()?;
    let policy = engine.load(&name, &wasm)?;
    nmo::policy::selfcheck::run(&policy)?;
    let FetchedConfigMap {
        api,
        namespace,
        name: cm_name,
        current,
        ..
    } = args.configmap.fetch().await?;
    let key = format!("{name}.wasm");
    let others: usize = current
        .data
        .iter()
        .flatten()
        .map(|(k, v)| k.len() + v.len())
        .chain(
            current
                .binary_data
                .iter()
                .flatten()
                .filter(|(k, _)| **k != key)
                .map(|(k, v)| k.len() + v.0.len()),
        )
        .sum();
    let total = others + key.len() + wasm.len();
    if total > CONFIGMAP_LIMIT {
        anyhow::bail!(
            "{key} ({} bytes) would make ConfigMap {namespace}/{cm_name} {total} bytes, past the {CONFIGMAP_LIMIT} a ConfigMap holds; nothing changed",
            wasm.len()
        );
    }
    // A merge patch of this one key: every other key stays as it is, and
    // no other field manager's fields are taken.
    let patch = serde_json::json!({"binaryData": {&key: k8s_openapi::ByteString(wasm.clone())}});
    api.patch(&cm_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    outln!(
        "configmap/{cm_name} patched: {key} ({} bytes, sha256 {}); {total} of {CONFIGMAP_LIMIT} bytes used",
        wasm.len(),
        &policy.digest()[..12]
    );
    Ok(ExitCode::SUCCESS)
}

/// `nmo policy rm`: one policy out of the operator's policies ConfigMap.
#[derive(Debug, Clone, Args)]
pub struct RmArgs {
    /// The policy's name in the set (the ConfigMap key NAME.wasm).
    pub name: String,
    /// Remove it even though maintenances that have not finished name it
    /// in `status.policy` (a running operator keeps the policy they
    /// started with until they end; a restarted one would not have it).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub configmap: PoliciesConfigMap,
}

/// `nmo policy rm`.
pub fn run_policy_rm(args: &RmArgs) -> anyhow::Result<ExitCode> {
    tokio::runtime::Runtime::new()?.block_on(policy_rm(args))
}

/// Removes `NAME.wasm` from the ConfigMap, every other key kept; refused
/// (nothing changed) when the set left would be one the operator refuses
/// (`policies.yaml` naming it as the default, in a rule or its settings),
/// or when maintenances that have not finished use it, unless `--force`.
async fn policy_rm(args: &RmArgs) -> anyhow::Result<ExitCode> {
    use kube::api::{Patch, PatchParams};
    super::policy::check_policy_name(&args.name)?;
    let FetchedConfigMap {
        client,
        api,
        namespace,
        name: cm_name,
        current,
    } = args.configmap.fetch().await?;
    let key = format!("{}.wasm", args.name);
    let mut files = nmo::plan::configmap_files(&current);
    if let Some(reference) = nmo::policy::set::Snapshot::from_files(files.clone())
        .pulled()
        .remove(&args.name)
        && !files.contains_key(&key)
    {
        anyhow::bail!(
            "{} is pulled from {reference} by policies.yaml (`pull:`), not a file of ConfigMap \
             {namespace}/{cm_name}: remove its line there (`kubectl edit configmap -n {namespace} \
             {cm_name}`), after any `default:` or rule naming it; nothing changed",
            args.name
        );
    }
    if files.remove(&key).is_none() {
        let there: Vec<String> = files
            .keys()
            .filter_map(|k| k.strip_suffix(".wasm").map(str::to_owned))
            .collect();
        anyhow::bail!(
            "ConfigMap {namespace}/{cm_name} has no policy {} (it has: {})",
            args.name,
            if there.is_empty() {
                "none".to_owned()
            } else {
                there.join(", ")
            }
        );
    }
    let engine = super::policy::engine()?;
    let left = nmo::plan::load_files(&engine, files).map_err(|e| {
        anyhow::anyhow!(
            "without {}, the operator would refuse the set: {e}; nothing changed (change policies.yaml first)",
            args.name
        )
    })?;
    let users: Vec<String> = Api::<NodeMaintenance>::all(client)
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|nm| {
            let s = nm.status.as_ref();
            s.and_then(|s| s.policy.as_deref())
                .is_some_and(|p| p.split('@').next() == Some(args.name.as_str()))
                && !s.and_then(|s| s.phase.as_ref()).is_some_and(|p| {
                    matches!(
                        p,
                        nmo::crd::MaintenancePhase::Succeeded | nmo::crd::MaintenancePhase::Failed
                    )
                })
        })
        .map(ResourceExt::name_any)
        .collect();
    if !users.is_empty() && !args.force {
        anyhow::bail!(
            "maintenances that have not finished drain with {}: {}; a restarted operator would not have it. Wait for them, or --force; nothing changed",
            args.name,
            users.join(", ")
        );
    }
    let field = if current
        .binary_data
        .as_ref()
        .is_some_and(|b| b.contains_key(&key))
    {
        "binaryData"
    } else {
        "data"
    };
    let patch = serde_json::json!({ field: { &key: null } });
    api.patch(&cm_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    outln!(
        "configmap/{cm_name} patched: {key} removed; the set left: {}",
        left.0.summary()
    );
    Ok(ExitCode::SUCCESS)
}

/// `nmo policy inspect`: what a policy is.
#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// A policy file (.wasm), `default` (the embedded default), an OCI
    /// reference pinned by digest (REGISTRY/REPOSITORY@sha256:…, pulled
    /// and verified as the operator pulls it), or the name of a policy in
    /// the operator's policies ConfigMap (one of its files, or one its
    /// policies.yaml pulls).
    pub policy: PathBuf,
    /// A registry (`host` or `host:port`) spoken to over plain HTTP
    /// besides the loopback ones.
    #[arg(long = "insecure-registry", value_name = "HOST")]
    pub insecure_registries: Vec<String>,
    #[command(flatten)]
    pub configmap: PoliciesConfigMap,
}

/// Pulls the policy `reference` (pinned by digest) as the operator does:
/// manifest and layer verified against the digest.
async fn pull_policy(reference: &str, insecure: &[String]) -> anyhow::Result<Vec<u8>> {
    let pinned = nmo::policy::oci::Pinned::parse(reference)?;
    let registry = nmo::policy::oci::Registry::new(nmo::policy::oci::RegistryConfig::for_user(
        insecure.to_vec(),
    ));
    let bytes = tokio::task::spawn_blocking(move || registry.fetch(&pinned)).await??;
    Ok(bytes.as_ref().clone())
}

/// `nmo policy inspect`.
pub fn run_policy_inspect(args: &InspectArgs) -> anyhow::Result<ExitCode> {
    tokio::runtime::Runtime::new()?.block_on(policy_inspect(args))
}

/// Loads the policy as the operator would and says what it is: its name,
/// where it came from, its sha256 (and as `status.policy` shows it), its
/// size, the contract version it was built against, what it imports and
/// exports, and whether it passes the operator's self-check. Exit code 1
/// when the self-check fails.
async fn policy_inspect(args: &InspectArgs) -> anyhow::Result<ExitCode> {
    let engine = super::policy::engine()?;
    let given = &args.policy;
    let (policy, source, size) = if given.as_os_str() == "default" {
        let p = engine.default_policy()?;
        let size = nmo::policy::DEFAULT_POLICY_WASM.len();
        (p, "embedded in nmo".to_owned(), size)
    } else if given.to_string_lossy().contains("@sha256:") {
        let reference = given.to_string_lossy().into_owned();
        let bytes = pull_policy(&reference, &args.insecure_registries).await?;
        let name = reference
            .split('@')
            .next()
            .and_then(|r| r.rsplit('/').next())
            .map(|r| r.split(':').next().unwrap_or(r).to_owned())
            .unwrap_or_default();
        let p = engine.load(&name, &bytes)?;
        (p, format!("OCI {reference}"), bytes.len())
    } else if given.exists() {
        // Named as `nmo policy add` names it in the set.
        let name = given
            .file_stem()
            .map(|s| s.to_string_lossy().replace('_', "-"))
            .unwrap_or_default();
        let bytes = std::fs::read(given).with_context(|| format!("reading {}", given.display()))?;
        let p = engine.load(&name, &bytes)?;
        (p, given.display().to_string(), bytes.len())
    } else {
        let name = given.to_string_lossy().into_owned();
        super::policy::check_policy_name(&name).map_err(|_| {
            anyhow::anyhow!("{name}: no such file, and no policy name (lowercase letters, digits and '-') to look for in the ConfigMap")
        })?;
        let FetchedConfigMap {
            namespace,
            name: cm_name,
            current,
            ..
        } = args.configmap.fetch().await?;
        let key = format!("{name}.wasm");
        let mut files = nmo::plan::configmap_files(&current);
        let pulled = nmo::policy::set::Snapshot::from_files(files.clone())
            .pulled()
            .remove(&name);
        let (bytes, source) = match (files.remove(&key), pulled) {
            (Some(bytes), _) => (bytes, format!("ConfigMap {namespace}/{cm_name}, key {key}")),
            (None, Some(reference)) => (
                pull_policy(&reference, &args.insecure_registries).await?,
                format!(
                    "OCI {reference} (ConfigMap {namespace}/{cm_name}, policies.yaml pull: {name})"
                ),
            ),
            (None, None) => anyhow::bail!(
                "ConfigMap {namespace}/{cm_name} has no {key}, and its policies.yaml pulls no {name}"
            ),
        };
        let p = engine.load(&name, &bytes)?;
        (p, source, bytes.len())
    };
    let interface = policy.interface();
    let check = nmo::policy::selfcheck::run(&policy);
    let row = |label: &str, value: &str| outln!("{label:<12}{value}");
    row("Name:", policy.name());
    row("Source:", &source);
    row("SHA-256:", policy.digest());
    row(
        "Recorded:",
        &format!(
            "{}@sha256:{} (as status.policy shows it)",
            policy.name(),
            &policy.digest()[..12]
        ),
    );
    row("Size:", &format!("{size} bytes"));
    row(
        "Contract:",
        &format!(
            "{} (this nmo runs {})",
            interface
                .contract()
                .map_or("(none named)".to_owned(), |v| format!(
                    "medik8s:node-maintenance@{v}"
                )),
            nmo::policy::CONTRACT_VERSION
        ),
    );
    row("Exports:", &interface.exports.join(", "));
    row("Imports:", &interface.imports.join(", "));
    match &check {
        Ok(()) => row(
            "Self-check:",
            "passed (a sample drain and every kind of failure answered validly)",
        ),
        Err(e) => row("Self-check:", &format!("FAILED: {e}")),
    }
    Ok(if check.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
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

async fn client(args: &ClusterArgs) -> anyhow::Result<Client> {
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

/// Where the policies are read from: a file, a folder, or the operator's
/// ConfigMap (NAMESPACE/NAME).
fn policy_source(
    file: Option<&PathBuf>,
    dir: Option<&PathBuf>,
    configmap: &str,
) -> anyhow::Result<nmo::plan::Source> {
    Ok(match (file, dir) {
        (Some(f), _) => nmo::plan::Source::File(f.clone()),
        (None, Some(dir)) => nmo::plan::Source::Dir(dir.clone()),
        (None, None) => {
            let (namespace, name) = configmap
                .split_once('/')
                .context("--policy-configmap is NAMESPACE/NAME")?;
            nmo::plan::Source::ConfigMap {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }
        }
    })
}

/// `nmo policy list`: the policies the operator loads, with their digests
/// and where each came from.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// A policy directory instead of the cluster's ConfigMap.
    #[arg(long)]
    pub policy_dir: Option<PathBuf>,
    /// The operator's policies ConfigMap, NAMESPACE/NAME; when it does not
    /// exist, the embedded default is all there is.
    #[arg(
        long,
        default_value = "node-maintenance-operator-system/node-maintenance-operator-policies"
    )]
    pub policy_configmap: String,
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Output,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `nmo policy list`.
pub fn run_policy_list(args: &ListArgs) -> anyhow::Result<ExitCode> {
    tokio::runtime::Runtime::new()?.block_on(policy_list(args))
}

async fn policy_list(args: &ListArgs) -> anyhow::Result<ExitCode> {
    let source = policy_source(None, args.policy_dir.as_ref(), &args.policy_configmap)?;
    // A folder needs no cluster.
    let client = match &source {
        nmo::plan::Source::ConfigMap { .. } => Some(client(&args.cluster).await?),
        _ => None,
    };
    let engine = super::policy::engine()?;
    let listed = nmo::plan::list(client.as_ref(), &engine, &source).await?;
    match args.output {
        Output::Json => outln!("{}", serde_json::to_string_pretty(&listed)?),
        Output::Yaml => out!("{}", nmo::yaml::to_string(&listed)?),
        Output::Table => {
            outln!("{:<24} {:<14} {:<8} SOURCE", "NAME", "SHA256", "DEFAULT");
            for l in &listed {
                outln!(
                    "{:<24} {:<14} {:<8} {}",
                    l.name,
                    l.digest,
                    if l.default { "yes" } else { "" },
                    l.source
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
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
