//! Contract 0.3 policies in this 0.4 host: the 0.3 `types` interface
//! answered by the 0.4 accessors on the same `pod` and `node` resources
//! (0.4 only added a pod's `workload`), and the records its exports take
//! and answer converted field for field ([`To`]), for its own binding
//! (`exports.rs`).

use wasmtime::component::{HasSelf, Linker, Resource};

use super::inputs::HostState;
use crate::bindings::types::{self as v4, HostNode, HostPod};
use crate::bindings::v0_3::medik8s::node_maintenance::types as v3;

/// Links the 0.3 `types` interface (`medik8s:node-maintenance/types@0.3.0`).
pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    v3::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)
}

/// A value of one contract's type as the same value of another's (the
/// records of two versions, field for field).
pub(crate) trait To<T> {
    fn to(self) -> T;
}

impl<A: To<B>, B> To<Vec<B>> for Vec<A> {
    fn to(self) -> Vec<B> {
        self.into_iter().map(To::to).collect()
    }
}

impl<A: To<B>, B> To<Option<B>> for Option<A> {
    fn to(self) -> Option<B> {
        self.map(To::to)
    }
}

/// Types both versions share as they are.
macro_rules! same {
    ($($t:ty),*) => { $(impl To<$t> for $t { fn to(self) -> $t { self } })* };
}
same!(String, bool, u32, u64, i64, Resource<v4::Node>);

/// A record: every field converted.
macro_rules! record {
    ($a:path => $b:path { $($f:ident),* $(,)? }) => {
        impl To<$b> for $a {
            fn to(self) -> $b {
                use $b as Target;
                Target { $($f: self.$f.to()),* }
            }
        }
    };
}

/// An enum or a variant: every case, with its payload converted.
macro_rules! cases {
    ($a:path => $b:path { $($c:ident),* $(,)? } { $($d:ident),* $(,)? }) => {
        impl To<$b> for $a {
            fn to(self) -> $b {
                use $a as From;
                use $b as Target;
                match self {
                    $(From::$c => Target::$c,)*
                    $(From::$d(x) => Target::$d(x.to()),)*
                }
            }
        }
    };
}

// What 0.3's exports take: the current records, down.
record!(v4::KeyValue => v3::KeyValue { key, value });
record!(v4::Maintenance => v3::Maintenance {
    name, node_name, reason, labels, annotations, phase, drain_progress,
    error_on_lease_count, attempt, elapsed_ms, now_ms, created_ms,
});
cases!(v4::MaintenancePhase => v3::MaintenancePhase { Running, Succeeded, Failed } {});
record!(v4::Fleet => v3::Fleet { nodes, maintenances, etcd, history });
record!(v4::FleetMaintenance => v3::FleetMaintenance {
    name, node_name, phase, admitted, parked, since_ms, created_ms,
});
record!(v4::EtcdGuard => v3::EtcdGuard { budgets, disruptions_allowed, guard_ready_on_node });
record!(v4::EndedMaintenance => v3::EndedMaintenance { name, node_name, started_ms, ended_ms, outcome });
cases!(v4::Outcome => v3::Outcome { Succeeded, Failed, Cancelled } {});
cases!(v4::Failure => v3::Failure { NodeNotFound } {
    LeaseHeld, LeaseError, DrainIncomplete, ApiError, VolumesAttached,
});
record!(v4::DrainReport => v3::DrainReport { pending, pdb_blocked, blocked, waited, timed_out, message });
record!(v4::PodRef => v3::PodRef { namespace, name });

// What 0.3's exports answer: up to the current records.
cases!(v3::Admission => v4::Admission { Admit } { Wait, Deny });
record!(v3::Waiting => v4::Waiting { reason, recheck_after_ms });
record!(v3::DrainPlan => v4::DrainPlan {
    decisions, attempt_timeout_ms, max_concurrent_evictions, volume_detach_timeout_ms,
});
record!(v3::PodDecision => v4::PodDecision { pod, action, order });
cases!(v3::PodAction => v4::PodAction {} { Evict, Delete, Skip, Block, Surge, Notify, Wait });
record!(v3::Removal => v4::Removal { grace_period_seconds, rule });
record!(v3::Notice => v4::Notice { timeout_ms, heartbeat_ms, then, removal });
cases!(v3::RemovalMethod => v4::RemovalMethod { Evict, Delete } {});
record!(v3::Completion => v4::Completion { timeout_ms, reason });
cases!(v3::Verdict => v4::Verdict { RetryWithBackoff } { RetryAfterMs, Fail, Park });
record!(v3::Parking => v4::Parking { reason, recheck_after_ms });

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
        HostPod::labels(self, pod).to()
    }
    fn annotations(&mut self, pod: Resource<v3::Pod>) -> Vec<v3::KeyValue> {
        HostPod::annotations(self, pod).to()
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
        HostNode::labels(self, node).to()
    }
    fn annotations(&mut self, node: Resource<v3::Node>) -> Vec<v3::KeyValue> {
        HostNode::annotations(self, node).to()
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
