//! one-per-zone: the default policy's drain, but at most one node of a zone
//! in maintenance at a time.
//!
//! A maintenance whose node is in a zone (the `topology.kubernetes.io/zone`
//! label, or the label the `label` setting names) waits while another
//! maintenance of that zone holds its node (admitted, until deleted), while
//! another node of the zone is NotReady (the zone is already short of a
//! node), or while another tool or a person has taken one away
//! ([`Node::claim`]: Karpenter, the cluster autoscaler, kured, a medik8s
//! remediation, another tool's taint, a cordon).
//! Maintenances of one zone start in the order they were created; other
//! zones are not held up. A node without the label is in a zone of its own
//! name: it never waits for others.
//!
//! Settings (`policies.yaml`): `label` (the zone label), `max-per-zone`
//! (default 1), `ignore-taints` (comma-separated taint keys that take no
//! node away: a dedicated pool's own, say).

use nmo_policy_sdk::*;

/// The zone label, unless the `label` setting names another.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

struct OnePerZone;

/// The zone of a node: its label, or, without one, the node's own name.
fn zone(node: &Node, label: &str) -> String {
    node.label(label)
        .unwrap_or_else(|| format!("(node {})", node.name()))
}

fn limits() -> (String, u64, Vec<String>) {
    let s = Settings::current();
    let label = s.get("label").unwrap_or(ZONE_LABEL).to_owned();
    let max = s.number("max-per-zone").ok().flatten().unwrap_or(1);
    (label, max, ignored_taints(&s))
}

/// The `ignore-taints` setting: taint keys, comma-separated.
pub fn ignored_taints(s: &Settings) -> Vec<String> {
    s.get("ignore-taints")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The answer for a maintenance of `node`, given the fleet.
pub fn admit_in_zone(
    m: &Maintenance,
    node: &Node,
    fleet: &Fleet,
    label: &str,
    max: u64,
    ignore: &[&str],
) -> Admission {
    let mine = zone(node, label);
    let in_zone = |name: &str| fleet.node(name).is_some_and(|n| zone(n, label) == mine);
    let busy: Vec<&FleetMaintenance> = fleet
        .admitted()
        .filter(|o| o.node_name != m.node_name && in_zone(&o.node_name))
        .collect();
    let under_maintenance = |n: &str| busy.iter().any(|o| o.node_name == n);
    let not_ready: Vec<&str> = fleet
        .nodes
        .iter()
        .filter(|n| n.name() != m.node_name && !n.is_ready() && zone(n, label) == mine)
        .map(|n| n.name())
        .filter(|n| !under_maintenance(n))
        .collect();
    let claimed: Vec<(&str, Claim)> = fleet
        .nodes
        .iter()
        .filter(|n| n.name() != m.node_name && n.is_ready() && zone(n, label) == mine)
        .filter(|n| !under_maintenance(n.name()))
        .filter_map(|n| n.claim(ignore).map(|c| (n.name(), c)))
        .collect();
    let ahead: Vec<&FleetMaintenance> = fleet
        .waiting_before(m)
        .filter(|o| in_zone(&o.node_name))
        .collect();
    let down = (busy.len() + not_ready.len() + claimed.len()) as u64;
    if down + (ahead.len() as u64) < max {
        return Admission::Admit;
    }
    let why = if let Some(o) = busy.first() {
        format!(
            "{} of zone {mine} is in maintenance ({})",
            o.node_name, o.name
        )
    } else if let Some(n) = not_ready.first() {
        format!("{n} of zone {mine} is NotReady")
    } else if let Some((n, claim)) = claimed.first() {
        format!("{n} of zone {mine} is {claim}")
    } else {
        let o = ahead[0];
        format!(
            "{} ({}) of zone {mine} was created first",
            o.node_name, o.name
        )
    };
    Admission::wait(
        format!("{why}; at most {max} node(s) per zone at once"),
        None,
    )
}

impl Policy for OnePerZone {
    // The drain and the failures: the default policy's (the trait's
    // defaults).

    fn admit(m: Maintenance, node: Node, fleet: Fleet) -> Admission {
        defaults::admit_with(&m, &node, &fleet, || {
            let (label, max, ignore) = limits();
            let ignore: Vec<&str> = ignore.iter().map(String::as_str).collect();
            admit_in_zone(&m, &node, &fleet, &label, max, &ignore)
        })
    }

    fn validate_settings(settings: Settings) -> Result<(), String> {
        settings.allow_only(&["label", "max-per-zone", "ignore-taints"])?;
        match settings.number("max-per-zone")? {
            Some(0) => Err("setting max-per-zone: 0 would never let a maintenance start".into()),
            _ => Ok(()),
        }
    }
}

export_policy!(OnePerZone);

#[cfg(test)]
mod tests {
    use super::*;
    use nmo_policy_sdk::testing::{fleet, maintenance, node, other};

    fn zoned(name: &str, zone: &str) -> Node {
        node(name).with_label(ZONE_LABEL, zone).schedulable()
    }

    #[test]
    fn another_zone_is_not_held_up_but_the_same_zone_is() {
        let m = maintenance("a-2");
        let nodes = || vec![zoned("a-1", "a"), zoned("a-2", "a"), zoned("b-1", "b")];
        let busy_b = fleet(nodes(), vec![other("b-1", true, 0)]);
        assert!(matches!(
            admit_in_zone(&m, &zoned("a-2", "a"), &busy_b, ZONE_LABEL, 1, &[]),
            Admission::Admit
        ));
        let busy_a = fleet(nodes(), vec![other("a-1", true, 0)]);
        assert!(matches!(
            admit_in_zone(&m, &zoned("a-2", "a"), &busy_a, ZONE_LABEL, 1, &[]),
            Admission::Wait(w) if w.reason.contains("a-1 of zone a is in maintenance")
        ));
    }
}
