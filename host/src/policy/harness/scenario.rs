//! The scenario format: a scenario file's YAML read into what a policy
//! is asked (the objects as the operator converts them) and what it is
//! expected to answer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1 as core;
use serde::Deserialize;
use serde_json::{Value, json};

use super::check::expectation;
use crate::policy::error::ToolError as Error;
pub(super) type Result<T, E = Error> = std::result::Result<T, E>;
use crate::crd::NodeMaintenance;
use nmo_policy_runtime::types::{DrainReport, EtcdGuard, Failure, FleetMaintenance, PodRef};
use nmo_policy_runtime::validate::Admission;
use nmo_policy_runtime::{Fleet, Settings};

/// One scenario, as read from a file.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// What the scenario shows.
    pub name: String,
    /// The file it came from, and its document number (from 1).
    pub source: String,
    pub(super) maintenance: NodeMaintenance,
    pub(super) elapsed_ms: u64,
    pub(super) attempt: u32,
    pub(super) now: Option<std::time::SystemTime>,
    pub(super) node: core::Node,
    pub(super) pods: Vec<core::Pod>,
    pub(super) history: nmo_policy_runtime::History,
    pub(super) workloads: nmo_policy_runtime::Workloads,
    pub(super) failure: Option<Failure>,
    pub(super) fleet: Option<ScenarioFleet>,
    pub(super) settings: Settings,
    pub(super) expect: Expect,
}

/// A scenario's fleet, its times relative to the decision's.
#[derive(Debug, Clone)]
pub(super) struct ScenarioFleet {
    pub(super) nodes: Vec<core::Node>,
    pub(super) maintenances: Vec<RawFleetMaintenance>,
    pub(super) etcd: Option<EtcdGuard>,
    pub(super) history: Vec<RawEnded>,
    pub(super) leases: BTreeMap<String, String>,
    pub(super) claims: BTreeMap<String, Vec<String>>,
}

/// A maintenance that ended, its times relative to the decision's.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawEnded {
    pub(super) name: Option<String>,
    pub(super) node: String,
    /// How long ago it was admitted.
    pub(super) started: Value,
    /// How long ago it gave its node back.
    pub(super) ended: Value,
    /// Succeeded, Failed or Cancelled.
    pub(super) outcome: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawFleet {
    #[serde(default)]
    pub(super) nodes: Vec<Value>,
    #[serde(default)]
    pub(super) maintenances: Vec<RawFleetMaintenance>,
    pub(super) openshift_etcd: Option<RawEtcd>,
    /// Maintenances that ended (the policy sees those within its window).
    #[serde(default)]
    pub(super) history: Vec<RawEnded>,
    /// Who else holds a node's medik8s lease, by node name.
    #[serde(default)]
    pub(super) leases: BTreeMap<String, String>,
    /// Other tools' claims of a node (`cluster-api ns/machine`, `nvidia
    /// ns/name`), by node name.
    #[serde(default)]
    pub(super) claims: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawFleetMaintenance {
    pub(super) name: Option<String>,
    pub(super) node: String,
    #[serde(default = "yes")]
    pub(super) admitted: bool,
    #[serde(default)]
    pub(super) parked: bool,
    pub(super) phase: Option<String>,
    /// How long ago it was admitted (or, waiting, created).
    pub(super) since: Option<Value>,
    /// How long ago it was created (default: `since`).
    pub(super) created: Option<Value>,
}

pub(super) fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawEtcd {
    pub(super) budgets: u32,
    #[serde(default)]
    pub(super) disruptions_allowed: u32,
    #[serde(default)]
    pub(super) guard_ready_on_node: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Expect {
    #[serde(default)]
    pub(super) decisions: BTreeMap<String, Value>,
    pub(super) attempt_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    pub(super) max_concurrent_evictions: Option<Option<u32>>,
    pub(super) verdict: Option<Value>,
    pub(super) admission: Option<Value>,
    pub(super) error: Option<String>,
}

/// `Some(None)` for an explicit `null`, `None` when absent.
pub(super) fn present<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<u32>>, D::Error> {
    Option::<u32>::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawScenario {
    pub(super) name: String,
    pub(super) maintenance: Option<Value>,
    pub(super) elapsed: Option<Value>,
    pub(super) attempt: Option<u32>,
    pub(super) now: Option<String>,
    pub(super) node: Option<Value>,
    #[serde(default)]
    pub(super) pods: Value,
    pub(super) pods_from: Option<PathBuf>,
    /// What the drain has done to pods so far, by `namespace/name`.
    #[serde(default)]
    pub(super) history: BTreeMap<String, RawHistory>,
    /// The Deployments, ReplicaSets and StatefulSets behind the pods.
    #[serde(default)]
    pub(super) workloads: Vec<Value>,
    pub(super) failure: Option<Value>,
    pub(super) fleet: Option<RawFleet>,
    #[serde(default)]
    pub(super) settings: BTreeMap<String, Value>,
    pub(super) expect: Expect,
}

/// Whether a YAML document is a Kubernetes object (a `kind: List` of pods
/// saved from kubectl, say) rather than a scenario.
pub(super) fn is_object(doc: &Value) -> bool {
    doc.get("apiVersion").is_some() && doc.get("kind").is_some() && doc.get("expect").is_none()
}

/// The pods of a file kubectl wrote (`kubectl get pods -o yaml`: one
/// `kind: List`; or Pod documents), as one list.
///
/// `from` is read only if it is inside `folder` (the scenario file's own
/// folder, or one below it): both are resolved (`..`, symbolic links) and
/// the file must be a regular file of at most [`MAX_PODS_FILE`] bytes. An
/// error names the file and where it failed, never its content.
pub(super) fn pods_file(folder: &Path, from: &Path) -> std::result::Result<Value, String> {
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
pub(super) struct RawHistory {
    /// How long the drain has wanted it gone (`90s`, `15m`...).
    pub(super) pending: Option<Value>,
    pub(super) refused_evictions: u32,
    pub(super) attempts: u32,
    /// How long ago the application was notified.
    pub(super) notified: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) enum RawFailure {
    NodeNotFound,
    LeaseHeld(String),
    LeaseError(String),
    ApiError(String),
    DrainIncomplete(RawReport),
    VolumesAttached(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawReport {
    pub(super) pending: Vec<String>,
    pub(super) pdb_blocked: Vec<String>,
    pub(super) blocked: Vec<String>,
    pub(super) waited: Vec<String>,
    pub(super) timed_out: bool,
    pub(super) message: String,
}

pub(super) fn pod_ref(key: &str) -> PodRef {
    let (namespace, name) = key.split_once('/').unwrap_or(("default", key));
    PodRef {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    }
}

/// `90s`, `15m`, `2h`, `1500ms`, or a number of milliseconds.
pub(super) fn duration_ms(v: &Value) -> std::result::Result<u64, String> {
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
pub(super) fn typed(mut v: Value, api_version: &str, kind: &str) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.entry("apiVersion").or_insert_with(|| json!(api_version));
        o.entry("kind").or_insert_with(|| json!(kind));
    }
    v
}

impl Scenario {
    pub(super) fn from_raw(raw: RawScenario, source: String) -> std::result::Result<Self, String> {
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
pub(super) fn scenario_maintenance(
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
pub(super) fn scenario_pods(pods: Value) -> std::result::Result<Vec<core::Pod>, String> {
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
pub(super) fn scenario_failure(v: Value) -> std::result::Result<Failure, String> {
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
pub(super) fn check_expectations(
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
pub(super) fn scenario_settings(
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
pub(super) fn scenario_workloads(
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
pub(super) fn scenario_history(
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
pub(super) fn scenario_fleet(
    f: RawFleet,
    node: &core::Node,
) -> std::result::Result<ScenarioFleet, String> {
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
    pub(super) fn at(
        &self,
        now_ms: u64,
        node_name: &str,
        window: std::time::Duration,
    ) -> (Fleet, usize) {
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
                            .map(crate::policy::convert::maintenance_phase)
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

pub(super) fn check_admission(want: &Value, got: &Admission) -> bool {
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
pub(super) fn is_object_file(path: &Path) -> bool {
    let Ok(text) = crate::yaml::read_file(path, MAX_PODS_FILE) else {
        return false;
    };
    crate::yaml::documents::<Value>(&text)
        .ok()
        .and_then(|d| d.into_iter().next())
        .is_some_and(|v| is_object(&v))
}
