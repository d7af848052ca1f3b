//! What a decision reads: the Kubernetes objects behind the contract's
//! `pod` and `node` resources, and the policy's settings; and the store's
//! data ([`HostState`]) the policy's imports answer from.
//!
//! The host hands the guest handles, not copies: a handle's
//! representation is the object's position in the decision's input, and
//! each accessor the guest calls copies only what it returns. A policy that
//! reads owners and flags never pays for labels and annotations.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1 as k8s;
use wasmtime::component::Resource;

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::DrainPolicyImports;
use super::convert;
use super::output::{MAX_LOG_LINE_BYTES, Records};
use crate::bindings::types::{
    self, EtcdGuard, FleetMaintenance, KeyValue, Level, Owner, PodPhase, Taint,
};

/// Every node of a decision: shared, each node too, so a snapshot of the
/// fleet costs a pointer per node, not a copy of each.
pub type FleetNodes = Arc<[Arc<k8s::Node>]>;

/// Nodes as a decision holds them.
pub fn fleet_nodes(nodes: impl IntoIterator<Item = k8s::Node>) -> FleetNodes {
    nodes.into_iter().map(Arc::new).collect()
}

/// The objects one decision's handles point into.
#[derive(Clone, Default)]
pub(crate) struct Inputs {
    pub pods: Arc<[k8s::Pod]>,
    pub nodes: FleetNodes,
    pub settings: Settings,
    pub history: History,
    /// Each pod's workload, by pod uid (read only for a policy that asks).
    pub workloads: crate::workloads::Workloads,
    /// Who else holds each node's medik8s lease, by node name.
    pub lease_holders: Arc<std::collections::HashMap<String, String>>,
    /// Other tools' claims of each node, by node name.
    pub tool_claims: Arc<std::collections::HashMap<String, Vec<String>>>,
    empty_pod: k8s::Pod,
    empty_node: k8s::Node,
}

impl Inputs {
    pub fn new(pods: Arc<[k8s::Pod]>, nodes: FleetNodes, settings: Settings) -> Self {
        Inputs {
            pods,
            nodes,
            settings,
            ..Inputs::default()
        }
    }
}

/// A policy's settings, as `policies.yaml` gives them: values as strings,
/// sorted by key.
#[derive(Clone, Debug, Default)]
pub struct Settings(Arc<[KeyValue]>);

impl Settings {
    /// Settings from a map (sorted by key, as the map is).
    pub fn from_map(map: &BTreeMap<String, String>) -> Self {
        Settings(
            map.iter()
                .map(|(k, v)| KeyValue {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect(),
        )
    }

    /// Settings from the contract's list.
    pub(crate) fn from_pairs(pairs: &[KeyValue]) -> Self {
        Settings(pairs.iter().cloned().collect())
    }

    /// The settings as the contract's list.
    pub fn pairs(&self) -> &[KeyValue] {
        &self.0
    }

    /// No settings given.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The history the policy's `admit` sees: its `history-window`
    /// setting (`90s`, `30m`, `2h`), default [`HISTORY_WINDOW`], at most
    /// [`MAX_HISTORY_WINDOW`]. An unreadable value is the policy's to
    /// refuse in `validate-settings`; here it is the default.
    pub fn history_window(&self) -> std::time::Duration {
        self.0
            .iter()
            .find(|kv| kv.key == HISTORY_WINDOW_SETTING)
            .and_then(|kv| parse_duration(&kv.value))
            .unwrap_or(HISTORY_WINDOW)
            .min(MAX_HISTORY_WINDOW)
    }
}

/// The part of `history` a policy with `window` sees at `now_ms`: what
/// ended within it, newest first.
pub fn recent(
    mut history: Vec<types::EndedMaintenance>,
    window: std::time::Duration,
    now_ms: u64,
) -> Vec<types::EndedMaintenance> {
    let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
    history.retain(|e| e.ended_ms.saturating_add(window_ms) >= now_ms);
    history.sort_by_key(|e| std::cmp::Reverse(e.ended_ms));
    history
}

/// The setting that sets a policy's history window.
pub const HISTORY_WINDOW_SETTING: &str = "history-window";
/// The history window when a policy names none.
pub const HISTORY_WINDOW: std::time::Duration = std::time::Duration::from_secs(3600);
/// The longest history the operator keeps.
pub const MAX_HISTORY_WINDOW: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// `90s`, `15m`, `2h`, `1500ms`.
fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit())?;
    let n: u64 = t[..split].parse().ok()?;
    let ms = match &t[split..] {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    Some(std::time::Duration::from_millis(n.checked_mul(ms)?))
}

/// What a maintenance's drain has done to each pod so far, by pod uid
/// (the contract's `drain-history`; a pod not in it has none yet).
#[derive(Clone, Debug, Default)]
pub struct History(Arc<std::collections::HashMap<String, types::PodHistory>>);

impl History {
    /// The history of each pod, by uid.
    pub fn new(by_uid: std::collections::HashMap<String, types::PodHistory>) -> Self {
        History(Arc::new(by_uid))
    }

    /// The history of the pod with `uid` (all zero when it has none).
    pub fn of(&self, uid: &str) -> types::PodHistory {
        self.0.get(uid).copied().unwrap_or(types::PodHistory {
            pending_ms: 0,
            refused_evictions: 0,
            attempts: 0,
            notified_ms: None,
        })
    }
}

/// The cluster around a maintenance that asks to start, for `admit`.
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    /// Every node of the cluster.
    pub nodes: FleetNodes,
    /// The other NodeMaintenances that are not finished.
    pub maintenances: Vec<FleetMaintenance>,
    /// The etcd quorum guard (OpenShift only).
    pub etcd: Option<EtcdGuard>,
    /// The maintenances that ended within the policy's window, newest
    /// first.
    pub history: Vec<types::EndedMaintenance>,
    /// Who else holds each node's medik8s lease, by node name.
    pub lease_holders: Arc<std::collections::HashMap<String, String>>,
    /// Other tools' claims of each node (Cluster API, NVIDIA), by node
    /// name.
    pub tool_claims: Arc<std::collections::HashMap<String, Vec<String>>>,
}

fn key_value(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.to_owned(),
        value: v.to_owned(),
    }
}

fn pairs(map: Option<&BTreeMap<String, String>>) -> Vec<KeyValue> {
    map.into_iter()
        .flatten()
        .map(|(k, v)| key_value(k, v))
        .collect()
}

fn lookup(map: Option<&BTreeMap<String, String>>, key: &str) -> Option<String> {
    map.and_then(|m| m.get(key)).cloned()
}

/// The Ready condition of a node is True.
pub(crate) fn node_ready(node: &k8s::Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

// The handles are made by the host from positions in the same input, so a
// lookup cannot miss; were it to, the accessor answers as for an empty
// object rather than panic.
impl HostState {
    fn pod(&self, handle: &Resource<types::Pod>) -> &k8s::Pod {
        let i = &self.inputs;
        i.pods.get(handle.rep() as usize).unwrap_or(&i.empty_pod)
    }

    fn node(&self, handle: &Resource<types::Node>) -> &k8s::Node {
        let i = &self.inputs;
        i.nodes
            .get(handle.rep() as usize)
            .map_or(&i.empty_node, |n| n)
    }
}

impl types::HostPod for HostState {
    fn namespace(&mut self, pod: Resource<types::Pod>) -> String {
        self.pod(&pod)
            .metadata
            .namespace
            .clone()
            .unwrap_or_default()
    }

    fn name(&mut self, pod: Resource<types::Pod>) -> String {
        self.pod(&pod).metadata.name.clone().unwrap_or_default()
    }

    fn uid(&mut self, pod: Resource<types::Pod>) -> String {
        self.pod(&pod).metadata.uid.clone().unwrap_or_default()
    }

    fn label(&mut self, pod: Resource<types::Pod>, key: String) -> Option<String> {
        lookup(self.pod(&pod).metadata.labels.as_ref(), &key)
    }

    fn annotation(&mut self, pod: Resource<types::Pod>, key: String) -> Option<String> {
        lookup(self.pod(&pod).metadata.annotations.as_ref(), &key)
    }

    fn labels(&mut self, pod: Resource<types::Pod>) -> Vec<KeyValue> {
        pairs(self.pod(&pod).metadata.labels.as_ref())
    }

    fn annotations(&mut self, pod: Resource<types::Pod>) -> Vec<KeyValue> {
        pairs(self.pod(&pod).metadata.annotations.as_ref())
    }

    fn owners(&mut self, pod: Resource<types::Pod>) -> Vec<Owner> {
        let owners = self.pod(&pod).metadata.owner_references.iter().flatten();
        owners
            .map(|o| Owner {
                api_version: o.api_version.clone(),
                kind: o.kind.clone(),
                name: o.name.clone(),
                uid: o.uid.clone(),
                controller: o.controller == Some(true),
            })
            .collect()
    }

    fn controller_kind(&mut self, pod: Resource<types::Pod>) -> Option<String> {
        convert::controller_kind(self.pod(&pod)).map(str::to_owned)
    }

    fn phase(&mut self, pod: Resource<types::Pod>) -> PodPhase {
        convert::pod_phase(self.pod(&pod))
    }

    fn ready(&mut self, pod: Resource<types::Pod>) -> bool {
        convert::pod_ready(self.pod(&pod))
    }

    fn mirror(&mut self, pod: Resource<types::Pod>) -> bool {
        convert::is_mirror(self.pod(&pod))
    }

    fn local_storage(&mut self, pod: Resource<types::Pod>) -> bool {
        convert::has_local_storage(self.pod(&pod))
    }

    fn terminating(&mut self, pod: Resource<types::Pod>) -> bool {
        self.pod(&pod).metadata.deletion_timestamp.is_some()
    }

    fn grace_period_seconds(&mut self, pod: Resource<types::Pod>) -> Option<i64> {
        let spec = self.pod(&pod).spec.as_ref();
        spec.and_then(|s| s.termination_grace_period_seconds)
    }

    fn priority(&mut self, pod: Resource<types::Pod>) -> Option<i32> {
        self.pod(&pod).spec.as_ref().and_then(|s| s.priority)
    }

    fn priority_class_name(&mut self, pod: Resource<types::Pod>) -> String {
        let spec = self.pod(&pod).spec.as_ref();
        spec.and_then(|s| s.priority_class_name.clone())
            .unwrap_or_default()
    }

    fn deletion_deadline_ms(&mut self, pod: Resource<types::Pod>) -> Option<u64> {
        let at = self.pod(&pod).metadata.deletion_timestamp.as_ref()?;
        u64::try_from(at.0.as_millisecond()).ok()
    }

    fn drain_history(&mut self, pod: Resource<types::Pod>) -> types::PodHistory {
        let uid = self.pod(&pod).metadata.uid.clone().unwrap_or_default();
        self.inputs.history.of(&uid)
    }

    fn workload(&mut self, pod: Resource<types::Pod>) -> Option<types::Workload> {
        let pod = self.pod(&pod);
        let read = pod.metadata.uid.as_deref();
        if let Some(w) = read.and_then(|uid| self.inputs.workloads.of(uid)) {
            return Some(w.clone());
        }
        // Not read (the plan was made without them): the controller's
        // kind and name, no numbers.
        let c = pod.metadata.owner_references.iter().flatten();
        let c = c.into_iter().find(|o| o.controller == Some(true))?;
        Some(types::Workload {
            kind: c.kind.clone(),
            name: c.name.clone(),
            replicas: None,
            ready_replicas: None,
            max_surge: None,
            max_unavailable: None,
        })
    }

    fn drop(&mut self, _pod: Resource<types::Pod>) -> wasmtime::Result<()> {
        Ok(())
    }
}

/// Feeds into `h` a node as a policy can see it through [`types::HostNode`]
/// (its name, labels, annotations, taints, whether it is unschedulable and
/// Ready; its lease holder and tool claims come from the fleet), and
/// nothing else: two nodes hashed alike answer every accessor alike,
/// whatever their heartbeats and other status did meanwhile.
pub fn hash_as_seen(node: &k8s::Node, h: &mut impl std::hash::Hasher) {
    use std::hash::Hash;
    node.metadata.name.hash(h);
    node.metadata.labels.hash(h);
    node.metadata.annotations.hash(h);
    for t in convert::taints(node) {
        (t.key, t.value, t.effect as u8).hash(h);
    }
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
        .hash(h);
    node_ready(node).hash(h);
}

impl types::HostNode for HostState {
    fn name(&mut self, node: Resource<types::Node>) -> String {
        self.node(&node).metadata.name.clone().unwrap_or_default()
    }

    fn label(&mut self, node: Resource<types::Node>, key: String) -> Option<String> {
        lookup(self.node(&node).metadata.labels.as_ref(), &key)
    }

    fn annotation(&mut self, node: Resource<types::Node>, key: String) -> Option<String> {
        lookup(self.node(&node).metadata.annotations.as_ref(), &key)
    }

    fn labels(&mut self, node: Resource<types::Node>) -> Vec<KeyValue> {
        pairs(self.node(&node).metadata.labels.as_ref())
    }

    fn annotations(&mut self, node: Resource<types::Node>) -> Vec<KeyValue> {
        pairs(self.node(&node).metadata.annotations.as_ref())
    }

    fn taints(&mut self, node: Resource<types::Node>) -> Vec<Taint> {
        convert::taints(self.node(&node))
    }

    fn unschedulable(&mut self, node: Resource<types::Node>) -> bool {
        let spec = self.node(&node).spec.as_ref();
        spec.and_then(|s| s.unschedulable).unwrap_or(false)
    }

    fn ready(&mut self, node: Resource<types::Node>) -> bool {
        node_ready(self.node(&node))
    }

    fn lease_holder(&mut self, node: Resource<types::Node>) -> Option<String> {
        let name = self.node(&node).metadata.name.as_deref()?;
        self.inputs.lease_holders.get(name).cloned()
    }

    fn tool_claims(&mut self, node: Resource<types::Node>) -> Vec<String> {
        let Some(name) = self.node(&node).metadata.name.as_deref() else {
            return Vec::new();
        };
        self.inputs
            .tool_claims
            .get(name)
            .cloned()
            .unwrap_or_default()
    }

    fn drop(&mut self, _node: Resource<types::Node>) -> wasmtime::Result<()> {
        Ok(())
    }
}

/// The data of a decision's store: the sandbox's WASI context (nothing
/// granted), its memory limiter, the policy's log allowance, and the
/// inputs its handles and imports answer from.
pub(crate) struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryLimiter,
    policy: String,
    records: Records,
    /// What the decision's handles and the `settings` import read.
    pub(crate) inputs: Inputs,
}

impl HostState {
    pub(crate) fn new(
        wasi: WasiCtx,
        memory_limit_bytes: usize,
        policy: String,
        records: Records,
        inputs: Inputs,
    ) -> Self {
        HostState {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryLimiter {
                limit: memory_limit_bytes,
                used: 0,
                hit: false,
            },
            policy,
            records,
            inputs,
        }
    }

    /// The store's resource limiter.
    pub(crate) fn limiter(&mut self) -> &mut dyn ResourceLimiter {
        &mut self.limiter
    }

    /// Whether the decision was refused memory past its limit.
    pub(crate) fn memory_limit_hit(&self) -> bool {
        self.limiter.hit
    }

    /// The decision's log records so far, `fresh` in their place.
    pub(crate) fn take_records(&mut self, fresh: Records) -> Records {
        std::mem::replace(&mut self.records, fresh)
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl types::Host for HostState {}

impl DrainPolicyImports for HostState {
    fn settings(&mut self) -> Vec<KeyValue> {
        self.inputs.settings.pairs().to_vec()
    }

    fn log(&mut self, level: Level, message: String) {
        if !self.records.admit(&self.policy) {
            return;
        }
        let msg = crate::text::clean(&message, MAX_LOG_LINE_BYTES);
        let policy = self.policy.as_str();
        match level {
            Level::Trace => tracing::trace!(policy, "{msg}"),
            Level::Debug => tracing::debug!(policy, "{msg}"),
            Level::Info => tracing::info!(policy, "{msg}"),
            Level::Warn => tracing::warn!(policy, "{msg}"),
            Level::Error => tracing::error!(policy, "{msg}"),
        }
    }
}

/// Refuses memory growth past the limit and remembers that it did, so the
/// resulting trap is reported as a memory-limit error.
struct MemoryLimiter {
    limit: usize,
    /// All memories of the decision together.
    used: usize,
    hit: bool,
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self.used.saturating_sub(current).saturating_add(desired);
        if total > self.limit {
            self.hit = true;
            return Ok(false);
        }
        self.used = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }
}
