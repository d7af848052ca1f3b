//! `nmo plan`: what a maintenance of a node would do, before it is
//! started (or what a running one's policy decides now), without changing
//! anything in the cluster.
//!
//! The plan is the policy's own answer to the records the operator would
//! build (the same conversion, the same validation), completed with what
//! the cluster says now: the PodDisruptionBudget covering each eviction
//! and whether it would refuse it at this moment.
//!
//! Here: one node's plan, computed. `fleet`: the fleet's. `render`: both
//! as a user reads them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde::Serialize;

use crate::cluster::HOST_MAX_CONCURRENT;
use crate::crd::{NodeMaintenance, NodeMaintenanceSpec};
use crate::error::{Error, Result};
use crate::policy::set::Snapshot;
use crate::policy::{self, Action, PolicyEngine, PolicySet, Selected};

/// Where the policies come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A policy directory, read as the operator reads its `--policy-dir`.
    Dir(PathBuf),
    /// The operator's policies ConfigMap in the cluster (what a running
    /// operator has mounted); the embedded default when it does not exist.
    ConfigMap { namespace: String, name: String },
    /// One policy file for everything, as the operator's `--policy`.
    File(PathBuf),
    /// The embedded default policy.
    Embedded,
}

/// The namespace and name of the policies ConfigMap `deploy/` installs.
pub const DEFAULT_CONFIGMAP: (&str, &str) = (
    "node-maintenance-operator-system",
    "node-maintenance-operator-policies",
);

/// What to plan.
#[derive(Debug, Clone)]
pub struct Request {
    /// The node (ignored with `maintenance`: the maintenance's node).
    pub node: Option<String>,
    /// A NodeMaintenance to plan for, as it is now.
    pub maintenance: Option<String>,
    /// A policy of the set to use, by name, instead of the one the
    /// operator would choose.
    pub policy: Option<String>,
    pub source: Source,
}

/// The plan, as `-o json` and `-o yaml` print it. Field names are stable.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub node: String,
    /// The maintenance planned for, when one was named.
    pub maintenance: Option<MaintenanceInfo>,
    pub policy: PolicyInfo,
    /// How long one drain attempt may take, in seconds.
    pub attempt_timeout_seconds: f64,
    /// Removals in flight at once: the policy's limit, capped by the host.
    pub max_concurrent_removals: u32,
    /// The policy's own limit, if it sets one.
    pub policy_concurrency_limit: Option<u32>,
    /// Whether the maintenance may start now, as the policy's `admit`
    /// answers on the cluster as it is: `admit`, `wait: <reason>`,
    /// `deny: <message>`, `admitted` for one already started, or
    /// `parked: <why>` for one its policy set aside.
    pub admission: String,
    /// Every pod on the node, in the order the drain handles them (by
    /// wave, then as listed).
    pub pods: Vec<PodPlan>,
    pub summary: Summary,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceInfo {
    pub name: String,
    pub phase: Option<String>,
    pub pending_pods: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyInfo {
    /// The name in the set (`builtin` for the embedded default).
    pub name: String,
    /// SHA-256 of the policy file, hex.
    pub digest: String,
    /// Why this one: `annotation …`, `rule nodeSelector …`, `default`,
    /// `recorded in status (…)`, or `--policy`.
    pub chosen_by: String,
    /// Where the set came from.
    pub source: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodPlan {
    pub namespace: String,
    pub name: String,
    /// The drain handles waves in order: a wave starts when the one
    /// before it is gone.
    pub wave: u32,
    /// `evict`, `delete`, `skip`, `block`, `surge`, `notify` or `wait`.
    pub action: String,
    /// What a surge, a handshake or a wait will do (its owner, deadlines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// For a handshake or a wait: the longest the drain waits for the pod,
    /// in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_seconds: Option<f64>,
    /// For evict and delete: the grace period the pod gets (the policy's,
    /// else the pod's own; `null`: the API's default of 30 s).
    pub grace_period_seconds: Option<i64>,
    /// For skip and block: the policy's reason.
    pub reason: Option<String>,
    /// For an eviction: the PodDisruptionBudgets covering the pod.
    pub pdbs: Vec<PdbInfo>,
    /// An eviction the API server would refuse at this moment: more than
    /// one budget covers the pod, or its budget's headroom is spent by the
    /// evictions before it in the plan (a budget allowing one lets the
    /// first of its pods go, not each of them).
    pub refused_now: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PdbInfo {
    pub name: String,
    pub disruptions_allowed: i32,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub evict: usize,
    pub delete: usize,
    pub skip: usize,
    pub block: usize,
    pub surge: usize,
    pub notify: usize,
    pub wait: usize,
    pub refused_now: usize,
    pub waves: usize,
}

/// Makes the plan: reads the node, its pods, their budgets and the
/// policies; asks the policy; changes nothing.
pub async fn plan(client: &Client, engine: &PolicyEngine, request: &Request) -> Result<Report> {
    let (set, origin) = load_set(Some(client), engine, &request.source).await?;
    plan_in(client, &set, &origin, request).await
}

/// A policy of the set, as `nmo policy list` shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Listed {
    /// Its name in the set (`NAME.wasm`; `builtin`: the embedded default).
    pub name: String,
    /// The first 12 hex digits of its sha256 (what `status.policy` shows).
    pub digest: String,
    /// Whether `policies.yaml` makes it the default.
    pub default: bool,
    /// Where it came from (a pulled one: its reference).
    pub source: String,
}

/// The policies of a set, loaded as the operator loads them (every one
/// compiled and self-checked; the pulled ones pulled and verified).
/// A folder or a file needs no cluster (`client`: none).
pub async fn list(
    client: Option<&Client>,
    engine: &PolicyEngine,
    source: &Source,
) -> Result<Vec<Listed>> {
    let (set, origin) = load_set(client, engine, source).await?;
    set.names()
        .into_iter()
        .map(|name| {
            let selected = set.select(Some(&name), None)?;
            let digest = selected.policy.digest();
            Ok(Listed {
                digest: digest[..digest.len().min(12)].to_owned(),
                default: name == set.default_name(),
                source: origin.of(&name),
                name,
            })
        })
        .collect()
}

/// Where a policy set came from: the source it was read from, and the
/// policies its `policies.yaml` pulled from OCI registries.
struct Origin {
    source: String,
    pulled: BTreeMap<String, String>,
}

impl Origin {
    fn from(source: impl Into<String>) -> Self {
        Origin {
            source: source.into(),
            pulled: BTreeMap::new(),
        }
    }

    /// Where the policy `name` came from: its reference, for a pulled one.
    fn of(&self, name: &str) -> String {
        if name == crate::policy::set::BUILTIN {
            return "embedded in nmo".into();
        }
        match self.pulled.get(name) {
            Some(reference) => format!(
                "{reference}, pulled as the policies.yaml of {} says",
                self.source
            ),
            None => self.source.clone(),
        }
    }
}

/// [`plan`] with the policy set loaded (from `origin`).
async fn plan_in(
    client: &Client,
    set: &PolicySet,
    origin: &Origin,
    request: &Request,
) -> Result<Report> {
    let maintenance = match &request.maintenance {
        Some(name) => Some(
            Api::<NodeMaintenance>::all(client.clone())
                .get(name)
                .await
                .map_err(Error::kube("reading the NodeMaintenance"))?,
        ),
        None => None,
    };
    let node_name = match (&maintenance, &request.node) {
        (Some(nm), _) => nm.spec.node_name.clone(),
        (None, Some(node)) => node.clone(),
        (None, None) => return Err(Error::Config("name a node or a maintenance".into())),
    };
    let node = Api::<Node>::all(client.clone())
        .get(&node_name)
        .await
        .map_err(Error::kube("reading the node"))?;
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
        .await
        .map_err(Error::kube("listing the node's pods"))?
        .items;
    // A maintenance not created yet is planned as the one `kubectl nm
    // start` would create.
    let nm = maintenance.clone().unwrap_or_else(|| {
        NodeMaintenance::new(
            &node_name,
            NodeMaintenanceSpec {
                node_name: node_name.clone(),
                reason: None,
            },
        )
    });
    let selected = match &request.policy {
        Some(name) => {
            let mut s = set.select(Some(name), None)?;
            s.why = "--policy".into();
            s
        }
        None => set.select_for(&nm, Some(node.labels()))?,
    };
    let source = origin.of(&selected.name);
    let (plan, unread) = decide(client, &selected, &nm, &node, &pods).await?;
    let budgets = budgets(client, &pods).await?;
    let admission = admission(client, &selected, &nm).await?;
    let mut report = report(
        &node_name,
        maintenance.as_ref(),
        &selected,
        source,
        &plan,
        &pods,
        &budgets,
    );
    no_workload(&mut report, &plan, &pods, &unread);
    report.admission = admission;
    Ok(report)
}

/// What the policy's `admit` answers for the maintenance now (it has
/// already admitted one that started).
async fn admission(client: &Client, selected: &Selected, nm: &NodeMaintenance) -> Result<String> {
    if crate::crd::is_admitted(nm) {
        // Set aside by its policy: it holds its node, but drains nothing.
        if let Some(p) = nm.status.as_ref().and_then(|s| s.parked.as_ref()) {
            return Ok(format!("parked: {}", p.reason));
        }
        return Ok("admitted".into());
    }
    let openshift = crate::admission::is_openshift(client).await;
    let around =
        crate::admission::listed(client, nm, openshift, crate::node_lease::DEFAULT_NAMESPACE)
            .await?;
    let record = policy::convert::maintenance(nm, 1, Timestamp::now());
    Ok(match around.ask(&selected.policy, record).await? {
        None => "the node does not exist".into(),
        Some(answer) => answer.to_string(),
    })
}

/// Where the policies a set pulls come from: the registries, with the
/// user's credentials (`~/.docker/config.json`).
fn registry() -> policy::oci::Registry {
    policy::oci::Registry::new(policy::oci::RegistryConfig::for_user(Vec::new()))
}

/// The keys of a policies ConfigMap (`binaryData` and `data`) as files.
pub fn configmap_files(cm: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (k, v) in cm.binary_data.iter().flatten() {
        files.insert(k.clone(), v.0.clone());
    }
    for (k, v) in cm.data.iter().flatten() {
        files.insert(k.clone(), v.clone().into_bytes());
    }
    files
}

/// A policy set from a ConfigMap's (or a directory's) files, loaded as the
/// operator loads it: pulled policies fetched, every policy checked,
/// `policies.yaml` read.
pub fn load_files(
    engine: &PolicyEngine,
    files: BTreeMap<String, Vec<u8>>,
) -> Result<(PolicySet, Snapshot)> {
    let snap = Snapshot::from_files(files).with_pulled(&registry())?;
    let set = PolicySet::load(engine, &snap, None)?;
    Ok((set, snap))
}

/// Loads the policy set, saying where from.
async fn load_set(
    client: Option<&Client>,
    engine: &PolicyEngine,
    source: &Source,
) -> Result<(PolicySet, Origin)> {
    match source {
        Source::Dir(dir) => {
            let snap = Snapshot::read(dir)?.with_pulled(&registry())?;
            let set = PolicySet::load(engine, &snap, None)?;
            let origin = Origin {
                source: format!("policy directory {}", dir.display()),
                pulled: snap.pulled(),
            };
            Ok((set, origin))
        }
        Source::Embedded => Ok((
            PolicySet::builtin(engine, None)?,
            Origin::from("embedded default"),
        )),
        Source::File(path) => {
            let policy = engine.load_file(path)?.alone()?;
            Ok((
                PolicySet::single(policy),
                Origin::from(format!("policy file {}", path.display())),
            ))
        }
        Source::ConfigMap { namespace, name } => {
            let client = client.ok_or_else(|| {
                Error::Config("reading the policies ConfigMap needs a cluster".into())
            })?;
            let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await
                .map_err(Error::kube("reading the policies ConfigMap"))?;
            let Some(cm) = cm else {
                let set = PolicySet::builtin(engine, None)?;
                return Ok((
                    set,
                    Origin::from(format!(
                        "embedded default (no ConfigMap {namespace}/{name})"
                    )),
                ));
            };
            let (set, snap) = load_files(engine, configmap_files(&cm))?;
            let origin = Origin {
                source: format!("ConfigMap {namespace}/{name}"),
                pulled: snap.pulled(),
            };
            Ok((set, origin))
        }
    }
}

/// Says, in the detail of each pod whose owner reference cannot be read,
/// that the policy decided it without a workload, and why.
fn no_workload(
    report: &mut Report,
    plan: &policy::Plan,
    pods: &[Pod],
    unread: &[policy::workloads::Unread],
) {
    for (step, pod_plan) in plan.steps.iter().zip(report.pods.iter_mut()) {
        let uid = pods[step.pod].metadata.uid.as_deref().unwrap_or_default();
        if let Some(u) = unread.iter().find(|u| u.uid == uid) {
            let said = format!("no workload for the policy: {}", u.why);
            pod_plan.detail = Some(match pod_plan.detail.take() {
                Some(d) => format!("{d}; {said}"),
                None => said,
            });
        }
    }
}

/// The policy's plan, on the blocking pool, as the operator asks for it
/// (with the pods' workloads read, for a policy that reads them), and the
/// pods whose owner could not be read.
async fn decide(
    client: &Client,
    selected: &Selected,
    nm: &NodeMaintenance,
    node: &Node,
    pods: &[Pod],
) -> Result<(policy::Plan, Vec<policy::workloads::Unread>)> {
    let workloads = if selected.policy.reads_workloads() {
        crate::cluster::workloads::read(
            client,
            &Default::default(),
            (&Default::default(), &|_: &str| false),
            pods,
        )
        .await
        .map_err(Error::kube("reading the pods' workloads"))?
    } else {
        policy::Workloads::default()
    };
    let unread = workloads.unread().to_vec();
    let record = policy::convert::maintenance(nm, 1, Timestamp::now());
    let (p, node, pods) = (selected.policy.clone(), node.clone(), pods.into());
    let plan = policy::decide(policy::Decision::PlanDrain, move || {
        p.plan_drain_shared(&record, node, pods, policy::History::default(), workloads)
    })
    .await
    .map_err(Error::from)?;
    Ok((plan, unread))
}

/// The PodDisruptionBudgets of the namespaces the pods are in.
async fn budgets(
    client: &Client,
    pods: &[Pod],
) -> Result<BTreeMap<String, Vec<PodDisruptionBudget>>> {
    let mut by_namespace = BTreeMap::new();
    for ns in pods.iter().filter_map(|p| p.namespace()) {
        if by_namespace.contains_key(&ns) {
            continue;
        }
        let list = Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .map_err(Error::kube("listing PodDisruptionBudgets"))?;
        by_namespace.insert(ns, list.items);
    }
    Ok(by_namespace)
}

/// The budgets whose selector picks `pod` (a budget without a selector
/// picks none; an empty one picks every pod of its namespace, as in
/// policy/v1).
fn covering(pod: &Pod, budgets: &[PodDisruptionBudget]) -> Vec<PdbInfo> {
    budgets
        .iter()
        .filter(|b| crate::cluster::covers(b, pod.labels()))
        .map(|b| PdbInfo {
            name: b.name_any(),
            disruptions_allowed: b.status.as_ref().map_or(0, |s| s.disruptions_allowed),
        })
        .collect()
}

/// For each step of `plan`: the budgets covering it (for an eviction),
/// and whether the API server would refuse it now were every eviction
/// sent at once: more than one budget covers the pod, or the evictions
/// before it (by wave, then in the plan's order) spend its budget's
/// headroom. A budget's headroom is spent across pods, not per pod.
fn budgets_spent(
    plan: &policy::Plan,
    pods: &[Pod],
    budgets: &BTreeMap<String, Vec<PodDisruptionBudget>>,
) -> (Vec<Vec<PdbInfo>>, Vec<bool>) {
    let covered: Vec<Vec<PdbInfo>> = plan
        .steps
        .iter()
        .map(|step| match step.action {
            Action::Evict(_) | Action::Surge(_) => covering(
                &pods[step.pod],
                budgets
                    .get(&step.namespace)
                    .map(Vec::as_slice)
                    .unwrap_or_default(),
            ),
            _ => Vec::new(),
        })
        .collect();
    let mut order: Vec<usize> = (0..plan.steps.len()).collect();
    order.sort_by_key(|i| plan.steps[*i].order);
    let mut headroom: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    let mut refused = vec![false; plan.steps.len()];
    for i in order {
        let pdbs = &covered[i];
        let ns = plan.steps[i].namespace.as_str();
        for p in pdbs {
            headroom
                .entry((ns, p.name.as_str()))
                .or_insert(i64::from(p.disruptions_allowed));
        }
        refused[i] = pdbs.len() > 1 || pdbs.iter().any(|p| headroom[&(ns, p.name.as_str())] <= 0);
        if !refused[i] {
            for p in pdbs {
                if let Some(n) = headroom.get_mut(&(ns, p.name.as_str())) {
                    *n -= 1;
                }
            }
        }
    }
    (covered, refused)
}

fn report(
    node: &str,
    maintenance: Option<&NodeMaintenance>,
    selected: &Selected,
    source: String,
    plan: &policy::Plan,
    pods: &[Pod],
    budgets: &BTreeMap<String, Vec<PodDisruptionBudget>>,
) -> Report {
    let mut summary = Summary::default();
    let mut waves = std::collections::BTreeSet::new();
    let (covered, refused) = budgets_spent(plan, pods, budgets);
    let pod_plans: Vec<PodPlan> = plan
        .steps
        .iter()
        .zip(covered.into_iter().zip(refused))
        .map(|(step, (pdbs, refused_now))| {
            let pod = &pods[step.pod];
            waves.insert(step.order);
            let own_grace = pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds);
            let action = step.action.verb();
            let grace = step
                .action
                .removal()
                .map(|r| r.grace_period_seconds.or(own_grace))
                .unwrap_or_default();
            let reason = step.action.reason().map(str::to_owned).or_else(|| {
                step.action
                    .removal()
                    .filter(|r| !r.rule.is_empty())
                    .map(|r| r.rule.clone())
            });
            match &step.action {
                Action::Evict(_) => summary.evict += 1,
                Action::Delete(_) => summary.delete += 1,
                Action::Skip { .. } => summary.skip += 1,
                Action::Block { .. } => summary.block += 1,
                Action::Surge(_) => summary.surge += 1,
                Action::Notify(_) => summary.notify += 1,
                Action::Wait { .. } => summary.wait += 1,
            }
            summary.refused_now += usize::from(refused_now);
            PodPlan {
                namespace: step.namespace.clone(),
                name: step.name.clone(),
                wave: step.order,
                action: action.to_owned(),
                detail: detail(&step.action, pod),
                wait_seconds: match &step.action {
                    Action::Notify(n) => Some(n.timeout.as_secs_f64()),
                    Action::Wait { timeout, .. } => Some(timeout.as_secs_f64()),
                    _ => None,
                },
                grace_period_seconds: grace,
                reason,
                pdbs,
                refused_now,
            }
        })
        .collect();
    summary.waves = waves.len();
    let limit = plan.max_concurrent_evictions.map(|n| n.get());
    Report {
        node: node.to_owned(),
        maintenance: maintenance.map(|nm| {
            let status = nm.status.clone().unwrap_or_default();
            MaintenanceInfo {
                name: nm.name_any(),
                phase: status.phase.map(|p| p.as_str().to_owned()),
                pending_pods: status.pending_pods.unwrap_or_default(),
            }
        }),
        policy: PolicyInfo {
            name: selected.name.clone(),
            digest: selected.policy.digest().to_owned(),
            chosen_by: selected.why.clone(),
            source,
        },
        attempt_timeout_seconds: plan.attempt_timeout.as_secs_f64(),
        max_concurrent_removals: limit.map_or(HOST_MAX_CONCURRENT as u32, |n| {
            n.min(HOST_MAX_CONCURRENT as u32)
        }),
        policy_concurrency_limit: limit,
        admission: String::new(),
        pods: pod_plans,
        summary,
    }
}

/// What a contract 0.3 action will do, in words.
fn detail(action: &Action, pod: &Pod) -> Option<String> {
    let d = crate::text::duration;
    match action {
        Action::Surge(_) => {
            let owner = pod
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true))
                .map(|o| format!("{} {}", o.kind, o.name))
                .unwrap_or_default();
            Some(format!(
                "one more replica through {owner} (its Deployment, if any); the pod goes once the replacement is Ready elsewhere"
            ))
        }
        Action::Notify(n) => Some(format!(
            "asks the application (nmo.medik8s.io/eviction-requested); waits up to {}{}, then {}",
            d(n.timeout),
            n.heartbeat
                .map(|h| format!(
                    ", heartbeats extend by {} (at most {})",
                    d(h),
                    d(n.timeout * 10)
                ))
                .unwrap_or_default(),
            if n.then_delete { "delete" } else { "evict" }
        )),
        Action::Wait { timeout, .. } => Some(format!(
            "waits up to {} for the pod to complete",
            d(*timeout)
        )),
        _ => None,
    }
}

mod fleet;
mod render;

pub use fleet::*;
