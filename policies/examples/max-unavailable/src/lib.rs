//! max-unavailable: the default policy's drain, but never more than N (or
//! N%) of a group of nodes unavailable at once.
//!
//! The group is the nodes the `selector` setting picks (`key=value` pairs,
//! comma-separated, all must match; default: every node). A node of the
//! group is unavailable while it is NotReady, under an admitted
//! maintenance that still holds it (until the NodeMaintenance is deleted),
//! or taken away by another tool or a person ([`Node::claim`]: Karpenter,
//! the cluster autoscaler, kured, a medik8s remediation, another tool's
//! taint, a cordon). A
//! maintenance of a group node starts only if,
//! counting it and the group's maintenances created before it that still
//! wait, no more than `max` would be unavailable; a maintenance of a node
//! outside the group is not held. `max` is a number (`2`) or a percentage
//! of the group (`25%`, rounded down, at least 1). A node already NotReady
//! makes nothing worse: its maintenance starts.
//!
//! Settings (`policies.yaml`): `max` (default 1), `selector`,
//! `ignore-taints` (comma-separated taint keys that take no node away: a
//! dedicated pool's own, say), `max-parked` (AKS's `maxBlockedNodes`:
//! up to this many maintenances parked by their policy, an undrainable
//! node set aside, do not count against `max`, so the rest of the group
//! moves on; one more parked and nothing starts until a person looks;
//! default 0: a parked maintenance counts like any other).

use nmo_policy_sdk::*;

struct MaxUnavailable;

/// `max`: a count, or a percentage of the group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Max {
    Count(u64),
    Percent(u64),
}

impl Max {
    pub fn parse(text: &str) -> Result<Max, String> {
        let t = text.trim();
        let bad =
            || format!("setting max: {text:?} is neither a number (2) nor a percentage (25%)");
        match t.strip_suffix('%') {
            Some(p) => match p.trim().parse::<u64>() {
                Ok(p) if (1..=100).contains(&p) => Ok(Max::Percent(p)),
                Ok(_) => Err(format!("setting max: {text:?} must be between 1% and 100%")),
                Err(_) => Err(bad()),
            },
            None => match t.parse::<u64>() {
                Ok(0) => Err("setting max: 0 would never let a maintenance start".into()),
                Ok(n) => Ok(Max::Count(n)),
                Err(_) => Err(bad()),
            },
        }
    }

    /// How many of `group` nodes may be unavailable.
    pub fn of(self, group: usize) -> u64 {
        match self {
            Max::Count(n) => n,
            Max::Percent(p) => (group as u64 * p / 100).max(1),
        }
    }
}

/// `key=value,key2=value2`: every pair must match.
pub fn parse_selector(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
            _ => Err(format!("setting selector: {pair:?} is not key=value")),
        })
        .collect()
}

fn picks(selector: &[(String, String)], node: &Node) -> bool {
    selector
        .iter()
        .all(|(k, v)| node.label(k).as_deref() == Some(v.as_str()))
}

/// The answer for a maintenance of `node`.
pub fn admit_within(
    m: &Maintenance,
    node: &Node,
    fleet: &Fleet,
    max: Max,
    selector: &[(String, String)],
    ignore: &[&str],
    max_parked: u64,
) -> Admission {
    if !picks(selector, node) || !node.is_ready() {
        return Admission::Admit;
    }
    let group: Vec<&Node> = fleet.nodes.iter().filter(|n| picks(selector, n)).collect();
    let in_group = |name: &str| group.iter().any(|n| n.name() == name);
    let allowed = max.of(group.len());
    let admitted: Vec<&str> = fleet
        .admitted()
        .filter(|o| o.node_name != m.node_name && in_group(&o.node_name))
        .map(|o| o.node_name.as_str())
        .collect();
    let not_ready = group
        .iter()
        .filter(|n| n.name() != m.node_name && !n.is_ready() && !admitted.contains(&n.name()))
        .count();
    let claimed: Vec<(&str, Claim)> = group
        .iter()
        .filter(|n| n.name() != m.node_name && n.is_ready() && !admitted.contains(&n.name()))
        .filter_map(|n| n.claim(ignore).map(|c| (n.name(), c)))
        .collect();
    let ahead = fleet
        .waiting_before(m)
        .filter(|o| in_group(&o.node_name))
        .count();
    let parked = fleet
        .parked()
        .filter(|o| o.node_name != m.node_name && in_group(&o.node_name))
        .count();
    if max_parked > 0 && parked as u64 > max_parked {
        return Admission::wait(
            format!(
                "{parked} maintenance(s) of the group parked, more than the {max_parked} allowed: \
                 a person must look before another node goes"
            ),
            None,
        );
    }
    let set_aside = if max_parked > 0 { parked } else { 0 };
    let down = admitted.len() - set_aside + not_ready + claimed.len();
    if ((down + ahead) as u64) < allowed {
        return Admission::Admit;
    }
    let mut why = format!(
        "{down} of {} node(s) unavailable ({} in maintenance, {not_ready} NotReady",
        group.len(),
        admitted.len()
    );
    match claimed.as_slice() {
        [] => why.push(')'),
        [(n, claim)] => why.push_str(&format!(", 1 taken elsewhere: {n} is {claim})")),
        [(n, claim), rest @ ..] => why.push_str(&format!(
            ", {} taken elsewhere: {n} is {claim}, and {} more)",
            claimed.len(),
            rest.len()
        )),
    }
    if ahead > 0 {
        why.push_str(&format!(", {ahead} waiting maintenance(s) created earlier"));
    }
    if set_aside > 0 {
        why.push_str(&format!(", {set_aside} parked not counted"));
    }
    Admission::wait(format!("{why}; at most {allowed} at once"), None)
}

fn configured() -> (Max, Vec<(String, String)>, Vec<String>, u64) {
    let s = Settings::current();
    let max = s
        .get("max")
        .and_then(|m| Max::parse(m).ok())
        .unwrap_or(Max::Count(1));
    let selector = s
        .get("selector")
        .and_then(|t| parse_selector(t).ok())
        .unwrap_or_default();
    let ignore = s
        .get("ignore-taints")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect();
    let max_parked = s.number("max-parked").ok().flatten().unwrap_or(0);
    (max, selector, ignore, max_parked)
}

impl Policy for MaxUnavailable {
    // The drain and the failures: the default policy's (the trait's
    // defaults).

    fn admit(m: Maintenance, node: Node, fleet: Fleet) -> Admission {
        defaults::admit_with(&m, &node, &fleet, || {
            let (max, selector, ignore, max_parked) = configured();
            let ignore: Vec<&str> = ignore.iter().map(String::as_str).collect();
            admit_within(&m, &node, &fleet, max, &selector, &ignore, max_parked)
        })
    }

    fn validate_settings(settings: Settings) -> Result<(), String> {
        settings.allow_only(&["max", "selector", "ignore-taints", "max-parked"])?;
        settings.number("max-parked")?;
        if let Some(m) = settings.get("max") {
            Max::parse(m)?;
        }
        if let Some(s) = settings.get("selector") {
            parse_selector(s)?;
        }
        Ok(())
    }
}

export_policy!(MaxUnavailable);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_round_down_but_allow_one() {
        assert_eq!(Max::parse("25%").unwrap().of(12), 3);
        assert_eq!(Max::parse("10%").unwrap().of(5), 1);
        assert_eq!(Max::parse("2").unwrap().of(100), 2);
        for bad in ["0", "0%", "150%", "many", "-1"] {
            assert!(Max::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn selectors_are_key_value_pairs() {
        assert_eq!(
            parse_selector("pool=gpu, zone=a").unwrap(),
            vec![("pool".into(), "gpu".into()), ("zone".into(), "a".into())]
        );
        assert!(parse_selector("pool").is_err());
    }
}
