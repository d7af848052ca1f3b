//! Admission: the fleet a policy's `admit` sees around one maintenance,
//! and where it is read from. The controller, the webhook and `nmo plan`
//! use it as peers. Its two sources: **watched** ([`Watched`]: the nodes,
//! the medik8s node leases, other tools' claims and, for the webhook, the
//! NodeMaintenances, followed while the controller runs and, on a replica
//! that serves the webhook, while the process runs, so a decision costs no
//! request) and **listed** ([`listed`]: the same read from the API server
//! per decision, for `nmo plan`, which runs no watch, and for the webhook
//! until its watches have listed). `history.rs` keeps the maintenances
//! that ended (the fleet's `history`).
//!
//! The fleet around a maintenance, as the policy's `admit` sees it: every
//! node, the other NodeMaintenances that hold (or wait for) a node, who
//! else holds a node's lease, other tools' claims, and on OpenShift the
//! etcd quorum guard.

pub mod claims;
mod follow;
pub mod history;
pub mod leases;
pub mod maintenances;
pub(crate) mod nodes;
mod watched;

pub use watched::{Following, Watched};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::crd::{MaintenancePhase, NodeMaintenance};
use crate::error::{Error, Result};
use crate::policy::Fleet;
use crate::policy::types::{EtcdGuard, FleetMaintenance};

/// The namespace of OpenShift's etcd guard.
pub(crate) const ETCD_NAMESPACE: &str = "openshift-etcd";

/// Whether the cluster is OpenShift (it serves `config.openshift.io`).
pub async fn is_openshift(client: &Client) -> bool {
    client
        .list_api_groups()
        .await
        .map(|g| g.groups.iter().any(|g| g.name == "config.openshift.io"))
        .unwrap_or(false)
}

/// Milliseconds since the Unix epoch of an API time.
fn millis(t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> u64 {
    t.map_or(0, |t| t.0.as_millisecond().max(0) as u64)
}

/// The fleet around one maintenance, as read.
#[derive(Debug)]
pub struct Around {
    pub fleet: Fleet,
    /// The position of the maintenance's node in `fleet.nodes` (`None`:
    /// the node does not exist).
    pub node: Option<usize>,
    /// The maintenance itself, as the API server has it now, was admitted
    /// already (a pass that started from an older copy).
    pub already_admitted: bool,
    /// The maintenances that ended (the policy sees those within its
    /// history window).
    pub ended: Vec<crate::policy::types::EndedMaintenance>,
}

impl Around {
    /// What `admit` would be asked, less the time of asking: the policy
    /// and its settings, the maintenance as the API server has it, each
    /// node as the policy sees it (not its heartbeats), the other
    /// maintenances, the leases, the other tools' claims, the etcd guard
    /// and the history the policy's window shows. Equal fingerprints ask
    /// the same question, which a policy that gave no `recheck-after`
    /// answers the same way (the contract: without it, ask again "only
    /// when the fleet changes").
    pub fn fingerprint(
        &self,
        policy: &crate::policy::Policy,
        nm: &NodeMaintenance,
        now_ms: u64,
    ) -> u64 {
        use std::hash::Hasher;
        let mut h = std::hash::DefaultHasher::new();
        let mut debug = |v: &dyn std::fmt::Debug| {
            use std::fmt::Write;
            let _ = write!(HashWriter(&mut h), "{v:?}");
        };
        debug(&policy.digest());
        debug(policy.settings());
        debug(&(nm.uid(), nm.resource_version(), self.node));
        debug(&self.fleet.maintenances);
        debug(&self.fleet.etcd);
        debug(&sorted(&self.fleet.lease_holders));
        debug(&sorted(&self.fleet.tool_claims));
        debug(&crate::policy::recent(
            self.ended.clone(),
            policy.settings().history_window(),
            now_ms,
        ));
        for n in self.fleet.nodes.iter() {
            crate::policy::hash_as_seen(n, &mut h);
        }
        h.finish()
    }

    /// Asks `policy`'s `admit` whether the maintenance `record` may start
    /// in this fleet (off the async threads, as every decision). `None`:
    /// its node does not exist, there is nothing to ask.
    pub async fn ask(
        self,
        policy: &crate::policy::Policy,
        record: crate::policy::types::Maintenance,
    ) -> crate::policy::Result<Option<crate::policy::Admission>> {
        let Some(position) = self.node else {
            return Ok(None);
        };
        let policy = policy.clone();
        let mut fleet = self.fleet;
        let now_ms =
            u64::try_from(k8s_openapi::jiff::Timestamp::now().as_millisecond()).unwrap_or(0);
        fleet.history =
            crate::policy::recent(self.ended, policy.settings().history_window(), now_ms);
        crate::policy::decide(crate::policy::Decision::Admit, move || {
            policy.admit(&record, position, &fleet)
        })
        .await
        .map(Some)
        .map_err(Into::into)
    }
}

/// Feeds what is written into a hasher (a fingerprint of a `Debug` form
/// without building the string).
struct HashWriter<'a>(&'a mut std::hash::DefaultHasher);

impl std::fmt::Write for HashWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        std::hash::Hasher::write(self.0, s.as_bytes());
        Ok(())
    }
}

/// A map's entries in key order (a `HashMap`'s own order differs from
/// one map to the next).
fn sorted<V>(map: &std::collections::HashMap<String, V>) -> Vec<(&String, &V)> {
    let mut entries: Vec<_> = map.iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    entries
}

/// Every node, from the API server.
pub async fn nodes(client: &Client) -> Result<Vec<Node>> {
    Ok(Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing the nodes for admission"))?
        .items)
}

/// The etcd guard around `nm`'s node, on OpenShift.
pub async fn etcd(
    client: &Client,
    nm: &NodeMaintenance,
    openshift: bool,
) -> Result<Option<EtcdGuard>> {
    if openshift {
        Ok(Some(etcd_guard(client, &nm.spec.node_name).await?))
    } else {
        Ok(None)
    }
}

/// The fleet around `nm`, from the nodes and NodeMaintenances read.
pub(crate) fn assemble<'a>(
    nodes: crate::policy::FleetNodes,
    all: impl IntoIterator<Item = &'a NodeMaintenance>,
    nm: &NodeMaintenance,
    etcd: Option<EtcdGuard>,
    admitted: impl Fn(&NodeMaintenance) -> bool,
) -> Around {
    let me = nm.uid();
    let mut already_admitted = false;
    let mut maintenances = Vec::new();
    for o in all {
        if o.uid() == me {
            already_admitted |= admitted(o);
            continue;
        }
        // A Succeeded maintenance holds its node (cordoned, drained) until
        // it is deleted, and one being deleted until its node is restored;
        // a Failed one has given its node back.
        if o.status.as_ref().and_then(|s| s.phase) == Some(MaintenancePhase::Failed) {
            continue;
        }
        maintenances.push(fleet_maintenance(o, admitted(o)));
    }
    let position = nodes
        .iter()
        .position(|n| n.metadata.name.as_deref() == Some(nm.spec.node_name.as_str()));
    Around {
        fleet: Fleet {
            nodes,
            maintenances,
            history: Vec::new(),
            lease_holders: Default::default(),
            tool_claims: Default::default(),
            etcd,
        },
        node: position,
        already_admitted,
        ended: Vec::new(),
    }
}

/// Another maintenance as `admit` sees it.
pub(crate) fn fleet_maintenance(o: &NodeMaintenance, admitted: bool) -> FleetMaintenance {
    let status = o.status.as_ref();
    let created = millis(o.metadata.creation_timestamp.as_ref());
    let since = if admitted {
        status
            .and_then(|s| s.admitted_at.as_ref().or(s.last_update.as_ref()))
            .map_or(created, |t| millis(Some(t)))
    } else {
        status
            .and_then(|s| s.waiting.as_ref())
            .map_or(created, |w| millis(w.since.as_ref()))
    };
    FleetMaintenance {
        name: o.name_any(),
        node_name: o.spec.node_name.clone(),
        phase: status
            .and_then(|s| s.phase)
            .map(crate::policy::convert::maintenance_phase),
        admitted,
        parked: status.is_some_and(|s| s.parked.is_some()),
        since_ms: since,
        created_ms: created,
    }
}

/// The etcd guard as medik8s common reads it: the budgets in
/// `openshift-etcd`, the one budget's allowed disruptions, and whether
/// `node` runs a Ready guard pod.
pub(crate) async fn etcd_guard(client: &Client, node: &str) -> Result<EtcdGuard> {
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ETCD_NAMESPACE);
    let list = pdbs
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing the etcd guard PodDisruptionBudgets"))?;
    let budgets = u32::try_from(list.items.len()).unwrap_or(u32::MAX);
    let [pdb] = list.items.as_slice() else {
        return Ok(EtcdGuard {
            budgets,
            disruptions_allowed: 0,
            guard_ready_on_node: false,
        });
    };
    let disruptions_allowed = pdb
        .status
        .as_ref()
        .map_or(0, |s| s.disruptions_allowed.max(0) as u32);
    let selector = pdb
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .map(kube::core::Selector::try_from);
    // A budget that selects nothing (or by a selector the API server would
    // not have taken) cannot say which pods guard etcd: as the Go
    // operator, assume this node runs one.
    let guard_ready_on_node = match selector {
        None | Some(Err(_)) => true,
        Some(Ok(selector)) => Api::<Pod>::namespaced(client.clone(), ETCD_NAMESPACE)
            .list(
                &ListParams::default()
                    .labels_from(&selector)
                    .fields(&format!("spec.nodeName={node}")),
            )
            .await
            .map_err(Error::kube("listing the etcd guard pods"))?
            .items
            .iter()
            .any(crate::policy::convert::pod_ready),
    };
    Ok(EtcdGuard {
        budgets,
        disruptions_allowed,
        guard_ready_on_node,
    })
}

/// medik8s common's etcd check, as the default policy applies it: exactly
/// one guard budget, and it allows a disruption or the node runs no Ready
/// guard pod (a guard that is already down costs no quorum).
pub(crate) fn etcd_can_lose_one(g: &EtcdGuard) -> bool {
    g.budgets == 1 && (g.disruptions_allowed > 0 || !g.guard_ready_on_node)
}

/// The watched source, for the webhook: the fleet around `nm` from what
/// `watched` follows (the nodes and the NodeMaintenances, the leases and
/// other tools' claims), with the history and the etcd guard read;
/// `None` while the nodes' or the NodeMaintenances' watch has not listed
/// (or fails): read [`listed`] then.
pub async fn from_watches(
    watched: &Watched,
    client: &Client,
    nm: &NodeMaintenance,
    openshift: bool,
    lease_namespace: &str,
) -> Result<Option<Around>> {
    let (Some(nodes), Some(all)) = (watched.nodes.snapshot(), watched.maintenances.snapshot())
    else {
        return Ok(None);
    };
    let etcd = etcd(client, nm, openshift).await?;
    let mut around = assemble(
        nodes,
        all.iter().map(|a| a.as_ref()),
        nm,
        etcd,
        crate::crd::is_admitted,
    );
    watched.complete(&mut around);
    let ended = history::read_for_admission(client, lease_namespace)
        .await
        .map_err(Error::kube("reading the maintenance history for admission"))?;
    around.ended = history::wit(&ended);
    Ok(Some(around))
}

/// The listed source: the fleet around `nm` read from the API server, with
/// the node leases and the history of `lease_namespace` and other tools'
/// claims (for the webhook and `nmo plan`, which run no watch).
pub async fn listed(
    client: &Client,
    nm: &NodeMaintenance,
    openshift: bool,
    lease_namespace: &str,
) -> Result<Around> {
    let nodes = nodes(client).await?;
    let others = Api::<NodeMaintenance>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing the NodeMaintenances for admission"))?
        .items;
    let etcd = etcd(client, nm, openshift).await?;
    let mut around = assemble(
        crate::policy::fleet_nodes(nodes),
        &others,
        nm,
        etcd,
        crate::crd::is_admitted,
    );
    let leases = leases::list(client, lease_namespace)
        .await
        .map_err(Error::kube("listing the node leases for admission"))?;
    around.fleet.lease_holders =
        std::sync::Arc::new(leases::holders_of(&around.fleet.nodes, |name| {
            leases.get(name).cloned()
        }));
    let ended = history::read_for_admission(client, lease_namespace)
        .await
        .map_err(Error::kube("reading the maintenance history for admission"))?;
    around.ended = history::wit(&ended);
    around.fleet.tool_claims = std::sync::Arc::new(
        claims::list(client)
            .await
            .map_err(Error::kube("listing other tools' claims for admission"))?,
    );
    Ok(around)
}
