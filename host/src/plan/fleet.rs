//! `nmo plan --fleet`: every maintenance that holds or waits for a node,
//! in the operator's order, the budgets' headroom spent across nodes, and
//! an estimate.

use super::*;

/// `nmo plan --fleet`: every maintenance that holds or waits for a node,
/// in the order the operator takes them, each node's plan, the
/// PodDisruptionBudgets' headroom spent across nodes, and an estimate.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FleetReport {
    /// In order: the admitted ones (as admitted), then the waiting ones
    /// (first created, first served).
    pub maintenances: Vec<FleetEntry>,
    /// Every budget an eviction of the fleet meets, its headroom spent by
    /// the nodes in order.
    pub budgets: Vec<BudgetUse>,
    pub estimate: Estimate,
    /// Maintenances whose node does not exist (the Go operator leaves
    /// them behind): not planned, named here.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing_nodes: Vec<MissingNode>,
}

/// A maintenance of a node that does not exist.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MissingNode {
    pub maintenance: String,
    pub node: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FleetEntry {
    /// 1 for the first.
    pub order: usize,
    pub plan: Report,
    /// Evictions of this node a budget would refuse when the nodes before
    /// it have spent its headroom (and the budget has not recovered).
    pub refused_across_fleet: usize,
    /// This node's part of the estimate, in seconds.
    pub estimate_seconds: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BudgetUse {
    pub namespace: String,
    pub name: String,
    /// `status.disruptionsAllowed` now.
    pub disruptions_allowed: i32,
    /// Evictions it covers, over the fleet.
    pub evictions: usize,
    /// The first maintenance whose eviction it would refuse (its headroom
    /// spent by the ones before), if any.
    pub runs_out_at: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Estimate {
    /// The fleet's time, in seconds.
    pub seconds: f64,
    /// Maintenances drained at once (the ones admitted now, at least 1).
    pub parallel: usize,
    /// What the estimate is made of, in words.
    pub made_of: String,
}

/// What the estimate adds for each eviction a budget refuses: kubectl's
/// retry (the operator's fallback when the budget's watch shows no change).
const REFUSED_SECONDS: f64 = 5.0;
/// A pod's grace period when it sets none (the API's default).
const DEFAULT_GRACE: f64 = 30.0;

/// Plans every maintenance of the cluster that holds or waits for a node
/// (not Failed, not being deleted); changes nothing.
pub async fn plan_fleet(
    client: &Client,
    engine: &PolicyEngine,
    source: &Source,
    policy: Option<String>,
) -> Result<FleetReport> {
    let (set, origin) = load_set(Some(client), engine, source).await?;
    let mut all: Vec<NodeMaintenance> = Api::<NodeMaintenance>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing the NodeMaintenances"))?
        .items
        .into_iter()
        .filter(|nm| {
            nm.metadata.deletion_timestamp.is_none()
                && nm.status.as_ref().and_then(|s| s.phase)
                    != Some(crate::crd::MaintenancePhase::Failed)
        })
        .collect();
    all.sort_by_key(fleet_order);
    let mut entries = Vec::new();
    let mut missing_nodes = Vec::new();
    let nodes: Api<Node> = Api::all(client.clone());
    for nm in all.iter() {
        // A maintenance of a node that does not exist has nothing to
        // plan; it does not stop the others'.
        if nodes
            .get_opt(&nm.spec.node_name)
            .await
            .map_err(Error::kube("reading the node"))?
            .is_none()
        {
            missing_nodes.push(MissingNode {
                maintenance: nm.name_any(),
                node: nm.spec.node_name.clone(),
            });
            continue;
        }
        let i = entries.len();
        let request = Request {
            node: None,
            maintenance: Some(nm.name_any()),
            policy: policy.clone(),
            source: source.clone(),
        };
        let plan = plan_in(client, &set, &origin, &request).await?;
        entries.push(FleetEntry {
            order: i + 1,
            plan,
            refused_across_fleet: 0,
            estimate_seconds: 0.0,
        });
    }
    let budgets = spend_across(&mut entries);
    for e in &mut entries {
        e.estimate_seconds =
            node_estimate(&e.plan) + e.refused_across_fleet as f64 * REFUSED_SECONDS;
    }
    let estimate = fleet_estimate(&entries);
    Ok(FleetReport {
        maintenances: entries,
        budgets,
        estimate,
        missing_nodes,
    })
}

/// Admitted first (by when), then waiting (by creation, then name).
fn fleet_order(nm: &NodeMaintenance) -> (bool, i64, String) {
    let admitted = crate::crd::is_admitted(nm);
    let at = |t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        t.map_or(0, |t| t.0.as_millisecond())
    };
    let when = if admitted {
        at(nm
            .status
            .as_ref()
            .and_then(|s| s.admitted_at.as_ref())
            .or(nm.metadata.creation_timestamp.as_ref()))
    } else {
        at(nm.metadata.creation_timestamp.as_ref())
    };
    (!admitted, when, nm.name_any())
}

/// Spends each budget's headroom over the nodes in order (each node's
/// evictions in its plan's order); counts the refusals per node.
fn spend_across(entries: &mut [FleetEntry]) -> Vec<BudgetUse> {
    let mut uses: BTreeMap<(String, String), BudgetUse> = BTreeMap::new();
    let mut headroom: BTreeMap<(String, String), i64> = BTreeMap::new();
    for e in entries.iter_mut() {
        let mut refused = 0;
        let maintenance = e
            .plan
            .maintenance
            .as_ref()
            .map_or_else(|| e.plan.node.clone(), |m| m.name.clone());
        for pod in e.plan.pods.iter().filter(|p| !p.pdbs.is_empty()) {
            let keys: Vec<(String, String)> = pod
                .pdbs
                .iter()
                .map(|b| (pod.namespace.clone(), b.name.clone()))
                .collect();
            for (key, b) in keys.iter().zip(&pod.pdbs) {
                let u = uses.entry(key.clone()).or_insert_with(|| BudgetUse {
                    namespace: key.0.clone(),
                    name: key.1.clone(),
                    disruptions_allowed: b.disruptions_allowed,
                    evictions: 0,
                    runs_out_at: None,
                });
                u.evictions += 1;
                headroom
                    .entry(key.clone())
                    .or_insert(i64::from(b.disruptions_allowed));
            }
            let refuses = keys.len() > 1 || keys.iter().any(|k| headroom[k] <= 0);
            if refuses {
                refused += 1;
                for k in &keys {
                    if let Some(u) = uses.get_mut(k)
                        && u.runs_out_at.is_none()
                    {
                        u.runs_out_at = Some(maintenance.clone());
                    }
                }
            } else {
                for k in &keys {
                    if let Some(n) = headroom.get_mut(k) {
                        *n -= 1;
                    }
                }
            }
        }
        e.refused_across_fleet = refused;
    }
    uses.into_values().collect()
}

/// A node's drain: for each wave, the longest of its removals' grace
/// periods and of its handshake or wait deadlines.
fn node_estimate(plan: &Report) -> f64 {
    let mut by_wave: BTreeMap<u32, f64> = BTreeMap::new();
    for p in &plan.pods {
        if matches!(p.action.as_str(), "skip" | "block") {
            continue;
        }
        let grace = p.grace_period_seconds.map_or(DEFAULT_GRACE, |g| g as f64);
        let longest = by_wave.entry(p.wave).or_default();
        *longest = longest.max(grace + p.wait_seconds.unwrap_or(0.0));
    }
    by_wave.values().sum()
}

/// The fleet: the maintenances admitted now drain at once; the others
/// follow in order, as many at a time.
fn fleet_estimate(entries: &[FleetEntry]) -> Estimate {
    let parallel = entries
        .iter()
        .filter(|e| e.plan.admission == "admitted" || e.plan.admission == "admit")
        .count()
        .max(1);
    let seconds = entries
        .chunks(parallel)
        .map(|batch| {
            batch
                .iter()
                .map(|e| e.estimate_seconds)
                .fold(0.0_f64, f64::max)
        })
        .sum();
    Estimate {
        seconds,
        parallel,
        made_of: format!(
            "for each node, the sum over its waves of the longest grace period (30 s when a pod sets none) \
             plus handshake and wait deadlines of the wave's pods (upper bounds: pods that stop at SIGTERM \
             take less), plus {REFUSED_SECONDS} s for each eviction a budget would refuse once the nodes \
             before it spent its headroom; {parallel} node(s) at a time (those admitted now), in order. \
             Not in it: replacements' start-up, the volume wait, retries after failures."
        ),
    }
}
