//! A policy set: the policies of a policy directory and the rules that say
//! which one decides for a maintenance.
//!
//! A policy directory holds `.wasm` files (a policy's name is its file name
//! without `.wasm`) and, optionally, `policies.yaml`:
//!
//! ```yaml
//! # The policy for maintenances no rule picks. A name from this directory,
//! # or `builtin` for the embedded default policy. Default: `default` when
//! # the directory has a default.wasm, else `builtin`.
//! default: default
//! # First match wins; a rule picks by the labels of the maintenance's node.
//! rules:
//!   - nodeSelector:            # a metav1.LabelSelector, or "k=v,k2 in (a,b)"
//!       matchLabels: {storage: local}
//!     policy: stateful-last
//! # Settings per policy, checked by the policy itself when the set loads
//! # (its `validate-settings`); values are strings (numbers and booleans
//! # are read as their text).
//! settings:
//!   give-up:
//!     timeout: 30m
//! ```
//!
//! A NodeMaintenance may name its policy itself with the annotation
//! `nodemaintenance.medik8s.io/policy: <name>`; that beats every rule.
//!
//! The directory may be a plain directory or what a kubelet makes of a
//! mounted ConfigMap (files behind a `..data` symlink that is swapped
//! atomically on update; `.wasm` files come from the ConfigMap's
//! `binaryData`). The snapshot is read through `..data` when there is one,
//! so a set is never read half old, half new.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use nmo_policy_runtime::PolicyCache;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::error::{Error, Result};
use kube::core::{Selector, SelectorExt};
use nmo_policy_runtime::Settings;
use nmo_policy_runtime::selfcheck;
use nmo_policy_runtime::{Policy, PolicyEngine};

use super::selector;

use super::access::POLICY_ANNOTATION;

use crate::sync::Locked;
/// The policy directory's configuration file.
pub(crate) const CONFIG_FILE: &str = "policies.yaml";
/// The name of the embedded default policy in a policy set.
pub(crate) const BUILTIN: &str = "builtin";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ConfigFile {
    default: Option<String>,
    #[serde(default)]
    rules: Vec<RuleFile>,
    #[serde(default)]
    settings: BTreeMap<String, BTreeMap<String, serde_json::Value>>,
    /// Who may take which node down (see `access.rs`).
    access: Option<super::access::AccessFile>,
    /// Policies pulled from OCI registries: name to a reference pinned by
    /// digest (see `oci.rs`).
    #[serde(default)]
    pull: BTreeMap<String, String>,
}

/// The configuration of a snapshot, parsed (an absent or empty file is the
/// default).
fn config_of(snap: &Snapshot) -> Result<ConfigFile> {
    Ok(match snap.files.get(CONFIG_FILE) {
        Some(bytes) => crate::yaml::from_slice::<Option<ConfigFile>>(bytes)
            .map_err(|e| Error::Set(format!("{CONFIG_FILE}: {e}")))?
            .unwrap_or_default(),
        None => ConfigFile::default(),
    })
}

/// Policies compiled (or taken from the cache) and self-checked at once.
const PARALLEL_LOADS: usize = 4;

/// Compiles (or takes from `cache`) and self-checks each policy, up to
/// [`PARALLEL_LOADS`] at a time (and no more than the machine's cores);
/// results in the order given. Those that pass are cached.
fn load_all(
    engine: &PolicyEngine,
    wasm: &[(&str, &[u8])],
    cache: Option<&PolicyCache>,
) -> Vec<Result<Policy>> {
    let workers = std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .min(PARALLEL_LOADS)
        .min(wasm.len())
        .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<Result<Policy>>>> =
        wasm.iter().map(|_| std::sync::Mutex::new(None)).collect();
    let load = |name: &str, bytes: &[u8]| -> Result<Policy> {
        let policy = engine.load_cached(name, bytes, cache)?;
        selfcheck::run(&policy)?;
        if let Some(cache) = cache {
            policy.cache_in(cache);
        }
        Ok(policy)
    };
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((name, bytes)) = wasm.get(i) else {
                        break;
                    };
                    let result = load(name, bytes);
                    *results[i].locked() = Some(result);
                }
            });
        }
    });
    results
        .into_iter()
        .map(|r| {
            crate::sync::into_value(r).unwrap_or_else(|| {
                Err(nmo_policy_runtime::Error::Engine("a policy load did not finish".into()).into())
            })
        })
        .collect()
}

/// A policy's settings from `policies.yaml`, every value as its text.
fn settings_of(name: &str, raw: &BTreeMap<String, serde_json::Value>) -> Result<Settings> {
    let mut out = BTreeMap::new();
    for (key, value) in raw {
        let text = match value {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            other => {
                return Err(Error::Set(format!(
                    "{CONFIG_FILE}: settings of {name}: {key} must be a string, number or \
                     boolean, not {}",
                    match other {
                        serde_json::Value::Null => "empty",
                        serde_json::Value::Array(_) => "a list",
                        _ => "a map",
                    }
                )));
            }
        };
        out.insert(key.clone(), text);
    }
    Ok(Settings::from_map(&out))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RuleFile {
    node_selector: serde_json::Value,
    policy: String,
}

#[derive(Debug)]
struct Rule {
    selector: Selector,
    shown: String,
    policy: String,
}

/// The files of a policy directory at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// File name to contents, for `.wasm` files and `policies.yaml`.
    pub files: BTreeMap<String, Vec<u8>>,
    /// SHA-256 over names and contents: equal snapshots, equal sets.
    pub fingerprint: String,
}

impl Snapshot {
    /// Reads a policy directory. A ConfigMap mount is read through its
    /// `..data` link; hidden files and files other than `.wasm` and
    /// `policies.yaml` are ignored.
    pub fn read(dir: &Path) -> Result<Self> {
        let err = |what: String| Error::Set(format!("policy directory {}: {what}", dir.display()));
        let data = dir.join("..data");
        let root: PathBuf = if data.exists() {
            // Resolve the link once: the timestamped directory behind it is
            // never modified, only replaced.
            std::fs::canonicalize(&data).map_err(|e| err(format!("resolving ..data: {e}")))?
        } else {
            dir.to_owned()
        };
        let entries = std::fs::read_dir(&root).map_err(|e| err(format!("cannot read: {e}")))?;
        let mut files = BTreeMap::new();
        for entry in entries {
            let entry = entry.map_err(|e| err(format!("cannot read: {e}")))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !(name.ends_with(".wasm") || name == CONFIG_FILE) {
                continue;
            }
            let path = entry.path();
            if !path.is_file() {
                continue;
            }
            let bytes = read_capped(&path).map_err(|e| err(format!("cannot read {name}: {e}")))?;
            files.insert(name, bytes);
        }
        Ok(Self::from_files(files))
    }

    /// A snapshot of these files (a ConfigMap's keys, say): the `.wasm`
    /// files and `policies.yaml`; other names are left out, as in a
    /// directory.
    pub fn from_files(files: BTreeMap<String, Vec<u8>>) -> Self {
        let files: BTreeMap<String, Vec<u8>> = files
            .into_iter()
            .filter(|(name, _)| {
                !name.starts_with('.') && (name.ends_with(".wasm") || name == CONFIG_FILE)
            })
            .collect();
        let mut h = Sha256::new();
        for (name, bytes) in &files {
            h.update((name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        }
        let fingerprint = nmo_policy_runtime::digest::hex(&h.finalize());
        Snapshot { files, fingerprint }
    }

    /// The snapshot with the policies its `policies.yaml` pulls from OCI
    /// registries (`pull:`) added as `<name>.wasm`, each verified against
    /// its pinned digest. The fingerprint stays the directory's: the
    /// references are pinned, so equal directories pull equal policies.
    pub fn with_pulled(mut self, registry: &super::oci::Registry) -> Result<Self> {
        let config = config_of(&self)?;
        for (name, reference) in &config.pull {
            let what = format!("{CONFIG_FILE}: pull: {name}");
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            {
                return Err(Error::Set(format!(
                    "{what}: a policy's name is letters, digits, '-', '_' and '.'"
                )));
            }
            let file = format!("{name}.wasm");
            if self.files.contains_key(&file) {
                return Err(Error::Set(format!(
                    "{what}: the directory has {file} as well; keep one of the two"
                )));
            }
            let pinned = super::oci::Pinned::parse(reference)?;
            let bytes = registry.fetch(&pinned)?;
            self.files.insert(file, bytes.as_ref().clone());
        }
        Ok(self)
    }

    /// The policies `policies.yaml` pulls from OCI registries: name to
    /// reference (none when the file cannot be read).
    pub fn pulled(&self) -> BTreeMap<String, String> {
        config_of(self).map(|c| c.pull).unwrap_or_default()
    }

    /// Whether `policies.yaml` names policies to pull (a reload that
    /// failed on a pull is tried again at the next poll: the registry may
    /// be back).
    pub fn pulls(&self) -> bool {
        config_of(self).is_ok_and(|c| !c.pull.is_empty())
    }
}

/// Largest file read from a policy directory; the engine's own limit on a
/// policy's size is lower (see `CompileLimits`), this only keeps a stray
/// huge file from being read into memory.
const MAX_FILE_BYTES: u64 = 16 << 20;

/// Reads a file, refusing one over [`MAX_FILE_BYTES`] without reading it all.
fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {} MiB",
            MAX_FILE_BYTES >> 20
        )));
    }
    Ok(bytes)
}

/// Loaded policies and the rules choosing among them. Immutable: a reload
/// builds a new set.
#[derive(Debug)]
pub struct PolicySet {
    policies: BTreeMap<String, Policy>,
    default: String,
    rules: Vec<Rule>,
    fingerprint: String,
    access: super::access::Access,
}

/// Which policy decides for a maintenance, and why.
#[derive(Debug, Clone)]
pub struct Selected {
    pub policy: Policy,
    /// The name in the set (`builtin`, or a file name without `.wasm`).
    pub name: String,
    /// How it was chosen: `annotation`, `rule <selector>` or `default`.
    pub why: String,
}

impl Selected {
    /// How the NodeMaintenance's status records it:
    /// `name@sha256:<first 12 hex digits>`.
    pub fn label(&self) -> String {
        let digest = self.policy.digest();
        format!("{}@sha256:{}", self.name, &digest[..digest.len().min(12)])
    }
}

impl PolicySet {
    /// A set of one policy, used for everything (`--policy FILE`, tests).
    pub fn single(policy: Policy) -> Self {
        let name = policy.name().trim_end_matches(".wasm").to_owned();
        PolicySet {
            fingerprint: policy.digest().to_owned(),
            policies: BTreeMap::from([(name.clone(), policy)]),
            default: name,
            rules: Vec::new(),
            access: super::access::Access::default(),
        }
    }

    /// Compiles (or takes from `cache`) and self-checks every policy of
    /// a snapshot and checks its configuration. Any error rejects the whole
    /// set: a set is used complete or not at all. Policies that pass their
    /// self-check are cached; once the whole set loads, artifacts of
    /// policies not in it are pruned from the cache.
    pub fn load(
        engine: &PolicyEngine,
        snap: &Snapshot,
        cache: Option<&PolicyCache>,
    ) -> Result<Self> {
        let config = config_of(snap)?;
        for (name, reference) in &config.pull {
            if !snap.files.contains_key(&format!("{name}.wasm")) {
                return Err(Error::Set(format!(
                    "{CONFIG_FILE}: pull: {name} ({reference}) was not pulled: load the set \
                     through Snapshot::with_pulled"
                )));
            }
        }
        let mut policies = BTreeMap::new();
        let builtin =
            engine.load_cached(BUILTIN, nmo_policy_runtime::DEFAULT_POLICY_WASM, cache)?;
        if let Some(cache) = cache {
            builtin.cache_in(cache);
        }
        policies.insert(BUILTIN.to_owned(), builtin);
        let mut wasm = Vec::new();
        for (file, bytes) in &snap.files {
            let Some(name) = file.strip_suffix(".wasm") else {
                continue;
            };
            if name == BUILTIN {
                return Err(Error::Set(format!(
                    "{file}: the name {BUILTIN:?} is reserved for the embedded default policy"
                )));
            }
            wasm.push((name, bytes.as_slice()));
        }
        for (name, loaded) in wasm.iter().map(|w| w.0).zip(load_all(engine, &wasm, cache)) {
            policies.insert(name.to_owned(), loaded?);
        }
        // policies.yaml names the embedded default `builtin`: a `default`
        // there names a policy file, so removing that file is refused
        // rather than quietly falling back to the embedded one.
        let known = |name: &str, what: &str| -> Result<()> {
            if policies.contains_key(name) {
                Ok(())
            } else {
                Err(Error::Set(format!(
                    "{CONFIG_FILE}: {what} names policy {name:?}, which is not in the directory \
                     (policies: {})",
                    policies.keys().cloned().collect::<Vec<_>>().join(", ")
                )))
            }
        };
        let default = match config.default {
            Some(d) => {
                known(&d, "default")?;
                d
            }
            None if policies.contains_key("default") => "default".to_owned(),
            None => BUILTIN.to_owned(),
        };
        let mut rules = Vec::new();
        for (i, r) in config.rules.into_iter().enumerate() {
            let what = format!("rule {}", i + 1);
            known(&r.policy, &what)?;
            let (selector, shown) = selector::from_value(&r.node_selector)
                .map_err(|e| Error::Set(format!("{CONFIG_FILE}: {what}: nodeSelector: {e}")))?;
            if selector.selects_all() {
                return Err(Error::Set(format!(
                    "{CONFIG_FILE}: {what}: an empty nodeSelector would match every node; use \
                     `default` instead"
                )));
            }
            rules.push(Rule {
                selector,
                shown,
                policy: r.policy,
            });
        }
        for name in config.settings.keys() {
            known(name, "settings")?;
        }
        let access = super::access::Access::from_file(config.access)
            .map_err(|e| Error::Set(format!("{CONFIG_FILE}: {e}")))?;
        // Every policy checks its settings (none, for most): one that needs
        // a setting it was not given refuses the set too.
        for (name, policy) in policies.iter_mut() {
            let settings = match config.settings.get(name) {
                Some(raw) => settings_of(name, raw)?,
                None => Settings::default(),
            };
            *policy = policy.with_settings(settings)?;
        }
        if let Some(cache) = cache {
            cache.prune(policies.values().map(Policy::cache_key));
        }
        Ok(PolicySet {
            policies,
            default,
            rules,
            fingerprint: snap.fingerprint.clone(),
            access,
        })
    }

    /// The set with only the embedded default policy.
    pub fn builtin(engine: &PolicyEngine, cache: Option<&PolicyCache>) -> Result<Self> {
        let snap = Snapshot {
            files: BTreeMap::new(),
            fingerprint: String::new(),
        };
        Self::load(engine, &snap, cache)
    }

    /// Picks the policy for a maintenance: its annotation, else the first
    /// rule matching the node's labels (when the node is known), else the
    /// default.
    pub fn select(
        &self,
        annotation: Option<&str>,
        node_labels: Option<&BTreeMap<String, String>>,
    ) -> Result<Selected> {
        let pick = |name: &str, why: String| self.named(name, why);
        if let Some(name) = annotation.map(str::trim).filter(|s| !s.is_empty()) {
            if let Some(why) = self.access.annotation_not_allowed(name) {
                return Err(Error::Set(why));
            }
            return pick(name, format!("annotation {POLICY_ANNOTATION}"));
        }
        if let Some(labels) = node_labels
            && let Some(rule) = self.rules.iter().find(|r| r.selector.matches(labels))
        {
            return pick(&rule.policy, format!("rule nodeSelector {}", rule.shown));
        }
        pick(&self.default, "default".to_owned())
    }

    /// The name a policy goes by in the set: in a maintenance's
    /// annotation (and wherever one is looked up by name), `default` names
    /// the embedded default, as it is called outside a set, unless the set
    /// has a policy of that name.
    fn resolve<'a>(&self, name: &'a str) -> &'a str {
        if name == nmo_policy_runtime::DEFAULT_POLICY_NAME && !self.policies.contains_key(name) {
            BUILTIN
        } else {
            name
        }
    }

    /// The policy called `name`.
    fn named(&self, name: &str, why: String) -> Result<Selected> {
        let name = self.resolve(name);
        match self.policies.get(name) {
            Some(p) => Ok(Selected {
                policy: p.clone(),
                name: name.to_owned(),
                why,
            }),
            None => Err(Error::NotFound {
                name: name.to_owned(),
                available: self.names().join(", "),
            }),
        }
    }

    /// Picks the policy for a maintenance as the operator does at its first
    /// decision: the one recorded in its status (it began under an earlier
    /// process: a restart, a new leader), by name, if the set still has
    /// it; else by [`PolicySet::select`].
    pub(crate) fn select_for(
        &self,
        nm: &crate::crd::NodeMaintenance,
        node_labels: Option<&BTreeMap<String, String>>,
    ) -> Result<Selected> {
        use kube::ResourceExt;
        let recorded = nm.status.as_ref().and_then(|s| s.policy.as_deref());
        if let Some(r) = recorded {
            let (name, digest) = r.rsplit_once("@sha256:").unwrap_or((r, ""));
            match self.named(name, String::new()) {
                Ok(mut s) => {
                    s.why = format!("recorded in status ({r})");
                    if !s.policy.digest().starts_with(digest) {
                        tracing::warn!(nodeMaintenance = %nm.name_any(), policy = %name, "the policy changed since the maintenance began; its current version decides");
                    }
                    return Ok(s);
                }
                Err(_) => {
                    tracing::warn!(nodeMaintenance = %nm.name_any(), policy = %name, "the policy the maintenance began with is no longer loaded; choosing again");
                }
            }
        }
        let annotation = nm.annotations().get(POLICY_ANNOTATION).map(String::as_str);
        self.select(annotation, node_labels)
    }

    /// Who may take which node down and choose a policy (policies.yaml's
    /// `access`).
    pub fn access(&self) -> &super::access::Access {
        &self.access
    }

    /// The names of the policies, sorted.
    pub fn names(&self) -> Vec<String> {
        self.policies.keys().cloned().collect()
    }

    /// Whether the set has a policy of this name.
    pub fn contains(&self, name: &str) -> bool {
        self.policies.contains_key(self.resolve(name))
    }

    /// The default policy's name.
    pub fn default_name(&self) -> &str {
        &self.default
    }

    /// The snapshot fingerprint the set was built from.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// One line for logs and the readiness detail.
    pub fn summary(&self) -> String {
        let names: BTreeSet<&str> = self.policies.keys().map(String::as_str).collect();
        format!(
            "{} policies ({}), default {}, {} rules",
            names.len(),
            names.into_iter().collect::<Vec<_>>().join(", "),
            self.default,
            self.rules.len()
        )
    }
}
