//! Contract 0.3 policies in this 0.4 host: the 0.3 `types` interface
//! answered by the 0.4 accessors on the same `pod` and `node` resources
//! (0.4 only added a pod's `workload`), its records converted field for
//! field. A 0.3 policy's exports have the same types in both versions, so
//! once this interface is linked it runs through the 0.4 bindings as is.

use wasmtime::component::{HasSelf, Linker, Resource};

use super::inputs::HostState;
use crate::bindings::types::{self as v4, HostNode, HostPod};
use crate::bindings::v0_3::medik8s::node_maintenance::types as v3;

/// Links the 0.3 `types` interface (`medik8s:node-maintenance/types@0.3.0`).
pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    v3::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)
}

fn key_values(list: Vec<v4::KeyValue>) -> Vec<v3::KeyValue> {
    list.into_iter()
        .map(|kv| v3::KeyValue {
            key: kv.key,
            value: kv.value,
        })
        .collect()
}

impl v3::Host for HostState {}

impl v3::HostPod for HostState {
    fn namespace(&mut self, pod: Resource<v3::Pod>) -> String {
        HostPod::namespace(self, pod)
    }
    fn name(&mut self, pod: Resource<v3::Pod>) -> String {
        HostPod::name(self, pod)
    }
    fn uid(&mut self, pod: Resource<v3::Pod>) -> String {
        HostPod::uid(self, pod)
    }
    fn label(&mut self, pod: Resource<v3::Pod>, key: String) -> Option<String> {
        HostPod::label(self, pod, key)
    }
    fn annotation(&mut self, pod: Resource<v3::Pod>, key: String) -> Option<String> {
        HostPod::annotation(self, pod, key)
    }
    fn labels(&mut self, pod: Resource<v3::Pod>) -> Vec<v3::KeyValue> {
        key_values(HostPod::labels(self, pod))
    }
    fn annotations(&mut self, pod: Resource<v3::Pod>) -> Vec<v3::KeyValue> {
        key_values(HostPod::annotations(self, pod))
    }
    fn owners(&mut self, pod: Resource<v3::Pod>) -> Vec<v3::Owner> {
        HostPod::owners(self, pod)
            .into_iter()
            .map(|o| v3::Owner {
                api_version: o.api_version,
                kind: o.kind,
                name: o.name,
                uid: o.uid,
                controller: o.controller,
            })
            .collect()
    }
    fn controller_kind(&mut self, pod: Resource<v3::Pod>) -> Option<String> {
        HostPod::controller_kind(self, pod)
    }
    fn phase(&mut self, pod: Resource<v3::Pod>) -> v3::PodPhase {
        match HostPod::phase(self, pod) {
            v4::PodPhase::Pending => v3::PodPhase::Pending,
            v4::PodPhase::Running => v3::PodPhase::Running,
            v4::PodPhase::Succeeded => v3::PodPhase::Succeeded,
            v4::PodPhase::Failed => v3::PodPhase::Failed,
            v4::PodPhase::Unknown => v3::PodPhase::Unknown,
        }
    }
    fn ready(&mut self, pod: Resource<v3::Pod>) -> bool {
        HostPod::ready(self, pod)
    }
    fn mirror(&mut self, pod: Resource<v3::Pod>) -> bool {
        HostPod::mirror(self, pod)
    }
    fn local_storage(&mut self, pod: Resource<v3::Pod>) -> bool {
        HostPod::local_storage(self, pod)
    }
    fn terminating(&mut self, pod: Resource<v3::Pod>) -> bool {
        HostPod::terminating(self, pod)
    }
    fn grace_period_seconds(&mut self, pod: Resource<v3::Pod>) -> Option<i64> {
        HostPod::grace_period_seconds(self, pod)
    }
    fn priority(&mut self, pod: Resource<v3::Pod>) -> Option<i32> {
        HostPod::priority(self, pod)
    }
    fn priority_class_name(&mut self, pod: Resource<v3::Pod>) -> String {
        HostPod::priority_class_name(self, pod)
    }
    fn deletion_deadline_ms(&mut self, pod: Resource<v3::Pod>) -> Option<u64> {
        HostPod::deletion_deadline_ms(self, pod)
    }
    fn drain_history(&mut self, pod: Resource<v3::Pod>) -> v3::PodHistory {
        let h = HostPod::drain_history(self, pod);
        v3::PodHistory {
            pending_ms: h.pending_ms,
            refused_evictions: h.refused_evictions,
            attempts: h.attempts,
            notified_ms: h.notified_ms,
        }
    }
    fn drop(&mut self, pod: Resource<v3::Pod>) -> wasmtime::Result<()> {
        HostPod::drop(self, pod)
    }
}

impl v3::HostNode for HostState {
    fn name(&mut self, node: Resource<v3::Node>) -> String {
        HostNode::name(self, node)
    }
    fn label(&mut self, node: Resource<v3::Node>, key: String) -> Option<String> {
        HostNode::label(self, node, key)
    }
    fn annotation(&mut self, node: Resource<v3::Node>, key: String) -> Option<String> {
        HostNode::annotation(self, node, key)
    }
    fn labels(&mut self, node: Resource<v3::Node>) -> Vec<v3::KeyValue> {
        key_values(HostNode::labels(self, node))
    }
    fn annotations(&mut self, node: Resource<v3::Node>) -> Vec<v3::KeyValue> {
        key_values(HostNode::annotations(self, node))
    }
    fn taints(&mut self, node: Resource<v3::Node>) -> Vec<v3::Taint> {
        HostNode::taints(self, node)
            .into_iter()
            .map(|t| v3::Taint {
                key: t.key,
                value: t.value,
                effect: match t.effect {
                    v4::TaintEffect::NoSchedule => v3::TaintEffect::NoSchedule,
                    v4::TaintEffect::PreferNoSchedule => v3::TaintEffect::PreferNoSchedule,
                    v4::TaintEffect::NoExecute => v3::TaintEffect::NoExecute,
                },
            })
            .collect()
    }
    fn unschedulable(&mut self, node: Resource<v3::Node>) -> bool {
        HostNode::unschedulable(self, node)
    }
    fn ready(&mut self, node: Resource<v3::Node>) -> bool {
        HostNode::ready(self, node)
    }
    fn lease_holder(&mut self, node: Resource<v3::Node>) -> Option<String> {
        HostNode::lease_holder(self, node)
    }
    fn tool_claims(&mut self, node: Resource<v3::Node>) -> Vec<String> {
        HostNode::tool_claims(self, node)
    }
    fn drop(&mut self, node: Resource<v3::Node>) -> wasmtime::Result<()> {
        HostNode::drop(self, node)
    }
}
