//! What `nmo demo --policy NAME` adds to its cluster for a shipped policy
//! whose difference from the default shows only with it: a pod that never
//! goes (`give-up`, `escalate`), a window that opens while the demo runs
//! (`window`), more maintenances at once, so that admission differs
//! (`rate`, `max-unavailable`, `one-per-zone`, with zones), and the
//! settings and annotations that make each act within a minute.

use std::collections::BTreeMap;
use std::time::SystemTime;

/// A pod no eviction moves: one replica behind `minAvailable: 1`, on
/// worker-1.
const STUCK: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: singleton, namespace: shop}
spec:
  replicas: 1
  selector: {matchLabels: {app: singleton}}
  template:
    metadata: {labels: {app: singleton}}
    spec: {nodeSelector: {kubernetes.io/hostname: worker-1}, containers: [{name: s, image: "singleton:1"}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: singleton, namespace: shop}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: singleton}}
"#;

/// What the demo adds for one policy.
#[derive(Debug, Default)]
pub(super) struct Scene {
    /// The policy's settings (as `policies.yaml` gives them).
    pub settings: BTreeMap<String, String>,
    /// Objects created with the workload (YAML documents).
    pub objects: &'static str,
    /// Annotations on the demo's NodeMaintenance.
    pub annotations: BTreeMap<String, String>,
    /// What to watch for, said before the maintenance starts.
    pub says: String,
    /// Nodes whose maintenances are created just after worker-1's (those
    /// the demo's cluster has).
    pub others: &'static [&'static str],
    /// Labels put on nodes first: (node, key, value).
    pub labels: &'static [(&'static str, &'static str, &'static str)],
}

fn pairs(list: &[(&str, &str)]) -> BTreeMap<String, String> {
    list.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The scene for the policy `name` (as the cluster names it:
/// `give-up`), if it has one; `now` places the window.
pub(super) fn scene(name: &str, now: SystemTime) -> Option<Scene> {
    match name {
        "give-up" => Some(Scene {
            objects: STUCK,
            annotations: pairs(&[("nmo.medik8s.io/give-up-after", "20s")]),
            says: "shop/singleton's budget never allows its eviction; give-up fails the maintenance \
                   at the first incomplete drain past 20 s (the annotation), and the node is given back"
                .into(),
            ..Scene::default()
        }),
        "escalate" => Some(Scene {
            settings: pairs(&[("namespaces", "shop"), ("deadline", "10s"), ("parkAfter", "5m")]),
            objects: STUCK,
            says: "shop/singleton's budget never allows its eviction; escalate may force pods of \
                   namespace shop (its settings), so after 10 s of refusals it deletes the pod, \
                   bypassing the budget, and says so in a ForcedPodRemoval event"
                .into(),
            ..Scene::default()
        }),
        "window" => {
            let (start, end) = window_from(now);
            Some(Scene {
                settings: pairs(&[("start", &start), ("end", &end), ("utc-offset", "UTC")]),
                says: format!(
                    "the window opens at {start} UTC (the next minute; its settings): until then \
                     the maintenance waits for admission, touching nothing, then it drains"
                ),
                ..Scene::default()
            })
        }
        "max-unavailable" => Some(Scene {
            others: &["worker-2", "worker-3"],
            says: "maintenances of worker-2 and worker-3 are created just after worker-1's; \
                   max-unavailable lets one node of the pool (its default, 1) be unavailable at \
                   once, so they wait, touching nothing, while worker-1's holds its node"
                .into(),
            ..Scene::default()
        }),
        "rate" => Some(Scene {
            settings: pairs(&[("max", "1"), ("history-window", "1h")]),
            others: &["worker-2"],
            says: "a maintenance of worker-2 is created just after worker-1's; rate starts at \
                   most 1 maintenance an hour (its settings), so worker-2's waits"
                .into(),
            ..Scene::default()
        }),
        "one-per-zone" => Some(Scene {
            others: &["worker-2", "worker-3"],
            labels: &[
                ("worker-1", ZONE, "zone-a"),
                ("worker-2", ZONE, "zone-a"),
                ("worker-3", ZONE, "zone-b"),
            ],
            says: "worker-1 and worker-2 are in zone-a, worker-3 in zone-b; maintenances of \
                   worker-2 and worker-3 are created just after worker-1's: one-per-zone holds \
                   worker-2's (worker-1 has zone-a) and lets worker-3's run beside worker-1's"
                .into(),
            ..Scene::default()
        }),
        _ => None,
    }
}

/// The zone label one-per-zone reads.
const ZONE: &str = "topology.kubernetes.io/zone";

/// A window from the next whole minute (UTC) to an hour later, as
/// `HH:MM`.
fn window_from(now: SystemTime) -> (String, String) {
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let minute = (secs / 60 + 1) % (24 * 60);
    let hhmm = |m: u64| format!("{:02}:{:02}", m / 60, m % 60);
    (hhmm(minute), hhmm((minute + 60) % (24 * 60)))
}

/// `policies.yaml` for one policy with its settings.
pub(super) fn policies_yaml(policy: &str, settings: &BTreeMap<String, String>) -> String {
    let mut text = format!("default: {policy}\n");
    if !settings.is_empty() {
        text.push_str(&format!("settings:\n  {policy}:\n"));
        for (k, v) in settings {
            text.push_str(&format!("    {k}: {v:?}\n"));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_window_opens_at_the_next_minute() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(23 * 3600 + 59 * 60 + 30);
        assert_eq!(window_from(at), ("00:00".into(), "01:00".into()));
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(10 * 3600 + 5 * 60);
        assert_eq!(window_from(at), ("10:06".into(), "11:06".into()));
    }

    #[test]
    fn settings_go_under_the_policys_name() {
        let yaml = policies_yaml("window", &pairs(&[("start", "10:06"), ("end", "11:06")]));
        assert_eq!(
            yaml,
            "default: window\nsettings:\n  window:\n    end: \"11:06\"\n    start: \"10:06\"\n"
        );
        assert_eq!(
            policies_yaml("give-up", &BTreeMap::new()),
            "default: give-up\n"
        );
    }
}
