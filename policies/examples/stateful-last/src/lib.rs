//! stateful-last: the default policy's rules, except that StatefulSet pods
//! go last and one at a time.
//!
//! Everything that is not a StatefulSet pod is evicted first, in one wave.
//! Then each StatefulSet pod gets a wave of its own, highest ordinal first
//! (the order a StatefulSet scales down in), so a replicated database
//! loses at most one member at a time and only after the stateless
//! workload has moved. A wave starts when the previous one's pods are
//! gone, so each member has left before the next is asked to.

use nmo_policy_sdk::*;

struct StatefulLast;

/// The ordinal at the end of a StatefulSet pod's name (`db-2` → 2).
fn ordinal(pod: &Pod) -> u64 {
    pod.name()
        .rsplit_once('-')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(0)
}

impl Policy for StatefulLast {
    fn plan_drain(_m: Maintenance, _node: Node, pods: Vec<Pod>) -> DrainPlan {
        let mut plan = defaults::plan(&pods, defaults::pod_action);
        // StatefulSet pods that will be removed, in scale-down order.
        let mut stateful: Vec<usize> = pods
            .iter()
            .enumerate()
            .filter(|(i, p)| {
                p.controller_kind() == Some("StatefulSet")
                    && matches!(
                        plan.decisions[*i].action,
                        PodAction::Evict(_) | PodAction::Delete(_)
                    )
            })
            .map(|(i, _)| i)
            .collect();
        stateful.sort_by(|&a, &b| {
            let (pa, pb) = (&pods[a], &pods[b]);
            let set = |p: &Pod| p.controller().map(|o| o.name.clone()).unwrap_or_default();
            (pa.namespace(), set(pa), std::cmp::Reverse(ordinal(pa))).cmp(&(
                pb.namespace(),
                set(pb),
                std::cmp::Reverse(ordinal(pb)),
            ))
        });
        for (wave, i) in stateful.into_iter().enumerate() {
            plan.decisions[i].order = wave as u32 + 1;
        }
        plan
    }

    fn on_failure(m: Maintenance, failure: Failure) -> Verdict {
        defaults::on_failure(&m, &failure)
    }
}

export_policy!(StatefulLast);
