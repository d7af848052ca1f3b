//! A medik8s node lease as a record: its name (`node-<name>`), the holder
//! this operator writes, and a Lease read leniently, whoever wrote it. The
//! node lease's writer is `controller::node::lease`; admission reads the
//! holders of the fleet's leases through [`LeaseRecord::valid_at`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::DynamicObject;
use serde_json::Value;

/// Default namespace of node leases (env `LEASE_NAMESPACE` overrides).
pub const DEFAULT_NAMESPACE: &str = "medik8s-leases";
/// Our holder identity.
pub(crate) const HOLDER: &str = "node-maintenance";
/// How long a lease lasts, in seconds.
pub(crate) const DURATION_SECONDS: i32 = 3600;

/// The longest object name (a DNS subdomain).
pub(crate) const MAX_NAME: usize = 253;

/// The lease name for a node: `node-<name>`, as medik8s names it. A node
/// name over 248 characters (a valid Node name is up to 253) would make a
/// name no Lease can have: it is then cut and ends in a hash of the whole
/// node name, `node-<first part>-<16 hex digits>`, which stays unique and
/// the same on every call.
pub fn lease_name(node: &str) -> String {
    let name = format!("node-{node}");
    if name.len() <= MAX_NAME {
        return name;
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(node.as_bytes());
    let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let mut keep = MAX_NAME - hash.len() - 1;
    // A Node's name is ASCII, but the name may come from a NodeMaintenance's
    // spec, which only bounds its length: never cut inside a character.
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    let prefix = name[..keep].trim_end_matches(['.', '-']);
    format!("{prefix}-{hash}")
}

/// When a lease was last renewed, as read from an object anyone in the
/// namespace may have written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// No renew or acquire time, or one that is not a time at all.
    Never,
    At(Timestamp),
    /// A valid RFC 3339 time beyond what a clock can hold (year 9999...):
    /// valid for as long as anyone can tell.
    FarFuture,
}

/// A Lease read leniently: whatever its times say, reading it never fails
/// and comparing them never overflows.
#[derive(Debug, Clone)]
pub(crate) struct LeaseRecord {
    pub metadata: ObjectMeta,
    pub holder: String,
    pub renewed: Renewed,
    /// `acquireTime`, when it is a time.
    pub acquired: Option<Timestamp>,
    pub duration_seconds: i64,
    pub transitions: i32,
    /// The raw holder, times and duration: what an observer compares to
    /// tell that the record changed.
    pub fingerprint: String,
}

impl LeaseRecord {
    pub(crate) fn from_dynamic(obj: DynamicObject) -> Self {
        let spec = obj.data.get("spec").cloned().unwrap_or(Value::Null);
        let text = |k: &str| spec.get(k).and_then(Value::as_str).map(str::to_owned);
        let time = |k: &str| -> Option<Renewed> {
            let raw = text(k)?;
            Some(match raw.parse::<Timestamp>() {
                Ok(t) => Renewed::At(t),
                // A time jiff cannot hold: a far-future year is "valid for
                // ever"; anything else is no time at all.
                Err(_) if raw.len() >= 4 && raw[..4].parse::<u32>().is_ok_and(|y| y >= 9000) => {
                    Renewed::FarFuture
                }
                Err(_) => Renewed::Never,
            })
        };
        let renewed = time("renewTime")
            .filter(|r| *r != Renewed::Never)
            .or_else(|| time("acquireTime"))
            .unwrap_or(Renewed::Never);
        let number = |k: &str| spec.get(k).and_then(Value::as_i64).unwrap_or(0);
        let holder = text("holderIdentity").unwrap_or_default();
        let fingerprint = format!(
            "{holder}|{}|{}|{}",
            text("renewTime").unwrap_or_default(),
            text("acquireTime").unwrap_or_default(),
            number("leaseDurationSeconds")
        );
        LeaseRecord {
            metadata: obj.metadata,
            holder,
            renewed,
            acquired: text("acquireTime").and_then(|t| t.parse().ok()),
            duration_seconds: number("leaseDurationSeconds"),
            transitions: i32::try_from(number("leaseTransitions")).unwrap_or(i32::MAX),
            fingerprint,
        }
    }

    /// Whether the holder's lease still runs at `now`, by the holder's own
    /// times. Saturating: no value can overflow the comparison.
    pub(crate) fn valid_at(&self, now: Timestamp) -> bool {
        match self.renewed {
            Renewed::Never => false,
            Renewed::FarFuture => true,
            Renewed::At(t) => {
                let duration = SignedDuration::from_secs(self.duration_seconds.max(0));
                match t.checked_add(duration) {
                    Ok(until) => until > now,
                    // Beyond the representable range: far in the future.
                    Err(_) => true,
                }
            }
        }
    }
}
