//! `nmo plan`: what a maintenance of a node would do, before it is
//! started (or what a running one's policy decides now), without changing
//! anything in the cluster.
//!
//! The plan is the policy's own answer to the records the operator would
//! build (the same conversion, the same validation), completed with what
//! the cluster says now: the PodDisruptionBudget covering each eviction
//! and whether it would refuse it at this moment.

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

impl Report {
    /// What this plan decides otherwise than `baseline` (another policy's
    /// plan of the same node), one line a pod (`shop/db-0: evict, wave 0
    /// → surge, wave 1`) and one for the attempt's timeout or concurrency
    /// when they differ; empty when every pod is decided alike.
    pub fn differences(&self, baseline: &Report) -> Vec<String> {
        let decided = |p: &PodPlan| {
            let mut d = format!("{}, wave {}", p.action, p.wave);
            if let Some(g) = p
                .grace_period_seconds
                .filter(|_| matches!(p.action.as_str(), "evict" | "delete"))
            {
                d.push_str(&format!(", grace {g}s"));
            }
            d
        };
        let mut out = Vec::new();
        if self.attempt_timeout_seconds != baseline.attempt_timeout_seconds
            || self.max_concurrent_removals != baseline.max_concurrent_removals
        {
            out.push(format!(
                "attempt: {}s, {} removal(s) at once → {}s, {} at once",
                baseline.attempt_timeout_seconds,
                baseline.max_concurrent_removals,
                self.attempt_timeout_seconds,
                self.max_concurrent_removals
            ));
        }
        for pod in &self.pods {
            let was = baseline
                .pods
                .iter()
                .find(|b| b.namespace == pod.namespace && b.name == pod.name);
            let now = decided(pod);
            let before = was.map_or_else(|| "(not planned)".to_owned(), decided);
            if now != before {
                let why = pod
                    .reason
                    .as_deref()
                    .or(pod.detail.as_deref())
                    .map(|r| format!(" ({})", crate::text::clean(r, 120)))
                    .unwrap_or_default();
                out.push(format!(
                    "{}/{}: {before} → {now}{why}",
                    pod.namespace, pod.name
                ));
            }
        }
        out
    }

    /// The table `nmo plan` prints by default.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(out, "Node:        {}", self.node);
        if let Some(m) = &self.maintenance {
            let _ = writeln!(
                out,
                "Maintenance: {} ({}, {} pod(s) pending)",
                m.name,
                m.phase.as_deref().unwrap_or("not started"),
                m.pending_pods.len()
            );
        }
        let _ = writeln!(
            out,
            "Policy:      {} (sha256 {}), chosen by {}; from {}",
            self.policy.name,
            &self.policy.digest[..self.policy.digest.len().min(12)],
            self.policy.chosen_by,
            self.policy.source
        );
        let _ = writeln!(
            out,
            "Attempt:     {} per attempt, {} removal(s) at once{}",
            crate::text::duration(std::time::Duration::from_secs_f64(
                self.attempt_timeout_seconds
            )),
            self.max_concurrent_removals,
            if self.policy_concurrency_limit.is_some() {
                " (the policy's limit)"
            } else {
                " (no policy limit)"
            }
        );
        let _ = writeln!(out, "Admission:   {}", self.admission);
        let s = &self.summary;
        let _ = writeln!(
            out,
            "Summary:     {} evict, {} delete, {} skip, {} block{}, in {} wave(s); {} eviction(s) a budget would refuse now\n",
            s.evict,
            s.delete,
            s.skip,
            s.block,
            [("surge", s.surge), ("notify", s.notify), ("wait", s.wait)]
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(w, n)| format!(", {n} {w}"))
                .collect::<String>(),
            s.waves,
            s.refused_now
        );
        let rows: Vec<[String; 7]> = self
            .pods
            .iter()
            .map(|p| {
                let pdb = p
                    .pdbs
                    .iter()
                    .map(|b| format!("{} (allows {})", b.name, b.disruptions_allowed))
                    .collect::<Vec<_>>()
                    .join(", ");
                let mut note = match (&p.reason, &p.detail) {
                    (Some(r), Some(d)) => format!("{d} ({r})"),
                    (r, d) => d.clone().or(r.clone()).unwrap_or_default(),
                };
                if p.refused_now {
                    note = if p.pdbs.len() > 1 {
                        "refused now: more than one budget covers it".into()
                    } else if p.pdbs.iter().all(|b| b.disruptions_allowed <= 0) {
                        "refused now: its budget allows no disruption".into()
                    } else {
                        "refused now: the evictions before it spend its budget".into()
                    };
                }
                [
                    p.wave.to_string(),
                    p.namespace.clone(),
                    p.name.clone(),
                    p.action.clone(),
                    p.grace_period_seconds
                        .map_or_else(|| "-".into(), |g| format!("{g}s")),
                    if pdb.is_empty() { "-".into() } else { pdb },
                    crate::text::clean(&note, 200),
                ]
            })
            .collect();
        let header = [
            "WAVE",
            "NAMESPACE",
            "POD",
            "ACTION",
            "GRACE",
            "PDB",
            "REASON / NOTE",
        ]
        .map(String::from);
        write_table(&mut out, &header, &rows);
        out
    }
}

/// `nmo plan --fleet`: every maintenance that holds or waits for a node,
/// in the order the operator takes them, each node's plan, the
/// PodDisruptionBudgets' headroom spent across nodes, and an estimate.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FleetReport {
    /// In order: the admitted ones (as admitted), then the waiting ones
    /// (first created, first served).
    pub maintenances: Vec<FleetEntry>,
    /// Every budget an eviction of the fleet meets, its headroom spent by
    /// the nodes in order.
    pub budgets: Vec<BudgetUse>,
    pub estimate: Estimate,
    /// Maintenances whose node does not exist (the Go operator leaves
    /// them behind): not planned, named here.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing_nodes: Vec<MissingNode>,
}

/// A maintenance of a node that does not exist.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MissingNode {
    pub maintenance: String,
    pub node: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FleetEntry {
    /// 1 for the first.
    pub order: usize,
    pub plan: Report,
    /// Evictions of this node a budget would refuse when the nodes before
    /// it have spent its headroom (and the budget has not recovered).
    pub refused_across_fleet: usize,
    /// This node's part of the estimate, in seconds.
    pub estimate_seconds: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BudgetUse {
    pub namespace: String,
    pub name: String,
    /// `status.disruptionsAllowed` now.
    pub disruptions_allowed: i32,
    /// Evictions it covers, over the fleet.
    pub evictions: usize,
    /// The first maintenance whose eviction it would refuse (its headroom
    /// spent by the ones before), if any.
    pub runs_out_at: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Estimate {
    /// The fleet's time, in seconds.
    pub seconds: f64,
    /// Maintenances drained at once (the ones admitted now, at least 1).
    pub parallel: usize,
    /// What the estimate is made of, in words.
    pub made_of: String,
}

/// What the estimate adds for each eviction a budget refuses: kubectl's
/// retry (the operator's fallback when the budget's watch shows no change).
const REFUSED_SECONDS: f64 = 5.0;
/// A pod's grace period when it sets none (the API's default).
const DEFAULT_GRACE: f64 = 30.0;

/// Plans every maintenance of the cluster that holds or waits for a node
/// (not Failed, not being deleted); changes nothing.
pub async fn plan_fleet(
    client: &Client,
    engine: &PolicyEngine,
    source: &Source,
    policy: Option<String>,
) -> Result<FleetReport> {
    let (set, origin) = load_set(Some(client), engine, source).await?;
    let mut all: Vec<NodeMaintenance> = Api::<NodeMaintenance>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing the NodeMaintenances"))?
        .items
        .into_iter()
        .filter(|nm| {
            nm.metadata.deletion_timestamp.is_none()
                && nm.status.as_ref().and_then(|s| s.phase)
                    != Some(crate::crd::MaintenancePhase::Failed)
        })
        .collect();
    all.sort_by_key(fleet_order);
    let mut entries = Vec::new();
    let mut missing_nodes = Vec::new();
    let nodes: Api<Node> = Api::all(client.clone());
    for nm in all.iter() {
        // A maintenance of a node that does not exist has nothing to
        // plan; it does not stop the others'.
        if nodes
            .get_opt(&nm.spec.node_name)
            .await
            .map_err(Error::kube("reading the node"))?
            .is_none()
        {
            missing_nodes.push(MissingNode {
                maintenance: nm.name_any(),
                node: nm.spec.node_name.clone(),
            });
            continue;
        }
        let i = entries.len();
        let request = Request {
            node: None,
            maintenance: Some(nm.name_any()),
            policy: policy.clone(),
            source: source.clone(),
        };
        let plan = plan_in(client, &set, &origin, &request).await?;
        entries.push(FleetEntry {
            order: i + 1,
            plan,
            refused_across_fleet: 0,
            estimate_seconds: 0.0,
        });
    }
    let budgets = spend_across(&mut entries);
    for e in &mut entries {
        e.estimate_seconds =
            node_estimate(&e.plan) + e.refused_across_fleet as f64 * REFUSED_SECONDS;
    }
    let estimate = fleet_estimate(&entries);
    Ok(FleetReport {
        maintenances: entries,
        budgets,
        estimate,
        missing_nodes,
    })
}

/// Admitted first (by when), then waiting (by creation, then name).
fn fleet_order(nm: &NodeMaintenance) -> (bool, i64, String) {
    let admitted = crate::crd::is_admitted(nm);
    let at = |t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        t.map_or(0, |t| t.0.as_millisecond())
    };
    let when = if admitted {
        at(nm
            .status
            .as_ref()
            .and_then(|s| s.admitted_at.as_ref())
            .or(nm.metadata.creation_timestamp.as_ref()))
    } else {
        at(nm.metadata.creation_timestamp.as_ref())
    };
    (!admitted, when, nm.name_any())
}

/// Spends each budget's headroom over the nodes in order (each node's
/// evictions in its plan's order); counts the refusals per node.
fn spend_across(entries: &mut [FleetEntry]) -> Vec<BudgetUse> {
    let mut uses: BTreeMap<(String, String), BudgetUse> = BTreeMap::new();
    let mut headroom: BTreeMap<(String, String), i64> = BTreeMap::new();
    for e in entries.iter_mut() {
        let mut refused = 0;
        let maintenance = e
            .plan
            .maintenance
            .as_ref()
            .map_or_else(|| e.plan.node.clone(), |m| m.name.clone());
        for pod in e.plan.pods.iter().filter(|p| !p.pdbs.is_empty()) {
            let keys: Vec<(String, String)> = pod
                .pdbs
                .iter()
                .map(|b| (pod.namespace.clone(), b.name.clone()))
                .collect();
            for (key, b) in keys.iter().zip(&pod.pdbs) {
                let u = uses.entry(key.clone()).or_insert_with(|| BudgetUse {
                    namespace: key.0.clone(),
                    name: key.1.clone(),
                    disruptions_allowed: b.disruptions_allowed,
                    evictions: 0,
                    runs_out_at: None,
                });
                u.evictions += 1;
                headroom
                    .entry(key.clone())
                    .or_insert(i64::from(b.disruptions_allowed));
            }
            let refuses = keys.len() > 1 || keys.iter().any(|k| headroom[k] <= 0);
            if refuses {
                refused += 1;
                for k in &keys {
                    if let Some(u) = uses.get_mut(k)
                        && u.runs_out_at.is_none()
                    {
                        u.runs_out_at = Some(maintenance.clone());
                    }
                }
            } else {
                for k in &keys {
                    if let Some(n) = headroom.get_mut(k) {
                        *n -= 1;
                    }
                }
            }
        }
        e.refused_across_fleet = refused;
    }
    uses.into_values().collect()
}

/// A node's drain: for each wave, the longest of its removals' grace
/// periods and of its handshake or wait deadlines.
fn node_estimate(plan: &Report) -> f64 {
    let mut by_wave: BTreeMap<u32, f64> = BTreeMap::new();
    for p in &plan.pods {
        if matches!(p.action.as_str(), "skip" | "block") {
            continue;
        }
        let grace = p.grace_period_seconds.map_or(DEFAULT_GRACE, |g| g as f64);
        let longest = by_wave.entry(p.wave).or_default();
        *longest = longest.max(grace + p.wait_seconds.unwrap_or(0.0));
    }
    by_wave.values().sum()
}

/// The fleet: the maintenances admitted now drain at once; the others
/// follow in order, as many at a time.
fn fleet_estimate(entries: &[FleetEntry]) -> Estimate {
    let parallel = entries
        .iter()
        .filter(|e| e.plan.admission == "admitted" || e.plan.admission == "admit")
        .count()
        .max(1);
    let seconds = entries
        .chunks(parallel)
        .map(|batch| {
            batch
                .iter()
                .map(|e| e.estimate_seconds)
                .fold(0.0_f64, f64::max)
        })
        .sum();
    Estimate {
        seconds,
        parallel,
        made_of: format!(
            "for each node, the sum over its waves of the longest grace period (30 s when a pod sets none) \
             plus handshake and wait deadlines of the wave's pods (upper bounds: pods that stop at SIGTERM \
             take less), plus {REFUSED_SECONDS} s for each eviction a budget would refuse once the nodes \
             before it spent its headroom; {parallel} node(s) at a time (those admitted now), in order. \
             Not in it: replacements' start-up, the volume wait, retries after failures."
        ),
    }
}

impl FleetReport {
    /// The table `nmo plan --fleet` prints.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Fleet:       {} maintenance(s); about {} at {} node(s) at a time",
            self.maintenances.len(),
            crate::text::duration(std::time::Duration::from_secs_f64(self.estimate.seconds)),
            self.estimate.parallel
        );
        // A budget that allows no eviction now holds its pods until it
        // does (a replica comes back, someone relaxes it): no estimate
        // covers that wait.
        let blocked: Vec<String> = self
            .budgets
            .iter()
            .filter(|b| b.disruptions_allowed <= 0 && b.evictions > 0)
            .map(|b| format!("{}/{} ({} eviction(s))", b.namespace, b.name, b.evictions))
            .collect();
        if !blocked.is_empty() {
            let _ = writeln!(
                out,
                "Held:        {} allow(s) no eviction now; the estimate assumes they will, and the drain waits until they do",
                blocked.join(", ")
            );
        }
        let _ = writeln!(out, "Estimate:    {}\n", self.estimate.made_of);
        let rows: Vec<[String; 8]> = self
            .maintenances
            .iter()
            .map(|e| {
                let p = &e.plan;
                [
                    e.order.to_string(),
                    p.maintenance
                        .as_ref()
                        .map_or_else(|| "-".into(), |m| m.name.clone()),
                    p.node.clone(),
                    p.policy.name.clone(),
                    p.summary.waves.to_string(),
                    (p.summary.evict + p.summary.delete + p.summary.surge + p.summary.notify)
                        .to_string(),
                    e.refused_across_fleet.to_string(),
                    crate::text::clean(&p.admission, 120),
                ]
            })
            .collect();
        let header = [
            "ORDER",
            "MAINTENANCE",
            "NODE",
            "POLICY",
            "WAVES",
            "REMOVALS",
            "REFUSED",
            "ADMISSION",
        ]
        .map(String::from);
        write_table(&mut out, &header, &rows);
        if !self.budgets.is_empty() {
            let _ = writeln!(out);
            let rows: Vec<[String; 4]> = self
                .budgets
                .iter()
                .map(|b| {
                    [
                        format!("{}/{}", b.namespace, b.name),
                        b.disruptions_allowed.to_string(),
                        b.evictions.to_string(),
                        b.runs_out_at.clone().unwrap_or_else(|| "-".into()),
                    ]
                })
                .collect();
            let header = ["BUDGET", "ALLOWS", "EVICTIONS", "RUNS OUT AT"].map(String::from);
            write_table(&mut out, &header, &rows);
        }
        for m in &self.missing_nodes {
            let _ = writeln!(
                out,
                "\nNot planned: {} names node {:?}, which does not exist (the operator fails it; delete it)",
                m.maintenance, m.node
            );
        }
        out
    }
}

/// Columns padded to their widest cell.
fn write_table<const N: usize>(out: &mut String, header: &[String; N], rows: &[[String; N]]) {
    use std::fmt::Write;
    let widths: Vec<usize> = (0..N)
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in std::iter::once(header).chain(rows.iter()) {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
}
