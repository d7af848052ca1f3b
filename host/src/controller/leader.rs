//! Leader election on a coordination.k8s.io Lease, as controller-runtime
//! does it (same lock name as the Go operator, so the two never drain at
//! the same time during a migration): acquire, renew every retry period,
//! and stop leading when a renewal has not succeeded for the renew deadline.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::time::Instant;

use super::metrics::ControllerMetrics;
use super::node::lease::{LeaseRecord, lease_over, read_lease};
use crate::error::{Error, Result};
use crate::sync::Locked;

/// The Go operator's leader election ID.
pub const LOCK_NAME: &str = "135b1886.medik8s.io";

/// Timings (controller-runtime's defaults).
#[derive(Debug, Clone)]
pub struct Timings {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// One candidate.
///
/// As client-go's leader election: another holder's lease counts as
/// expired when this candidate has seen no change to the lease record for
/// the lease duration, measured on this candidate's own monotonic clock
/// (never by comparing the holder's timestamps with our clock); every
/// attempt is bounded by the renew deadline, so a leader whose connection
/// stalls stops leading when the renew deadline passes, before the lease
/// duration after which another candidate may take over; and the lease is
/// released when the work ends.
pub struct Elector {
    api: Api<Lease>,
    client: Client,
    namespace: String,
    identity: String,
    timings: Timings,
    /// The last lease record seen, and when it was first seen.
    observed: Mutex<Option<(String, Instant)>>,
    /// Where `leader_election_master_status` is kept, if anywhere.
    metrics: Option<ControllerMetrics>,
    /// This replica's pod, when it runs in one (see [`Elector::in_pod`]).
    own_pod: Option<String>,
}

impl Elector {
    pub fn new(
        client: Client,
        namespace: &str,
        identity: impl Into<String>,
        timings: Timings,
    ) -> Self {
        Elector {
            api: Api::namespaced(client.clone(), namespace),
            client,
            namespace: namespace.to_owned(),
            identity: identity.into(),
            timings,
            observed: Mutex::new(None),
            metrics: None,
            own_pod: None,
        }
    }

    /// This replica runs in pod `pod` (its name; the lease's namespace is
    /// the pod's): a holder that is another replica of the same Deployment
    /// whose pod no longer exists is not waited out (see
    /// [`Elector::holder_pod_gone`]).
    pub fn in_pod(mut self, pod: impl Into<String>) -> Self {
        self.own_pod = Some(pod.into());
        self
    }

    /// Keeps `leader_election_master_status` in `metrics` (the registry
    /// the operator serves).
    pub fn with_metrics(mut self, metrics: ControllerMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// `leader_election_master_status`, when counted.
    fn set_leading(&self, leading: bool) {
        if let Some(m) = &self.metrics {
            m.set_leader(LOCK_NAME, leading);
        }
    }

    /// Records `record` as seen now, unless it is the one seen before;
    /// returns when the current record was first seen.
    fn observe(&self, record: &LeaseRecord) -> Instant {
        let mut observed = self.observed.locked();
        match &*observed {
            Some((fingerprint, at)) if *fingerprint == record.fingerprint => *at,
            _ => {
                let now = Instant::now();
                *observed = Some((record.fingerprint.clone(), now));
                now
            }
        }
    }

    fn our_spec(&self, acquired: Timestamp, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.timings.lease_duration.as_secs().max(1) as i32),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(Timestamp::now())),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Tries once to become or stay leader.
    pub async fn try_acquire_or_renew(&self) -> Result<bool> {
        let now = Timestamp::now();
        let existing = read_lease(&self.client, &self.namespace, LOCK_NAME)
            .await
            .map_err(Error::kube("reading the leader lease"))?;
        let Some(record) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(LOCK_NAME.into()),
                    ..Default::default()
                },
                spec: Some(self.our_spec(now, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(Error::kube("creating the leader lease")(e)),
            };
        };
        let seen_since = self.observe(&record);
        let ours = record.holder == self.identity;
        if !ours && !record.holder.is_empty() {
            let duration =
                Duration::from_secs(record.duration_seconds.clamp(0, 86_400 * 365) as u64);
            let quiet = seen_since.elapsed();
            // A live holder renews every retry period: only one quiet for
            // two is asked after.
            if quiet < duration
                && !(quiet >= self.timings.retry_period.saturating_mul(2)
                    && self.holder_pod_gone(&record.holder).await)
            {
                return Ok(false);
            }
        }
        let spec = if ours {
            self.our_spec(record.acquired.unwrap_or(now), record.transitions)
        } else {
            self.our_spec(now, record.transitions.saturating_add(1))
        };
        match self
            .api
            .replace(
                LOCK_NAME,
                &PostParams::default(),
                &lease_over(&record, spec),
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(Error::kube("renewing the leader lease")(e)),
        }
    }

    /// Whether `holder` is another replica of this one's Deployment whose
    /// pod no longer exists: it can never renew, so waiting out its lease
    /// gains nothing. So an operator reinstalled after an uninstall that
    /// removed the rights to release the lease before its pods stopped
    /// (Helm deletes the Role as the pods terminate), or whose pods were
    /// deleted with their node, leads at once. The identity is
    /// `<pod>_<suffix>` (nmo's, and controller-runtime's: the Go operator's
    /// replicas of the same Deployment count too) and a Deployment's pod is
    /// named `<deployment>-<template hash>-<suffix>`. Anything else (not in
    /// a pod, another workload's holder, an error reading the pod) counts
    /// as alive.
    async fn holder_pod_gone(&self, holder: &str) -> bool {
        let Some(own) = &self.own_pod else {
            return false;
        };
        let Some((pod, _)) = holder.rsplit_once('_') else {
            return false;
        };
        if pod == own || deployment_of(pod).is_none() || deployment_of(pod) != deployment_of(own) {
            return false;
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let gone = matches!(pods.get_opt(pod).await, Ok(None));
        if gone {
            tracing::info!(identity = %self.identity, holder, "the leader lease's holder has no pod any more: taking the lease without waiting for it to expire");
        }
        gone
    }

    /// Gives the lease up (holder empty, as client-go's release), if it is
    /// still ours, so a standby takes over at once. Bounded by the renew
    /// deadline.
    pub async fn release(&self) {
        let attempt = async {
            let record = read_lease(&self.client, &self.namespace, LOCK_NAME)
                .await
                .ok()??;
            if record.holder != self.identity {
                return None;
            }
            let spec = LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(1),
                acquire_time: None,
                renew_time: Some(MicroTime(Timestamp::now())),
                lease_transitions: Some(record.transitions),
                ..Default::default()
            };
            self.api
                .replace(
                    LOCK_NAME,
                    &PostParams::default(),
                    &lease_over(&record, spec),
                )
                .await
                .ok()
        };
        match tokio::time::timeout(self.timings.renew_deadline, attempt).await {
            Ok(Some(_)) => {
                tracing::info!(identity = %self.identity, "released the leader lease")
            }
            _ => {
                tracing::warn!(identity = %self.identity, "could not release the leader lease; a standby takes over when it expires")
            }
        }
    }

    /// Waits to become leader, then runs `work` while leading. Returns when
    /// `work` ends (releasing the lease), or with
    /// [`Error::LeadershipLost`] as soon as leadership cannot be confirmed
    /// within the renew deadline; `work` is dropped then, so it stops
    /// acting at once.
    pub async fn run<F: Future<Output = Result<()>>>(&self, work: F) -> Result<()> {
        self.acquire().await;
        self.hold(work).await
    }

    /// Stands for the lock and runs `work()` while leading, until `work`
    /// ends by itself (its result) or `stop` completes while standing.
    /// When leadership is lost (another instance took the lease, or it
    /// could not be renewed within the renew deadline: an API outage, a
    /// stalled connection), the work is dropped at once, so it stops
    /// acting, and the replica stands for the lock again in the same
    /// process: an outage is ridden out with no restart, the probes and
    /// the webhook serving throughout. (controller-runtime's manager exits
    /// instead and relies on the pod's restart.) A leading `work` handles
    /// `stop`'s signal itself (a graceful shutdown that ends it).
    pub async fn lead<W, Fut>(&self, mut work: W, stop: impl Future<Output = ()>) -> Result<()>
    where
        W: FnMut() -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                () = self.acquire() => {}
                () = &mut stop => {
                    tracing::info!(identity = %self.identity, "stopping while standing by");
                    return Ok(());
                }
            }
            match self.hold(work()).await {
                Err(Error::LeadershipLost(_)) => {
                    tracing::warn!(identity = %self.identity, "stopped acting; standing for the lock again");
                }
                other => return other,
            }
        }
    }

    /// Tries for the lock every retry period until it is ours.
    async fn acquire(&self) {
        self.set_leading(false);
        loop {
            let attempt =
                tokio::time::timeout(self.timings.renew_deadline, self.try_acquire_or_renew());
            match attempt.await {
                Ok(Ok(true)) => return,
                Ok(Ok(false)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "leader election"),
                Err(_) => tracing::warn!("leader election: the API server did not answer in time"),
            }
            tokio::time::sleep(self.timings.retry_period).await;
        }
    }

    /// Runs `work` while the lock is renewed: see [`Self::run`].
    async fn hold<F: Future<Output = Result<()>>>(&self, work: F) -> Result<()> {
        tracing::info!(identity = %self.identity, "became leader");
        self.set_leading(true);
        let renew = async {
            let mut last_ok = Instant::now();
            loop {
                let deadline = last_ok + self.timings.renew_deadline;
                tokio::time::sleep_until(
                    (Instant::now() + self.timings.retry_period).min(deadline),
                )
                .await;
                match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                    Ok(Ok(true)) => last_ok = Instant::now(),
                    Ok(Ok(false)) => {
                        return Error::LeadershipLost(
                            "the leader lease was taken by another instance",
                        );
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "renewing leadership")
                    }
                    Err(_) => {}
                }
                if Instant::now() >= last_ok + self.timings.renew_deadline {
                    return Error::LeadershipLost(
                        "the leader lease was not renewed within the renew deadline",
                    );
                }
            }
        };
        let result = tokio::select! {
            r = work => r,
            lost = renew => Err(lost),
        };
        self.set_leading(false);
        match &result {
            Err(Error::LeadershipLost(why)) => {
                tracing::error!(identity = %self.identity, "leader election lost: {why}");
            }
            _ => self.release().await,
        }
        result
    }
}

/// The Deployment a pod's name says it belongs to: `<deployment>-<template
/// hash>-<suffix>`, both generated parts non-empty and alphanumeric.
fn deployment_of(pod: &str) -> Option<&str> {
    let mut parts = pod.rsplitn(3, '-');
    let suffix = parts.next()?;
    let hash = parts.next()?;
    let deployment = parts.next()?;
    let generated = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric());
    (generated(suffix) && generated(hash) && !deployment.is_empty()).then_some(deployment)
}

#[cfg(test)]
mod tests {
    use super::deployment_of;

    #[test]
    fn a_pods_deployment_is_its_name_less_the_two_generated_parts() {
        assert_eq!(
            deployment_of("node-maintenance-operator-controller-manager-567f7dc789-4d27r"),
            Some("node-maintenance-operator-controller-manager")
        );
        assert_eq!(deployment_of("nmo"), None);
        assert_eq!(deployment_of("laptop-1"), None);
        assert_eq!(deployment_of("a--b"), None);
    }
}
