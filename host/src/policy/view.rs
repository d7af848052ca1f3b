//! Borrowed views of the policy's input records.
//!
//! The canonical ABI copies every string into the guest anyway, so building
//! owned records first (cloning every label, annotation and owner of every
//! pod) is pure overhead. These views borrow from the Kubernetes objects (or
//! from owned records) and lower straight into the guest. Field for field
//! they are the WIT records `pod`, `node`, `key-value`, `owner` and `taint`;
//! wasmtime checks that at every call, and the tests call them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as k8s;
use wasmtime::component::{ComponentType, Lower};

use super::convert;
use super::types::{KeyValue, Node, Owner, Pod, PodPhase, Taint, TaintEffect};

/// `key-value`, borrowed.
#[derive(ComponentType, Lower, Clone, Copy, Debug)]
#[component(record)]
pub struct KeyValueView<'a> {
    pub key: &'a str,
    pub value: &'a str,
}

/// `owner`, borrowed.
#[derive(ComponentType, Lower, Clone, Copy, Debug)]
#[component(record)]
pub struct OwnerView<'a> {
    #[component(name = "api-version")]
    pub api_version: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub controller: bool,
}

/// `pod`, borrowed.
#[derive(ComponentType, Lower, Clone, Debug)]
#[component(record)]
pub struct PodView<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub labels: Vec<KeyValueView<'a>>,
    pub annotations: Vec<KeyValueView<'a>>,
    pub owners: Vec<OwnerView<'a>>,
    pub phase: PodPhase,
    pub ready: bool,
    pub mirror: bool,
    #[component(name = "local-storage")]
    pub local_storage: bool,
    pub terminating: bool,
    #[component(name = "grace-period-seconds")]
    pub grace_period_seconds: Option<i64>,
    pub priority: Option<i32>,
    #[component(name = "priority-class-name")]
    pub priority_class_name: &'a str,
}

/// `taint`, borrowed.
#[derive(ComponentType, Lower, Clone, Copy, Debug)]
#[component(record)]
pub struct TaintView<'a> {
    pub key: &'a str,
    pub value: &'a str,
    pub effect: TaintEffect,
}

/// `node`, borrowed.
#[derive(ComponentType, Lower, Clone, Debug)]
#[component(record)]
pub struct NodeView<'a> {
    pub name: &'a str,
    pub labels: Vec<KeyValueView<'a>>,
    pub annotations: Vec<KeyValueView<'a>>,
    pub taints: Vec<TaintView<'a>>,
    pub unschedulable: bool,
}

fn map_view(map: Option<&BTreeMap<String, String>>) -> Vec<KeyValueView<'_>> {
    map.map(|m| {
        m.iter()
            .map(|(k, v)| KeyValueView { key: k, value: v })
            .collect()
    })
    .unwrap_or_default()
}

fn list_view(list: &[KeyValue]) -> Vec<KeyValueView<'_>> {
    list.iter()
        .map(|kv| KeyValueView {
            key: &kv.key,
            value: &kv.value,
        })
        .collect()
}

impl<'a> PodView<'a> {
    /// Whether the pod's controller is a DaemonSet.
    pub fn daemonset_managed(&self) -> bool {
        self.owners
            .iter()
            .any(|o| o.controller && o.kind == "DaemonSet")
    }
}

impl<'a> From<&'a k8s::Pod> for PodView<'a> {
    fn from(p: &'a k8s::Pod) -> Self {
        let meta = &p.metadata;
        let spec = p.spec.as_ref();
        PodView {
            namespace: meta.namespace.as_deref().unwrap_or_default(),
            name: meta.name.as_deref().unwrap_or_default(),
            uid: meta.uid.as_deref().unwrap_or_default(),
            labels: map_view(meta.labels.as_ref()),
            annotations: map_view(meta.annotations.as_ref()),
            owners: meta
                .owner_references
                .iter()
                .flatten()
                .map(|o| OwnerView {
                    api_version: &o.api_version,
                    kind: &o.kind,
                    name: &o.name,
                    uid: &o.uid,
                    controller: o.controller == Some(true),
                })
                .collect(),
            phase: convert::pod_phase(p),
            ready: convert::pod_ready(p),
            mirror: convert::is_mirror(p),
            local_storage: convert::has_local_storage(p),
            terminating: meta.deletion_timestamp.is_some(),
            grace_period_seconds: spec.and_then(|s| s.termination_grace_period_seconds),
            priority: spec.and_then(|s| s.priority),
            priority_class_name: spec
                .and_then(|s| s.priority_class_name.as_deref())
                .unwrap_or_default(),
        }
    }
}

impl<'a> From<&'a Pod> for PodView<'a> {
    fn from(p: &'a Pod) -> Self {
        PodView {
            namespace: &p.namespace,
            name: &p.name,
            uid: &p.uid,
            labels: list_view(&p.labels),
            annotations: list_view(&p.annotations),
            owners: p.owners.iter().map(owner_view).collect(),
            phase: p.phase,
            ready: p.ready,
            mirror: p.mirror,
            local_storage: p.local_storage,
            terminating: p.terminating,
            grace_period_seconds: p.grace_period_seconds,
            priority: p.priority,
            priority_class_name: &p.priority_class_name,
        }
    }
}

fn owner_view(o: &Owner) -> OwnerView<'_> {
    OwnerView {
        api_version: &o.api_version,
        kind: &o.kind,
        name: &o.name,
        uid: &o.uid,
        controller: o.controller,
    }
}

fn taint_view(t: &Taint) -> TaintView<'_> {
    TaintView {
        key: &t.key,
        value: &t.value,
        effect: t.effect,
    }
}

impl<'a> From<&'a k8s::Node> for NodeView<'a> {
    fn from(n: &'a k8s::Node) -> Self {
        let spec = n.spec.as_ref();
        NodeView {
            name: n.metadata.name.as_deref().unwrap_or_default(),
            labels: map_view(n.metadata.labels.as_ref()),
            annotations: map_view(n.metadata.annotations.as_ref()),
            taints: spec
                .and_then(|s| s.taints.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|t| {
                    Some(TaintView {
                        key: &t.key,
                        value: t.value.as_deref().unwrap_or_default(),
                        effect: convert::taint_effect(&t.effect)?,
                    })
                })
                .collect(),
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        }
    }
}

impl<'a> From<&'a Node> for NodeView<'a> {
    fn from(n: &'a Node) -> Self {
        NodeView {
            name: &n.name,
            labels: list_view(&n.labels),
            annotations: list_view(&n.annotations),
            taints: n.taints.iter().map(taint_view).collect(),
            unschedulable: n.unschedulable,
        }
    }
}
