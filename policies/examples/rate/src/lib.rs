//! rate: at most N maintenances started per time window, and a soak time
//! after each node, from the fleet's history.
//!
//! "At most 30 % of the nodes in 10 minutes" (Karpenter #2909), AKS's
//! `nodeSoakDurationInMinutes`, Rancher's `postCompleteDelay`. A
//! maintenance may start when:
//! - fewer than `max` maintenances started within the `history-window`
//!   (the ones still holding a node and the ones that ended, from the
//!   fleet's history; `max` is a number, or a percentage of the nodes,
//!   rounded down, at least 1), and
//! - the last one to end did so at least `soak` ago (default 0: no soak).
//!
//! Waiting maintenances go first-created, first-served. The drain and the
//! failures are the default policy's.

use nmo_policy_sdk::*;

pub const MAX: &str = "max";
pub const WINDOW: &str = "history-window";
pub const SOAK: &str = "soak";
/// The window when the setting gives none (the host's default).
pub const DEFAULT_WINDOW_MS: u64 = 60 * 60 * 1000;

struct Rate;

/// `max`: a count, or a percentage of `nodes`.
fn allowed(text: &str, nodes: usize) -> Option<u64> {
    let t = text.trim();
    match t.strip_suffix('%') {
        Some(p) => {
            let p: u64 = p.trim().parse().ok().filter(|p| (1..=100).contains(p))?;
            Some((nodes as u64 * p / 100).max(1))
        }
        None => t.parse().ok().filter(|n| *n > 0),
    }
}

/// The answer for `m`, given its settings.
pub fn admit_at_rate(m: &Maintenance, fleet: &Fleet, settings: &Settings) -> Admission {
    let window = settings
        .duration_ms(WINDOW)
        .ok()
        .flatten()
        .unwrap_or(DEFAULT_WINDOW_MS);
    let soak = settings.duration_ms(SOAK).ok().flatten().unwrap_or(0);
    let max = allowed(settings.get(MAX).unwrap_or("1"), fleet.nodes.len()).unwrap_or(1);
    let since = m.now_ms.saturating_sub(window);
    // Started within the window: those holding a node now (admitted) and
    // those that ended.
    let holding = fleet.admitted().filter(|o| o.since_ms >= since).count();
    let ended = fleet
        .history
        .iter()
        .filter(|e| e.started_ms >= since && e.name != m.name)
        .count();
    let ahead = fleet.waiting_before(m).count();
    let started = (holding + ended) as u64;
    if started + ahead as u64 >= max {
        return Admission::wait(
            format!(
                "{started} maintenance(s) started in the last {} ({holding} holding a node, {ended} ended){}; at most {max}",
                show_ms(window),
                if ahead > 0 {
                    format!(", {ahead} waiting created earlier")
                } else {
                    String::new()
                }
            ),
            Some(60_000),
        );
    }
    if soak > 0
        && let Some(last) = fleet.history.iter().map(|e| e.ended_ms).max()
    {
        let soaked = m.now_ms.saturating_sub(last);
        if soaked < soak {
            let node = fleet
                .history
                .iter()
                .find(|e| e.ended_ms == last)
                .map(|e| e.node_name.clone())
                .unwrap_or_default();
            return Admission::wait(
                format!(
                    "soaking: node {node} came back {} ago, {} of soak time",
                    show_ms(soaked),
                    show_ms(soak)
                ),
                Some(soak - soaked),
            );
        }
    }
    Admission::Admit
}

impl Policy for Rate {
    fn admit(m: Maintenance, node: Node, fleet: Fleet) -> Admission {
        defaults::admit_with(&m, &node, &fleet, || {
            admit_at_rate(&m, &fleet, &Settings::current())
        })
    }

    fn validate_settings(settings: Settings) -> Result<(), String> {
        settings.allow_only(&[MAX, WINDOW, SOAK])?;
        settings.duration_ms(WINDOW)?;
        settings.duration_ms(SOAK)?;
        if let Some(m) = settings.get(MAX)
            && allowed(m, 100).is_none()
        {
            return Err(format!(
                "setting max: {m:?} is neither a number above 0 nor a percentage (1% to 100%)"
            ));
        }
        Ok(())
    }
}

export_policy!(Rate);
