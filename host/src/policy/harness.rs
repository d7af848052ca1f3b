//! The policy test harness: run a policy on scenarios and compare its
//! answers with the expected ones.
//!
//! A scenario file is YAML, one scenario per document (`---` between
//! them). The objects are ordinary Kubernetes YAML, what
//! `kubectl get pod -o yaml` prints:
//!
//! ```yaml
//! name: StatefulSet pods go last, one at a time
//! maintenance:            # optional; a NodeMaintenance (default: nodeName node-1)
//!   metadata: {name: nm-1, annotations: {nmo.medik8s.io/give-up-after: 15m}}
//!   spec: {nodeName: node-1, reason: kernel upgrade}
//!   status: {phase: Running, drainProgress: 40}
//! elapsed: 12m            # optional: time since the maintenance was created
//! attempt: 3              # optional: the decision's attempt number (default 1)
//! now: 2026-12-05T22:30:00Z  # optional: what the policy's clock shows (default: when it runs)
//! node:                   # optional; a Node (default: named after spec.nodeName, cordoned)
//!   metadata: {name: node-1, labels: {storage: local}}
//! pods:                   # Pods, or the `kind: List` kubectl prints
//! podsFrom: pods.yaml     # or: a file of them, e.g. `kubectl get pods -o yaml > pods.yaml`
//!                         # as is (relative to this file; in a scenario directory
//!                         # such a file is data, not scenarios)
//!   - metadata: {name: db-0, namespace: default, ownerReferences: [...]}
//!     spec: {containers: [...]}
//! history:                # optional: what the drain did to a pod so far (drain-history)
//!   default/db-0: {pending: 20m, refusedEvictions: 12, attempts: 4, notified: 5m}
//! workloads:              # optional: the Deployments, ReplicaSets and StatefulSets behind
//!                         # the pods (a pod's `workload`), as kubectl prints them
//!   - {kind: ReplicaSet, metadata: {name: web-5d9, namespace: default,
//!       ownerReferences: [{kind: Deployment, name: web, controller: true}]}}
//!   - {kind: Deployment, metadata: {name: web, namespace: default}, spec: {replicas: 1}}
//! failure:                # optional: ask on-failure instead of plan-drain
//!   drainIncomplete: {pending: [default/db-0], timedOut: true, message: "..."}
//!   # drainIncomplete also takes waited: [ns/pod] (wait ran out)
//!   # or: nodeNotFound, {leaseHeld: holder}, {leaseError: msg}, {apiError: msg},
//!   #     {volumesAttached: [csi-abc]}
//! fleet:                  # optional: ask admit instead (may the maintenance start?)
//!   nodes:                # Nodes (Ready unless their status says otherwise); the
//!     - metadata: {name: node-2, labels: {topology.kubernetes.io/zone: a}}
//!                         # maintenance's node is added when not listed
//!   maintenances:         # the other unfinished NodeMaintenances
//!     - {node: node-2, admitted: true, since: 5m}   # name, phase, created, parked: optional
//!     - {node: node-3, admitted: false, created: 1m}
//!   openshiftEtcd: {budgets: 1, disruptionsAllowed: 0, guardReadyOnNode: true}
//!   history:              # maintenances that ended (seen within the policy's history-window)
//!     - {node: node-4, started: 50m, ended: 40m, outcome: Succeeded}   # name: optional
//!   leases: {node-5: node-healthcheck}   # who else holds a node's medik8s lease
//!   claims: {node-6: ["cluster-api default/md-0-abc"]}   # other tools' objects
//! settings: {timeout: 30m}  # optional: the policy's settings (policies.yaml's)
//! expect:
//!   decisions:            # by namespace/name (or name, for namespace default)
//!     default/web-1: evict            # evict | delete | skip | block | surge | notify | wait
//!     default/db-0: {action: evict, order: 1, gracePeriodSeconds: 30}
//!     default/bare: {action: block, reason: "no controller"}   # reason: a substring
//!     default/job-1: {action: wait, timeoutMs: 3600000}        # wait, notify: the timeout
//!     default/db-1: {action: notify, timeoutMs: 600000, then: delete}   # then: evict | delete
//!   attemptTimeoutMs: 30000
//!   maxConcurrentEvictions: 2         # or null for no limit
//!   verdict: retryWithBackoff         # | {retryAfterMs: 5000} | fail | {fail: "substring"}
//!                                     # | park | {park: "substring"}
//!   admission: admit                  # | wait | deny | {wait: "substring"} | {deny: "substring"}
//!   error: invalid_decision           # the policy must fail, in this category
//!                                     # (settings: it refused its settings)
//! ```
//!
//! Only what `expect` names is checked; pods it does not list may get any
//! decision. Every answer is validated exactly as the operator validates
//! it, so a scenario that passes here is an answer the operator acts on.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1 as core;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ToolError as Error;
use nmo_policy_runtime::Policy;
type Result<T, E = Error> = std::result::Result<T, E>;
use crate::crd::NodeMaintenance;
use nmo_policy_runtime::types::{DrainReport, EtcdGuard, Failure, FleetMaintenance, PodRef};
use nmo_policy_runtime::validate::{Action, Admission, Plan, Verdict};
use nmo_policy_runtime::{Fleet, Settings};

/// One scenario, as read from a file.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// What the scenario shows.
    pub name: String,
    /// The file it came from, and its document number (from 1).
    pub source: String,
    maintenance: NodeMaintenance,
    elapsed_ms: u64,
    attempt: u32,
    now: Option<std::time::SystemTime>,
    node: core::Node,
    pods: Vec<core::Pod>,
    history: nmo_policy_runtime::History,
    workloads: nmo_policy_runtime::Workloads,
    failure: Option<Failure>,
    fleet: Option<ScenarioFleet>,
    settings: Settings,
    expect: Expect,
}

/// A scenario's fleet, its times relative to the decision's.
#[derive(Debug, Clone)]
struct ScenarioFleet {
    nodes: Vec<core::Node>,
    maintenances: Vec<RawFleetMaintenance>,
    etcd: Option<EtcdGuard>,
    history: Vec<RawEnded>,
    leases: BTreeMap<String, String>,
    claims: BTreeMap<String, Vec<String>>,
}

/// A maintenance that ended, its times relative to the decision's.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawEnded {
    name: Option<String>,
    node: String,
    /// How long ago it was admitted.
    started: Value,
    /// How long ago it gave its node back.
    ended: Value,
    /// Succeeded, Failed or Cancelled.
    outcome: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawFleet {
    #[serde(default)]
    nodes: Vec<Value>,
    #[serde(default)]
    maintenances: Vec<RawFleetMaintenance>,
    openshift_etcd: Option<RawEtcd>,
    /// Maintenances that ended (the policy sees those within its window).
    #[serde(default)]
    history: Vec<RawEnded>,
    /// Who else holds a node's medik8s lease, by node name.
    #[serde(default)]
    leases: BTreeMap<String, String>,
    /// Other tools' claims of a node (`cluster-api ns/machine`, `nvidia
    /// ns/name`), by node name.
    #[serde(default)]
    claims: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawFleetMaintenance {
    name: Option<String>,
    node: String,
    #[serde(default = "yes")]
    admitted: bool,
    #[serde(default)]
    parked: bool,
    phase: Option<String>,
    /// How long ago it was admitted (or, waiting, created).
    since: Option<Value>,
    /// How long ago it was created (default: `since`).
    created: Option<Value>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawEtcd {
    budgets: u32,
    #[serde(default)]
    disruptions_allowed: u32,
    #[serde(default)]
    guard_ready_on_node: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Expect {
    #[serde(default)]
    decisions: BTreeMap<String, Value>,
    attempt_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    max_concurrent_evictions: Option<Option<u32>>,
    verdict: Option<Value>,
    admission: Option<Value>,
    error: Option<String>,
}

/// `Some(None)` for an explicit `null`, `None` when absent.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<u32>>, D::Error> {
    Option::<u32>::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawScenario {
    name: String,
    maintenance: Option<Value>,
    elapsed: Option<Value>,
    attempt: Option<u32>,
    now: Option<String>,
    node: Option<Value>,
    #[serde(default)]
    pods: Value,
    pods_from: Option<PathBuf>,
    /// What the drain has done to pods so far, by `namespace/name`.
    #[serde(default)]
    history: BTreeMap<String, RawHistory>,
    /// The Deployments, ReplicaSets and StatefulSets behind the pods.
    #[serde(default)]
    workloads: Vec<Value>,
    failure: Option<Value>,
    fleet: Option<RawFleet>,
    #[serde(default)]
    settings: BTreeMap<String, Value>,
    expect: Expect,
}

/// Whether a YAML document is a Kubernetes object (a `kind: List` of pods
/// saved from kubectl, say) rather than a scenario.
fn is_object(doc: &Value) -> bool {
    doc.get("apiVersion").is_some() && doc.get("kind").is_some() && doc.get("expect").is_none()
}

/// The pods of a file kubectl wrote (`kubectl get pods -o yaml`: one
/// `kind: List`; or Pod documents), as one list.
///
/// `from` is read only if it is inside `folder` (the scenario file's own
/// folder, or one below it): both are resolved (`..`, symbolic links) and
/// the file must be a regular file of at most [`MAX_PODS_FILE`] bytes. An
/// error names the file and where it failed, never its content.
fn pods_file(folder: &Path, from: &Path) -> std::result::Result<Value, String> {
    let shown = from.display();
    let inside = folder
        .canonicalize()
        .map_err(|e| format!("podsFrom {shown}: {e}"))?;
    let path = inside
        .join(from)
        .canonicalize()
        .map_err(|e| format!("podsFrom {shown}: {e}"))?;
    if !path.starts_with(&inside) {
        return Err(format!(
            "podsFrom {shown}: outside the scenario's folder {} (only files in it, or below it, are read)",
            inside.display()
        ));
    }
    let text = crate::yaml::read_file(&path, MAX_PODS_FILE)
        .map_err(|e| format!("podsFrom {shown}: {e}"))?;
    let docs: Vec<Value> =
        crate::yaml::documents_redacted(&text).map_err(|e| format!("podsFrom {shown}: {e}"))?;
    let mut items = Vec::new();
    for (i, v) in docs.into_iter().enumerate() {
        match v {
            Value::Null => {}
            Value::Object(mut o) if o.get("kind").and_then(Value::as_str) == Some("List") => {
                if let Some(Value::Array(a)) = o.remove("items") {
                    items.extend(a);
                }
            }
            Value::Array(a) => items.extend(a),
            o @ Value::Object(_) => items.push(o),
            _ => {
                return Err(format!(
                    "podsFrom {shown}: document {} is not a Pod, a list of pods or a kind: List",
                    i + 1
                ));
            }
        }
    }
    if let Some(i) = items.iter().position(|p| !p.is_object()) {
        return Err(format!("podsFrom {shown}: item {} is not a Pod", i + 1));
    }
    Ok(Value::Array(items))
}

/// The largest file a scenario's `podsFrom` may name (`kubectl get pods
/// -o yaml` of a few thousand pods).
pub(crate) const MAX_PODS_FILE: u64 = 16 << 20;
/// The largest scenario file.
pub(crate) const MAX_SCENARIO_FILE: u64 = 4 << 20;

/// A pod's `drain-history` in a scenario.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct RawHistory {
    /// How long the drain has wanted it gone (`90s`, `15m`...).
    pending: Option<Value>,
    refused_evictions: u32,
    attempts: u32,
    /// How long ago the application was notified.
    notified: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
enum RawFailure {
    NodeNotFound,
    LeaseHeld(String),
    LeaseError(String),
    ApiError(String),
    DrainIncomplete(RawReport),
    VolumesAttached(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct RawReport {
    pending: Vec<String>,
    pdb_blocked: Vec<String>,
    blocked: Vec<String>,
    waited: Vec<String>,
    timed_out: bool,
    message: String,
}

fn pod_ref(key: &str) -> PodRef {
    let (namespace, name) = key.split_once('/').unwrap_or(("default", key));
    PodRef {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    }
}

/// `90s`, `15m`, `2h`, `1500ms`, or a number of milliseconds.
fn duration_ms(v: &Value) -> std::result::Result<u64, String> {
    if let Some(n) = v.as_u64() {
        return Ok(n);
    }
    let s = v
        .as_str()
        .ok_or("expected a duration like 90s, 15m or 2h")?;
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..split]
        .parse()
        .map_err(|_| format!("cannot read duration {s:?}"))?;
    let unit = match &s[split..] {
        "ms" | "" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        other => return Err(format!("unknown unit {other:?} in {s:?} (ms, s, m, h)")),
    };
    n.checked_mul(unit)
        .ok_or_else(|| format!("duration {s:?} is too long"))
}

/// Fills in `apiVersion` and `kind` when a pasted object lacks them.
fn typed(mut v: Value, api_version: &str, kind: &str) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.entry("apiVersion").or_insert_with(|| json!(api_version));
        o.entry("kind").or_insert_with(|| json!(kind));
    }
    v
}

impl Scenario {
    fn from_raw(raw: RawScenario, source: String) -> std::result::Result<Self, String> {
        let (maintenance, node) = scenario_maintenance(raw.maintenance, raw.node)?;
        let pods = scenario_pods(raw.pods)?;
        let failure = raw.failure.map(scenario_failure).transpose()?;
        check_expectations(&raw.expect, failure.is_some(), raw.fleet.is_some())?;
        let fleet = match raw.fleet {
            None => None,
            Some(f) => Some(scenario_fleet(f, &node)?),
        };
        let settings = scenario_settings(&raw.settings)?;
        let elapsed_ms = match &raw.elapsed {
            None => 0,
            Some(v) => duration_ms(v).map_err(|e| format!("elapsed: {e}"))?,
        };
        let now = match &raw.now {
            None => None,
            Some(t) => Some(
                t.parse::<jiff::Timestamp>()
                    .map(std::time::SystemTime::from)
                    .map_err(|e| format!("now: {t:?} is not an RFC 3339 time: {e}"))?,
            ),
        };
        let (pods, history) = scenario_history(pods, raw.history, now)?;
        let workloads = scenario_workloads(raw.workloads, &pods)?;
        Ok(Scenario {
            name: raw.name,
            source,
            maintenance,
            elapsed_ms,
            attempt: raw.attempt.unwrap_or(1),
            now,
            node,
            pods,
            history,
            workloads,
            failure,
            fleet,
            settings: Settings::from_map(&settings),
            expect: raw.expect,
        })
    }
}

/// The scenario's maintenance and node, each completed as a user leaves
/// them out: a maintenance `scenario` of the node, a node `node-1` that
/// is cordoned.
fn scenario_maintenance(
    maintenance: Option<Value>,
    node_given: Option<Value>,
) -> std::result::Result<(NodeMaintenance, core::Node), String> {
    let nm = maintenance.unwrap_or_else(|| json!({}));
    let mut nm = typed(nm, "nodemaintenance.medik8s.io/v1beta1", "NodeMaintenance");
    let node_name = node_given
        .as_ref()
        .and_then(|n| n["metadata"]["name"].as_str())
        .unwrap_or("node-1")
        .to_owned();
    {
        let o = nm
            .as_object_mut()
            .ok_or("maintenance: expected an object")?;
        let meta = o.entry("metadata").or_insert_with(|| json!({}));
        if meta.get("name").is_none() {
            meta["name"] = json!("scenario");
        }
        let spec = o.entry("spec").or_insert_with(|| json!({}));
        if spec.get("nodeName").is_none() {
            spec["nodeName"] = json!(node_name);
        }
    }
    let maintenance: NodeMaintenance =
        serde_json::from_value(nm).map_err(|e| format!("maintenance: {e}"))?;
    let node = node_given.unwrap_or_else(|| {
        json!({"metadata": {"name": maintenance.spec.node_name}, "spec": {"unschedulable": true}})
    });
    let node: core::Node =
        serde_json::from_value(typed(node, "v1", "Node")).map_err(|e| format!("node: {e}"))?;
    Ok((maintenance, node))
}

/// The scenario's `pods`: a list, or a `kind: List` (as kubectl prints
/// them), in `default` when they name no namespace.
fn scenario_pods(pods: Value) -> std::result::Result<Vec<core::Pod>, String> {
    let items = match pods {
        Value::Null => Vec::new(),
        Value::Array(a) => a,
        Value::Object(mut o) => match o.remove("items") {
            Some(Value::Array(a)) => a,
            _ => return Err("pods: expected a list of Pods or a `kind: List`".into()),
        },
        _ => return Err("pods: expected a list of Pods or a `kind: List`".into()),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let mut p = typed(p, "v1", "Pod");
            if p["metadata"]["namespace"].is_null() && p["metadata"].is_object() {
                p["metadata"]["namespace"] = json!("default");
            }
            serde_json::from_value::<core::Pod>(p).map_err(|e| format!("pods[{i}]: {e}"))
        })
        .collect()
}

/// The scenario's `failure`, as `on-failure` is given it.
fn scenario_failure(v: Value) -> std::result::Result<Failure, String> {
    let refs = |keys: &[String]| keys.iter().map(|k| pod_ref(k)).collect();
    Ok(
        match serde_json::from_value::<RawFailure>(v).map_err(|e| format!("failure: {e}"))? {
            RawFailure::NodeNotFound => Failure::NodeNotFound,
            RawFailure::LeaseHeld(h) => Failure::LeaseHeld(h),
            RawFailure::LeaseError(m) => Failure::LeaseError(m),
            RawFailure::ApiError(m) => Failure::ApiError(m),
            RawFailure::VolumesAttached(v) => Failure::VolumesAttached(v),
            RawFailure::DrainIncomplete(r) => Failure::DrainIncomplete(DrainReport {
                pending: refs(&r.pending),
                pdb_blocked: refs(&r.pdb_blocked),
                blocked: refs(&r.blocked),
                waited: refs(&r.waited),
                timed_out: r.timed_out,
                message: r.message,
            }),
        },
    )
}

/// The scenario's `expect` fits what it gives: decisions for a plan, a
/// verdict for a failure, an admission for a fleet, and something to check.
fn check_expectations(
    e: &Expect,
    has_failure: bool,
    has_fleet: bool,
) -> std::result::Result<(), String> {
    let plan_expected = !e.decisions.is_empty()
        || e.attempt_timeout_ms.is_some()
        || e.max_concurrent_evictions.is_some();
    if has_failure && plan_expected {
        return Err("expect: a scenario with a failure gets a verdict, not decisions".into());
    }
    if !has_failure && e.verdict.is_some() {
        return Err("expect: a verdict needs a `failure` to answer".into());
    }
    if has_fleet && (has_failure || plan_expected) {
        return Err(
            "a scenario with a fleet asks admit: expect an admission, not decisions or a \
             verdict"
                .into(),
        );
    }
    for (pod, want) in &e.decisions {
        expectation(want).map_err(|why| format!("expect.decisions.{pod}: {why}"))?;
    }
    if !has_fleet && e.admission.is_some() {
        return Err("expect: an admission needs a `fleet` to decide in".into());
    }
    if !plan_expected && e.verdict.is_none() && e.admission.is_none() && e.error.is_none() {
        return Err("expect: nothing to check (decisions, verdict, admission or error)".into());
    }
    Ok(())
}

/// The scenario's `settings`, as text (numbers and booleans as written).
fn scenario_settings(
    given: &BTreeMap<String, Value>,
) -> std::result::Result<BTreeMap<String, String>, String> {
    let mut settings = BTreeMap::new();
    for (k, v) in given {
        let text = match v {
            Value::String(s) => s.clone(),
            Value::Number(_) | Value::Bool(_) => v.to_string(),
            _ => return Err(format!("settings: {k} must be a string, number or boolean")),
        };
        settings.insert(k.clone(), text);
    }
    Ok(settings)
}

/// The scenario's `workloads` (Deployments, ReplicaSets, StatefulSets,
/// or the `kind: List` kubectl prints), resolved for its pods as the
/// operator resolves what it reads.
fn scenario_workloads(
    raw: Vec<Value>,
    pods: &[core::Pod],
) -> std::result::Result<nmo_policy_runtime::Workloads, String> {
    let mut objects = Vec::new();
    for (i, mut v) in raw.into_iter().enumerate() {
        if v["kind"].as_str() == Some("List") {
            if let Some(Value::Array(items)) = v.get_mut("items").map(Value::take) {
                objects.extend(items);
            }
            continue;
        }
        let kind = v["kind"].as_str().unwrap_or_default();
        match kind {
            _ if nmo_policy_runtime::workloads::READ_KINDS.contains(&kind)
                && v["metadata"]["name"].is_string() =>
            {
                objects.push(v)
            }
            _ => {
                return Err(format!(
                    "workloads[{i}]: a Deployment, ReplicaSet or StatefulSet with kind and \
                     metadata.name (or a kind: List of them)"
                ));
            }
        }
    }
    Ok(nmo_policy_runtime::Owners::from_objects(objects).resolve(pods))
}

/// The scenario's `history`, keyed by the pods' uids (a pod without one
/// gets `scenario/<namespace>/<name>`); every key must name a pod.
fn scenario_history(
    mut pods: Vec<core::Pod>,
    raw: BTreeMap<String, RawHistory>,
    now: Option<std::time::SystemTime>,
) -> std::result::Result<(Vec<core::Pod>, nmo_policy_runtime::History), String> {
    let key = |p: &core::Pod| {
        format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or("default"),
            p.metadata.name.as_deref().unwrap_or_default()
        )
    };
    for p in &mut pods {
        if p.metadata.uid.is_none() {
            p.metadata.uid = Some(format!("scenario/{}", key(p)));
        }
    }
    let now_ms = now
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
        })
        .as_millis() as u64;
    let mut by_uid = std::collections::HashMap::new();
    for (k, h) in raw {
        let Some(pod) = pods
            .iter()
            .find(|p| key(p) == k || p.metadata.name.as_deref() == Some(&k))
        else {
            return Err(format!("history: no pod {k:?} in the scenario's pods"));
        };
        let ms = |v: &Option<Value>, what: &str| {
            v.as_ref()
                .map(duration_ms)
                .transpose()
                .map_err(|e| format!("history {k}: {what}: {e}"))
        };
        let pending_ms = ms(&h.pending, "pending")?.unwrap_or(0);
        let notified_ms = ms(&h.notified, "notified")?.map(|ago| now_ms.saturating_sub(ago));
        by_uid.insert(
            pod.metadata.uid.clone().unwrap_or_default(),
            nmo_policy_runtime::types::PodHistory {
                pending_ms,
                refused_evictions: h.refused_evictions,
                attempts: h.attempts,
                notified_ms,
            },
        );
    }
    Ok((pods, nmo_policy_runtime::History::new(by_uid)))
}

/// The fleet of a scenario: its nodes (Ready unless their status says
/// otherwise; the maintenance's node added when not listed).
fn scenario_fleet(f: RawFleet, node: &core::Node) -> std::result::Result<ScenarioFleet, String> {
    let mut nodes = Vec::new();
    for (i, n) in f.nodes.into_iter().enumerate() {
        let mut n = typed(n, "v1", "Node");
        if n.get("status").is_none() && n.is_object() {
            n["status"] = json!({"conditions": [{"type": "Ready", "status": "True"}]});
        }
        let n: core::Node =
            serde_json::from_value(n).map_err(|e| format!("fleet.nodes[{i}]: {e}"))?;
        nodes.push(n);
    }
    if !nodes.iter().any(|n| n.metadata.name == node.metadata.name) {
        let mut own = node.clone();
        if own.status.is_none() {
            own.status = serde_json::from_value(
                json!({"conditions": [{"type": "Ready", "status": "True"}]}),
            )
            .ok();
        }
        nodes.push(own);
    }
    for (i, m) in f.maintenances.iter().enumerate() {
        for v in [&m.since, &m.created].into_iter().flatten() {
            duration_ms(v).map_err(|e| format!("fleet.maintenances[{i}]: {e}"))?;
        }
        if let Some(p) = &m.phase
            && !["Running", "Succeeded", "Failed"].contains(&p.as_str())
        {
            return Err(format!(
                "fleet.maintenances[{i}]: phase {p:?} (Running, Succeeded or Failed)"
            ));
        }
    }
    for (i, e) in f.history.iter().enumerate() {
        if !["Succeeded", "Failed", "Cancelled"].contains(&e.outcome.as_str()) {
            return Err(format!(
                "fleet.history[{i}]: outcome {:?} (Succeeded, Failed or Cancelled)",
                e.outcome
            ));
        }
        for (what, v) in [("started", &e.started), ("ended", &e.ended)] {
            duration_ms(v).map_err(|err| format!("fleet.history[{i}].{what}: {err}"))?;
        }
    }
    Ok(ScenarioFleet {
        nodes,
        history: f.history,
        leases: f.leases,
        claims: f.claims,
        maintenances: f.maintenances,
        etcd: f.openshift_etcd.map(|e| EtcdGuard {
            budgets: e.budgets,
            disruptions_allowed: e.disruptions_allowed,
            guard_ready_on_node: e.guard_ready_on_node,
        }),
    })
}

impl ScenarioFleet {
    /// The fleet at `now_ms`, and the position of `node_name` in it.
    fn at(&self, now_ms: u64, node_name: &str, window: std::time::Duration) -> (Fleet, usize) {
        let ago = |v: &Option<Value>| {
            now_ms.saturating_sub(v.as_ref().and_then(|v| duration_ms(v).ok()).unwrap_or(0))
        };
        let maintenances = self
            .maintenances
            .iter()
            .map(|m| {
                let since = ago(&m.since);
                FleetMaintenance {
                    name: m.name.clone().unwrap_or_else(|| format!("nm-{}", m.node)),
                    node_name: m.node.clone(),
                    phase: m.phase.as_deref().and_then(|p| {
                        serde_json::from_value(json!(p))
                            .ok()
                            .map(super::convert::maintenance_phase)
                    }),
                    admitted: m.admitted,
                    parked: m.parked,
                    since_ms: since,
                    created_ms: if m.created.is_some() {
                        ago(&m.created)
                    } else {
                        since
                    },
                }
            })
            .collect();
        let position = self
            .nodes
            .iter()
            .position(|n| n.metadata.name.as_deref() == Some(node_name))
            .unwrap_or(0);
        let history: Vec<nmo_policy_runtime::types::EndedMaintenance> = self
            .history
            .iter()
            .map(|e| nmo_policy_runtime::types::EndedMaintenance {
                name: e.name.clone().unwrap_or_else(|| format!("nm-{}", e.node)),
                node_name: e.node.clone(),
                started_ms: ago(&Some(e.started.clone())),
                ended_ms: ago(&Some(e.ended.clone())),
                outcome: match e.outcome.as_str() {
                    "Succeeded" => nmo_policy_runtime::types::Outcome::Succeeded,
                    "Failed" => nmo_policy_runtime::types::Outcome::Failed,
                    _ => nmo_policy_runtime::types::Outcome::Cancelled,
                },
            })
            .collect();
        let fleet = Fleet {
            nodes: nmo_policy_runtime::fleet_nodes(self.nodes.iter().cloned()),
            maintenances,
            etcd: self.etcd,
            history: nmo_policy_runtime::recent(history, window, now_ms),
            lease_holders: std::sync::Arc::new(self.leases.clone().into_iter().collect()),
            tool_claims: std::sync::Arc::new(self.claims.clone().into_iter().collect()),
        };
        (fleet, position)
    }
}

fn check_admission(want: &Value, got: &Admission) -> bool {
    match (want, got) {
        (Value::String(s), Admission::Admit) => s == "admit",
        (Value::String(s), Admission::Wait { .. }) => s == "wait",
        (Value::String(s), Admission::Deny(_)) => s == "deny",
        (
            Value::Object(o),
            Admission::Wait {
                reason,
                recheck_after,
            },
        ) => {
            o.get("wait")
                .and_then(Value::as_str)
                .is_some_and(|w| reason.contains(w))
                && o.get("recheckAfterMs")
                    .is_none_or(|r| r.as_u64() == recheck_after.map(|d| d.as_millis() as u64))
        }
        (Value::Object(o), Admission::Deny(m)) => o
            .get("deny")
            .and_then(Value::as_str)
            .is_some_and(|w| m.contains(w)),
        _ => false,
    }
}

/// Reads the scenarios of a file, or of every `.yaml`/`.yml` file of a
/// directory (sorted by name).
pub fn load(path: &Path) -> Result<Vec<Scenario>> {
    let bad = |what: String| Error::Scenario(format!("{}: {what}", path.display()));
    if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| bad(e.to_string()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .collect();
        files.sort();
        // Pods saved from kubectl beside the scenarios are data.
        files.retain(|f| !is_object_file(f));
        if files.is_empty() {
            return Err(bad("no .yaml scenario files".into()));
        }
        let mut all = Vec::new();
        for f in files {
            all.extend(load(&f)?);
        }
        return Ok(all);
    }
    let text = crate::yaml::read_file(path, MAX_SCENARIO_FILE).map_err(|e| bad(e.to_string()))?;
    let docs: Vec<Value> = crate::yaml::documents(&text).map_err(|e| bad(e.to_string()))?;
    let mut out = Vec::new();
    for (i, value) in docs.into_iter().enumerate() {
        let source = format!("{}#{}", path.display(), i + 1);
        if value.is_null() {
            continue;
        }
        if is_object(&value) {
            if i == 0 {
                return Err(bad(
                    "a Kubernetes object file, not scenarios (name it in a scenario's podsFrom)"
                        .into(),
                ));
            }
            return Err(bad(format!(
                "document {}: a Kubernetes object, not a scenario",
                i + 1
            )));
        }
        let mut raw: RawScenario =
            serde_json::from_value(value).map_err(|e| bad(format!("document {}: {e}", i + 1)))?;
        let name = raw.name.clone();
        if let Some(from) = raw.pods_from.take() {
            if !raw.pods.is_null() {
                return Err(bad(format!(
                    "scenario {name:?}: pods and podsFrom both given"
                )));
            }
            let folder = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            raw.pods =
                pods_file(folder, &from).map_err(|e| bad(format!("scenario {name:?}: {e}")))?;
        }
        out.push(
            Scenario::from_raw(raw, source).map_err(|e| bad(format!("scenario {name:?}: {e}")))?,
        );
    }
    if out.is_empty() {
        return Err(bad("no scenarios".into()));
    }
    Ok(out)
}

/// Whether a file's first document is a Kubernetes object.
fn is_object_file(path: &Path) -> bool {
    let Ok(text) = crate::yaml::read_file(path, MAX_PODS_FILE) else {
        return false;
    };
    crate::yaml::documents::<Value>(&text)
        .ok()
        .and_then(|d| d.into_iter().next())
        .is_some_and(|v| is_object(&v))
}

/// How one scenario went.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub name: String,
    pub source: String,
    /// Each difference as `(what, expected, actual)`; empty: passed.
    pub diffs: Vec<(String, String, String)>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.diffs.is_empty()
    }
}

fn show_action(a: &Action, order: u32) -> String {
    let grace = |g: &Option<i64>| g.map(|g| format!(" (grace {g}s)")).unwrap_or_default();
    let mut s = match a {
        Action::Skip { reason } | Action::Block { reason } | Action::Wait { reason, .. } => {
            format!("{}: {reason}", a.verb())
        }
        _ => format!("{}{}", a.verb(), grace(&a.grace())),
    };
    if let Some(t) = a.timeout() {
        let _ = write!(s, ", timeoutMs {}", t.as_millis());
    }
    if let Action::Notify(n) = a {
        s.push_str(if n.then_delete {
            ", then delete"
        } else {
            ", then evict"
        });
    }
    if order != 0 {
        let _ = write!(s, ", order {order}");
    }
    s
}

/// The fields an expected decision may name, besides `action`.
const DECISION_FIELDS: [&str; 5] = ["order", "gracePeriodSeconds", "reason", "timeoutMs", "then"];

/// Whether an expected decision is well formed: a scenario that names an
/// action or a field that does not exist cannot be read (exit code 2), it
/// does not fail as if the policy had answered wrongly.
fn expectation(want: &Value) -> std::result::Result<(), String> {
    let (kind, fields) = match want {
        Value::String(s) => (s.as_str(), None),
        Value::Object(o) => (
            o.get("action").and_then(Value::as_str).unwrap_or(""),
            Some(o),
        ),
        _ => ("", None),
    };
    if !ACTIONS.contains(&kind) {
        return Err(format!(
            "{want} is not an action: use one of {} (or {{action, {}}})",
            ACTIONS.join(", "),
            DECISION_FIELDS.join(", ")
        ));
    }
    for (k, v) in fields.into_iter().flatten() {
        let ok = match k.as_str() {
            "action" => true,
            "order" | "timeoutMs" => v.is_u64(),
            "gracePeriodSeconds" => v.is_i64() || v.is_null(),
            "reason" => v.is_string(),
            "then" => v == "evict" || v == "delete",
            other => {
                return Err(format!(
                    "unknown field {other:?}: the fields are action, {}",
                    DECISION_FIELDS.join(", ")
                ));
            }
        };
        if !ok {
            return Err(format!("{k}: {v} is not a valid value"));
        }
    }
    Ok(())
}

/// Compares one expected decision (already checked by [`expectation`])
/// with the actual one; `Err(expected, as shown)` if it does not match.
fn check_decision(want: &Value, got: &Action, order: u32) -> std::result::Result<(), String> {
    expectation(want).map_err(|why| format!("(bad expectation: {why})"))?;
    let (kind, fields) = match want {
        Value::String(s) => (s.as_str(), None),
        Value::Object(o) => (
            o.get("action").and_then(Value::as_str).unwrap_or(""),
            Some(o),
        ),
        _ => ("", None),
    };
    let (got_kind, got_grace, got_reason) = (got.verb(), got.grace(), got.reason().unwrap_or(""));
    let shown = || {
        let mut s = kind.to_owned();
        for (k, v) in fields.into_iter().flatten() {
            if k != "action" {
                let _ = write!(s, ", {k} {v}");
            }
        }
        s
    };
    let mut ok = kind == got_kind;
    for (k, v) in fields.into_iter().flatten() {
        ok &= match k.as_str() {
            "order" => v.as_u64() == Some(u64::from(order)),
            "gracePeriodSeconds" => v.as_i64() == got_grace || (v.is_null() && got_grace.is_none()),
            "reason" => v.as_str().is_some_and(|r| got_reason.contains(r)),
            "timeoutMs" => got
                .timeout()
                .is_some_and(|t| v.as_u64() == u64::try_from(t.as_millis()).ok()),
            "then" => match got {
                Action::Notify(n) => (v == "delete") == n.then_delete,
                _ => false,
            },
            _ => true,
        };
    }
    if ok { Ok(()) } else { Err(shown()) }
}

/// The pod actions an expectation may name.
const ACTIONS: [&str; 7] = [
    "evict", "delete", "skip", "block", "surge", "notify", "wait",
];

fn check_verdict(want: &Value, got: &Verdict) -> bool {
    match (want, got) {
        (Value::String(s), Verdict::RetryWithBackoff) => s == "retryWithBackoff",
        (Value::String(s), Verdict::Fail(_)) => s == "fail",
        (Value::String(s), Verdict::Park { .. }) => s == "park",
        (Value::Object(o), Verdict::Park { reason, .. }) => o
            .get("park")
            .and_then(Value::as_str)
            .is_some_and(|want| reason.contains(want)),
        (Value::Object(o), Verdict::RetryAfter(d)) => {
            o.get("retryAfterMs").and_then(Value::as_u64) == Some(d.as_millis() as u64)
        }
        (Value::Object(o), Verdict::Fail(m)) => o
            .get("fail")
            .and_then(Value::as_str)
            .is_some_and(|want| m.contains(want)),
        _ => false,
    }
}

fn show_verdict(v: &Verdict) -> String {
    match v {
        Verdict::RetryAfter(d) => format!("{{retryAfterMs: {}}}", d.as_millis()),
        Verdict::RetryWithBackoff => "retryWithBackoff".into(),
        Verdict::Fail(m) => format!("{{fail: {m:?}}}"),
        Verdict::Park { reason, .. } => format!("{{park: {reason:?}}}"),
    }
}

/// What the policy answered.
enum Answer {
    Plan(Plan),
    Verdict(Verdict),
    Admission(Admission),
}

/// Runs one scenario.
pub fn run(policy: &Policy, s: &Scenario) -> Outcome {
    let mut diffs = Vec::new();
    let now = s.now.unwrap_or_else(std::time::SystemTime::now);
    let at = jiff::Timestamp::try_from(now).unwrap_or_else(|_| jiff::Timestamp::now());
    let mut m = super::convert::maintenance(&s.maintenance, s.attempt, at);
    m.elapsed_ms = s.elapsed_ms;
    if s.maintenance.metadata.creation_timestamp.is_none() {
        m.created_ms = m.now_ms.saturating_sub(m.elapsed_ms);
    }
    let e = &s.expect;
    let answer = policy
        .at(now)
        .with_settings(s.settings.clone())
        .and_then(|policy| match (&s.fleet, &s.failure) {
            (Some(fleet), _) => {
                let window = s.settings.history_window();
                let (fleet, position) = fleet.at(m.now_ms, &m.node_name, window);
                policy.admit(&m, position, &fleet).map(Answer::Admission)
            }
            (None, Some(f)) => policy.on_failure(&m, f).map(Answer::Verdict),
            (None, None) => policy
                .plan_drain_shared(
                    &m,
                    s.node.clone(),
                    s.pods.clone().into(),
                    s.history.clone(),
                    s.workloads.clone(),
                )
                .map(Answer::Plan),
        });
    match (answer, &e.error) {
        (Err(err), Some(cat)) if err.category() == cat => {}
        (Err(err), Some(cat)) => diffs.push((
            "error".into(),
            cat.clone(),
            format!("{} ({err})", err.category()),
        )),
        (Err(err), None) => diffs.push((
            "answer".into(),
            "a valid answer".into(),
            format!("error {}: {err}", err.category()),
        )),
        (Ok(_), Some(cat)) => diffs.push(("error".into(), cat.clone(), "a valid answer".into())),
        (Ok(Answer::Admission(got)), None) => {
            if let Some(want) = e.admission.as_ref().filter(|w| !check_admission(w, &got)) {
                let want = match want {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                diffs.push(("admission".into(), want, got.to_string()));
            }
        }
        (Ok(Answer::Plan(plan)), None) => {
            let by_key: BTreeMap<String, (&Action, u32)> = plan
                .steps
                .iter()
                .map(|st| {
                    (
                        format!("{}/{}", st.namespace, st.name),
                        (&st.action, st.order),
                    )
                })
                .collect();
            for (key, want) in &e.decisions {
                let key = if key.contains('/') {
                    key.clone()
                } else {
                    format!("default/{key}")
                };
                match by_key.get(&key) {
                    None => diffs.push((
                        key,
                        format!("{want}"),
                        "(no such pod in the scenario)".into(),
                    )),
                    Some((action, order)) => {
                        if let Err(want) = check_decision(want, action, *order) {
                            diffs.push((key, want, show_action(action, *order)));
                        }
                    }
                }
            }
            if let Some(t) = e.attempt_timeout_ms {
                let got = plan.attempt_timeout.as_millis() as u64;
                if got != t {
                    diffs.push(("attemptTimeoutMs".into(), t.to_string(), got.to_string()));
                }
            }
            if let Some(want) = e.max_concurrent_evictions {
                let got = plan.max_concurrent_evictions.map(|n| n.get());
                if got != want {
                    let show = |v: Option<u32>| v.map_or("null".to_owned(), |n| n.to_string());
                    diffs.push(("maxConcurrentEvictions".into(), show(want), show(got)));
                }
            }
        }
        (Ok(Answer::Verdict(verdict)), None) => {
            if let Some(want) = e.verdict.as_ref().filter(|w| !check_verdict(w, &verdict)) {
                let want = match want {
                    Value::String(s) => s.clone(),
                    other => crate::yaml::to_string(other)
                        .map(|s| format!("{{{}}}", s.trim().replace('\n', ", ")))
                        .unwrap_or_default(),
                };
                diffs.push(("verdict".into(), want, show_verdict(&verdict)));
            }
        }
    }
    Outcome {
        name: s.name.clone(),
        source: s.source.clone(),
        diffs,
    }
}

/// The outcomes of a run, printable.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub outcomes: Vec<Outcome>,
}

impl Report {
    pub fn passed(&self) -> usize {
        self.outcomes.iter().filter(|o| o.passed()).count()
    }

    pub fn failed(&self) -> usize {
        self.outcomes.len() - self.passed()
    }

    /// `PASS`/`FAIL` per scenario, a `-` expected / `+` actual diff under
    /// each failure, and a total line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for o in &self.outcomes {
            let mark = if o.passed() { "PASS" } else { "FAIL" };
            let _ = writeln!(out, "{mark}  {}  ({})", o.name, o.source);
            for (what, want, got) in &o.diffs {
                let _ = writeln!(out, "        {what}");
                let _ = writeln!(out, "          - expected: {want}");
                let _ = writeln!(out, "          + actual:   {got}");
            }
        }
        let _ = writeln!(
            out,
            "{} scenarios: {} passed, {} failed",
            self.outcomes.len(),
            self.passed(),
            self.failed()
        );
        out
    }
}

/// Runs every scenario of `paths` (files or directories) on `policy`.
pub fn run_paths(policy: &Policy, paths: &[PathBuf]) -> Result<Report> {
    let mut report = Report::default();
    for p in paths {
        for s in load(p)? {
            report.outcomes.push(run(policy, &s));
        }
    }
    Ok(report)
}

/// For a policy's own `cargo test`: loads the policy file, runs the
/// scenarios and panics with the report if any fails.
///
/// ```ignore
/// #[test]
/// fn scenarios() {
///     nmo::policy::harness::assert_scenarios(
///         "target/wasm32-wasip2/release/my_policy.wasm",
///         "scenarios",
///     );
/// }
/// ```
pub fn assert_scenarios(policy_wasm: impl AsRef<Path>, scenarios: impl AsRef<Path>) -> Report {
    let engine = nmo_policy_runtime::PolicyEngine::new(nmo_policy_runtime::EngineConfig::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let policy = engine
        .load_file(policy_wasm.as_ref())
        .unwrap_or_else(|e| panic!("{e}"));
    let report =
        run_paths(&policy, &[scenarios.as_ref().to_owned()]).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        report.failed() == 0,
        "policy {} failed scenarios:\n{}",
        policy_wasm.as_ref().display(),
        report.render()
    );
    report
}
