//! `nmo policy add|rm|list|inspect`: the policies in the operator's
//! ConfigMap (or a folder, a file, an OCI reference).

use anyhow::Context as _;
use clap::Args;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use nmo::crd::NodeMaintenance;
use std::path::PathBuf;
use std::process::ExitCode;

use super::cluster::*;

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

/// Where the policies are read from: a file, a folder, or the operator's
/// ConfigMap (NAMESPACE/NAME).
pub(super) fn policy_source(
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
