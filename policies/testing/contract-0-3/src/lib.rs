//! A policy built against contract 0.3.0 (`runtime/wit-compat`), as one
//! built before 0.4 is: no SDK, the 0.3 WIT alone. It reads every pod
//! and node accessor of 0.3 and says what it read in each pod's skip
//! reason, so the host's test can check that a 0.4 host answers a 0.3
//! policy exactly: `<ns>/<name> uid=.. phase=.. ready=.. owners=kind/name
//! labels=k=v annotations=k=v history=pending/refused/attempts
//! node=<name> taints=key:effect`.

#[allow(missing_docs, clippy::all)]
mod bindings {
    wit_bindgen::generate!({
        path: "../../../runtime/wit-compat/node-maintenance-0.3.0.wit",
        world: "drain-policy",
    });
}

use bindings::medik8s::node_maintenance::types::*;
use bindings::{Guest, KeyValue};

struct Contract03;

fn shown(pairs: Vec<KeyValue>) -> String {
    let list: Vec<String> = pairs
        .iter()
        .map(|kv| format!("{}={}", kv.key, kv.value))
        .collect();
    list.join(",")
}

fn described(pod: &Pod, node: &str) -> String {
    let owners: Vec<String> = pod
        .owners()
        .iter()
        .map(|o| format!("{}/{}", o.kind, o.name))
        .collect();
    let h = pod.drain_history();
    format!(
        "{}/{} uid={} phase={:?} ready={} owners={} labels={} annotations={} history={}/{}/{} {}",
        pod.namespace(),
        pod.name(),
        pod.uid(),
        pod.phase(),
        pod.ready(),
        owners.join(","),
        shown(pod.labels()),
        shown(pod.annotations()),
        h.pending_ms,
        h.refused_evictions,
        h.attempts,
        node,
    )
}

impl Guest for Contract03 {
    fn validate_settings(_settings: Vec<KeyValue>) -> Result<(), String> {
        Ok(())
    }

    fn admit(_m: Maintenance, _node: Node, _fleet: Fleet) -> Admission {
        Admission::Admit
    }

    fn plan_drain(_m: Maintenance, node: Node, pods: Vec<Pod>) -> DrainPlan {
        let taints: Vec<String> = node
            .taints()
            .iter()
            .map(|t| format!("{}:{:?}", t.key, t.effect))
            .collect();
        let node = format!("node={} taints={}", node.name(), taints.join(","));
        let decisions = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| PodDecision {
                pod: i as u32,
                action: PodAction::Skip(described(pod, &node)),
                order: 0,
            })
            .collect();
        DrainPlan {
            decisions,
            attempt_timeout_ms: 30_000,
            max_concurrent_evictions: None,
            volume_detach_timeout_ms: None,
        }
    }

    fn on_failure(_m: Maintenance, _failure: Failure) -> Verdict {
        Verdict::RetryWithBackoff
    }
}

bindings::export!(Contract03 with_types_in bindings);
