//! The `NodeMaintenance` custom resource, field for field the Go operator's
//! (`nodemaintenance.medik8s.io/v1beta1`), so existing CRs and scripts keep
//! working. The YAML in `deploy/` is generated from these types
//! (`nmo crd`), and a test fails when the two drift apart.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The finalizer the operator puts on every NodeMaintenance.
pub(crate) const FINALIZER: &str = "foregroundDeleteNodeMaintenance";

/// `spec` of a NodeMaintenance.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "nodemaintenance.medik8s.io",
    version = "v1beta1",
    kind = "NodeMaintenance",
    plural = "nodemaintenances",
    singular = "nodemaintenance",
    shortname = "nm",
    status = "NodeMaintenanceStatus",
    doc = "NodeMaintenance puts a node into maintenance: cordoned, tainted and drained until the NodeMaintenance is deleted.",
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.nodeName","description":"The node in maintenance"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase","description":"Running, Succeeded or Failed"}"#,
    printcolumn = r#"{"name":"Progress","type":"integer","jsonPath":".status.drainProgress","description":"Drain progress, percent"}"#,
    printcolumn = r#"{"name":"Waiting","type":"string","jsonPath":".status.waiting.reason","description":"Why the policy has not let the maintenance start yet"}"#,
    printcolumn = r#"{"name":"Parked","type":"string","jsonPath":".status.parked.reason","description":"Why the policy has set the maintenance aside (phase stays Running)"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".spec.reason","priority":1,"description":"Why the node is in maintenance"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceSpec {
    /// The name of the node to put into maintenance.
    #[schemars(length(min = 1, max = 253))]
    pub node_name: String,
    /// Why the node is put into maintenance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The phase of a NodeMaintenance.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum MaintenancePhase {
    Running,
    Succeeded,
    Failed,
}

impl MaintenancePhase {
    pub fn as_str(self) -> &'static str {
        match self {
            MaintenancePhase::Running => "Running",
            MaintenancePhase::Succeeded => "Succeeded",
            MaintenancePhase::Failed => "Failed",
        }
    }
}

/// A pod reference in `pendingPodsRefs`.
#[derive(
    Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub struct PodReference {
    pub namespace: String,
    pub name: String,
}

/// Whether a count is 0: written as the Go operator writes its counts
/// (`omitempty`), absent then.
fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// `status` of a NodeMaintenance; JSON names exactly as the Go operator's:
/// a count of 0 is left out, as Go's `omitempty` leaves it out.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceStatus {
    /// Running, Succeeded or Failed.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::phase"
    )]
    pub phase: Option<MaintenancePhase>,
    /// Percent of the pods to evict that are gone.
    #[serde(
        default,
        skip_serializing_if = "is_zero",
        deserialize_with = "lenient::int"
    )]
    pub drain_progress: i32,
    /// When the status last changed meaningfully.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::time"
    )]
    pub last_update: Option<Time>,
    /// The last error met.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Names of the pods still to be removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_pods: Option<Vec<String>>,
    /// The pods still to be removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_pods_refs: Option<Vec<PodReference>>,
    /// All pods on the node when the maintenance began.
    #[serde(
        default,
        rename = "totalpods",
        skip_serializing_if = "is_zero",
        deserialize_with = "lenient::int"
    )]
    pub total_pods: i32,
    /// Pods to be removed when the maintenance began.
    #[serde(
        default,
        skip_serializing_if = "is_zero",
        deserialize_with = "lenient::int"
    )]
    pub eviction_pods: i32,
    /// Lease failures since the drain started.
    #[serde(
        default,
        skip_serializing_if = "is_zero",
        deserialize_with = "lenient::int"
    )]
    pub error_on_lease_count: i32,
    /// The drain policy deciding for this maintenance, chosen when it began
    /// (`name@sha256:<first 12 hex digits>`). Not in the Go operator's
    /// status: with its CRD installed the field is dropped, and the choice
    /// lasts only as long as the operator process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Set while the policy holds the maintenance back (its `admit`
    /// answered wait); `phase` stays unset until it is admitted. Not in the
    /// Go operator's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<Waiting>,
    /// When the policy admitted the maintenance. Not in the Go operator's
    /// status.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::time"
    )]
    pub admitted_at: Option<Time>,
    /// Set while the policy has parked the maintenance (its `on-failure`
    /// answered park): the node stays cordoned and tainted, and nothing is
    /// retried until `recheckAt` (if any) or a change to the
    /// NodeMaintenance. Not in the Go operator's status; `phase` stays
    /// Running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked: Option<Parked>,
}

/// Why a maintenance is parked (`status.parked`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Parked {
    /// The policy's reason.
    pub reason: String,
    /// What the drain could not get past (the last error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// When it was parked.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::time"
    )]
    pub since: Option<Time>,
    /// When the operator looks again by itself (none: only when the
    /// NodeMaintenance changes).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::time"
    )]
    pub recheck_at: Option<Time>,
}

/// Why a maintenance has not started (`status.waiting`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Waiting {
    /// The policy's reason.
    #[serde(default)]
    pub reason: String,
    /// Since when it waits.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::time"
    )]
    pub since: Option<Time>,
}

/// Reading status fields that anyone with access to the status subresource
/// may have written: a value this operator cannot hold (a time past year
/// 9999, a number past i32, an unknown phase) is dropped or saturated with
/// a warning, so one such object never makes the whole list unreadable
/// (which would hide every other NodeMaintenance from the controller).
mod lenient {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde::{Deserialize, Deserializer};
    use serde_json::Value;

    use super::MaintenancePhase;

    pub fn time<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Time>, D::Error> {
        Ok(match Option::<Value>::deserialize(d)? {
            Some(Value::String(s)) => match s.parse::<k8s_openapi::jiff::Timestamp>() {
                Ok(t) => Some(Time(t)),
                Err(e) => {
                    tracing::warn!(value = %crate::text::clean(&s, 64), error = %e, "status.lastUpdate is not a time this operator can hold; ignored");
                    None
                }
            },
            _ => None,
        })
    }

    pub fn int<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
        let v = Option::<Value>::deserialize(d)?;
        let n = match &v {
            Some(Value::Number(n)) => n
                .as_i64()
                .or_else(|| n.as_f64().map(|f| f as i64))
                .unwrap_or(0),
            _ => 0,
        };
        Ok(n.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32)
    }

    pub fn phase<'de, D: Deserializer<'de>>(d: D) -> Result<Option<MaintenancePhase>, D::Error> {
        Ok(match Option::<Value>::deserialize(d)? {
            Some(Value::String(s)) => match s.as_str() {
                "Running" => Some(MaintenancePhase::Running),
                "Succeeded" => Some(MaintenancePhase::Succeeded),
                "Failed" => Some(MaintenancePhase::Failed),
                other => {
                    tracing::warn!(value = %crate::text::clean(other, 64), "status.phase is not one this operator knows; ignored");
                    None
                }
            },
            _ => None,
        })
    }
}

/// The CRD as YAML, as `nmo crd` prints it and `deploy/` holds it.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let crd = NodeMaintenance::crd();
    let mut out = String::from("# Generated by `nmo crd` from host/src/crd.rs. Do not edit.\n");
    out.push_str(&crate::yaml::to_string(&crd).expect("a CRD serializes"));
    out
}

/// The CRD's name.
pub const CRD_NAME: &str = "nodemaintenances.nodemaintenance.medik8s.io";

/// The field manager `nmo crd --apply` writes the CRD as.
pub const CRD_FIELD_MANAGER: &str = "nmo-crd";

/// Applies this build's CRD server-side, taking over the fields another
/// manager set (the Go operator's CRD as OLM or `kubectl replace` left
/// it: the same group, version and storage, so every NodeMaintenance is
/// kept), then waits, at most `wait`, until the API server serves it.
/// What the Helm chart's pre-install and pre-upgrade hook runs.
pub async fn apply(client: &kube::Client, wait: std::time::Duration) -> crate::Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    use kube::api::{Api, Patch, PatchParams};
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(CRD_FIELD_MANAGER).force();
    crds.patch(CRD_NAME, &params, &Patch::Apply(NodeMaintenance::crd()))
        .await
        .map_err(crate::Error::kube("applying the NodeMaintenance CRD"))?;
    let started = std::time::Instant::now();
    loop {
        let crd = crds
            .get(CRD_NAME)
            .await
            .map_err(crate::Error::kube("reading the NodeMaintenance CRD back"))?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        if started.elapsed() >= wait {
            return Err(crate::Error::Config(format!(
                "the NodeMaintenance CRD was applied but is not Established after {}",
                crate::text::duration(wait)
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Whether a maintenance was admitted: its phase is set (it started, or
/// finished), or the policy admitted it (`status.admittedAt`).
pub fn is_admitted(nm: &NodeMaintenance) -> bool {
    nm.status
        .as_ref()
        .is_some_and(|s| s.phase.is_some() || s.admitted_at.is_some())
}

#[cfg(test)]
mod tests {
    /// The name the chart's hook and the CRD guard use is the one the
    /// generated CRD carries.
    #[test]
    fn the_crd_name_is_the_generated_crds() {
        use kube::CustomResourceExt;
        assert_eq!(super::CRD_NAME, super::NodeMaintenance::crd_name());
    }
}
