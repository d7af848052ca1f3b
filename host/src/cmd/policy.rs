//! The policy commands and the policies the operator runs with: the
//! sandbox as the binary runs it (compiling in a child process), a policy
//! file or the policy directory loaded, `nmo policy test`, `check` and
//! `push`.

use std::path::PathBuf;
use std::process::ExitCode;

use nmo::policy::{EngineConfig, PolicyEngine, PolicyStore, selfcheck};

/// The operator's flags for its policies: where they are, where their
/// compiled artifacts are kept, and how their registries are reached.
#[derive(Debug, clap::Args)]
pub struct PolicyFlags {
    /// The policy directory: .wasm files and policies.yaml, usually a
    /// mounted ConfigMap; reloaded when it changes. Without it, the
    /// embedded default policy.
    #[arg(long, default_value = "/etc/nmo/policies")]
    pub policy_dir: PathBuf,

    /// Where compiled policies are kept between starts (keyed by engine and
    /// module digest); empty to compile at every start. Created mode 700; a
    /// directory that another user owns or can write is not used.
    #[arg(long, default_value = "/tmp/nmo-policy-cache")]
    pub policy_cache_dir: String,

    /// A registry (HOST or HOST:PORT) that policies.yaml's `pull:`
    /// references reach over plain HTTP; loopback registries always are.
    /// Repeatable.
    #[arg(long = "insecure-registry", value_name = "HOST")]
    pub insecure_registries: Vec<String>,

    /// Credentials for the registries policies are pulled from: a Docker
    /// config file (a mounted `kubernetes.io/dockerconfigjson` Secret's
    /// `.dockerconfigjson`). Read at each pull; absent: anonymous.
    #[arg(long, value_name = "FILE")]
    pub registry_config: Option<PathBuf>,

    /// One policy file (.wasm) for every maintenance, instead of the policy
    /// directory.
    #[arg(long, conflicts_with = "policy_dir")]
    pub policy: Option<PathBuf>,
}

/// The sandbox as the binary runs it: the defaults, with policies compiled
/// in a child process of this binary (under a time and memory limit).
pub(super) fn engine() -> nmo::policy::Result<PolicyEngine> {
    Ok(PolicyEngine::new(engine_config())?)
}

/// The engine's settings: policies compiled in a worker process of this
/// binary.
fn engine_config() -> EngineConfig {
    let mut config = EngineConfig::default();
    if let Ok(exe) = std::env::current_exe() {
        config.compile = config.compile.with_worker_exe(exe);
    }
    config
}

/// The compiled-policy cache, if its directory is usable (private to this
/// user); otherwise policies are compiled at every start, and the log says
/// why.
fn policy_cache(dir: &std::path::Path) -> Option<nmo::policy::PolicyCache> {
    if dir.as_os_str().is_empty() {
        return None;
    }
    match nmo::policy::PolicyCache::open(dir) {
        Ok(cache) => Some(cache),
        Err(e) => {
            tracing::error!(error = %e, "not caching compiled policies");
            None
        }
    }
}

/// The policies the operator decides with: one file (`--policy`) or the
/// policy directory (compiled in parallel, from the cache when present).
pub(super) fn load_policies(
    cli: &PolicyFlags,
    metrics: nmo::policy::PolicyMetrics,
) -> anyhow::Result<std::sync::Arc<PolicyStore>> {
    let engine = PolicyEngine::observed(engine_config(), metrics.observer())?;
    let cache = policy_cache(std::path::Path::new(&cli.policy_cache_dir));
    Ok(match &cli.policy {
        Some(path) => {
            let policy = engine.load_file(path)?.alone()?;
            selfcheck::run(&policy)?;
            tracing::info!(
                policy = policy.name(),
                digest = policy.digest(),
                "policy loaded"
            );
            PolicyStore::single(policy)
        }
        None => {
            let mut registry = nmo::policy::oci::Registry::new(nmo::policy::oci::RegistryConfig {
                insecure: cli.insecure_registries.clone(),
                auth_file: cli.registry_config.clone(),
            });
            if !cli.policy_cache_dir.is_empty() {
                registry = registry
                    .with_disk_cache(&std::path::Path::new(&cli.policy_cache_dir).join("oci"));
            }
            PolicyStore::from_dir_pulling(engine, &cli.policy_dir, cache, registry)?
        }
    })
}

/// `nmo policy push`: checked, pushed, and the pinned reference printed.
pub(super) fn policy_push(
    file: &std::path::Path,
    reference: &str,
    name: Option<String>,
    insecure: Vec<String>,
) -> anyhow::Result<ExitCode> {
    use anyhow::Context as _;
    let wasm = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let name = name.unwrap_or_else(|| {
        file.file_stem()
            .map(|s| s.to_string_lossy().replace('_', "-"))
            .unwrap_or_default()
    });
    check_policy_name(&name)?;
    let policy = engine()?.load(&name, &wasm)?;
    selfcheck::run(&policy)?;
    let registry =
        nmo::policy::oci::Registry::new(nmo::policy::oci::RegistryConfig::for_user(insecure));
    let contract = policy.interface().contract().map_or_else(
        || nmo::policy::WORLD.to_owned(),
        |v| format!("medik8s:node-maintenance/drain-policy@{v}"),
    );
    let pinned = registry.push(&wasm, &name, &contract, reference)?;
    outln!("{pinned}");
    eprintln!("\nin policies.yaml:\n  pull:\n    {name}: {pinned}");
    Ok(ExitCode::SUCCESS)
}

/// Loads a policy file, or the embedded default for `default`.
fn load_policy(
    engine: &PolicyEngine,
    file: &std::path::Path,
) -> nmo::policy::Result<nmo::policy::Policy> {
    let policy = if file.as_os_str() == "default" {
        engine.default_policy()
    } else {
        engine.load_file(file)
    };
    Ok(policy?)
}

pub(super) fn policy_test(policy: &std::path::Path, scenarios: &[PathBuf]) -> ExitCode {
    let report = engine()
        .and_then(|engine| load_policy(&engine, policy))
        .map_err(nmo::policy::ToolError::from)
        .and_then(|p| nmo::policy::harness::run_paths(&p, scenarios));
    match report {
        Ok(report) => {
            out!("{}", report.render());
            if report.failed() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

pub(super) fn policy_check(files: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let engine = engine()?;
    let mut failed = 0;
    for file in files {
        if file.is_dir() {
            // A policy directory (or a ConfigMap's content): as the
            // operator would load it.
            let registry = nmo::policy::oci::Registry::new(
                nmo::policy::oci::RegistryConfig::for_user(Vec::new()),
            );
            let set = nmo::policy::set::Snapshot::read(file)
                .and_then(|snap| snap.with_pulled(&registry))
                .and_then(|snap| nmo::policy::PolicySet::load(&engine, &snap, None));
            match set {
                Ok(set) => outln!("ok    {}: {}", file.display(), set.summary()),
                Err(e) => {
                    failed += 1;
                    outln!("FAIL  {}: {e}", file.display());
                }
            }
            continue;
        }
        let loaded = load_policy(&engine, file);
        match loaded.and_then(|p| Ok(selfcheck::run(&p).map(|()| p)?)) {
            Ok(p) => outln!("ok    {} (sha256 {})", file.display(), &p.digest()[..12]),
            Err(e) => {
                failed += 1;
                outln!("FAIL  {}: {e}", file.display());
            }
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// A policy's name is lowercase letters, digits and '-' (it is a
/// ConfigMap key, `NAME.wasm`, and an artifact's title).
pub(super) fn check_policy_name(name: &str) -> anyhow::Result<()> {
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        anyhow::bail!("{name:?} is no policy name: lowercase letters, digits and '-' (--name)");
    }
    Ok(())
}
