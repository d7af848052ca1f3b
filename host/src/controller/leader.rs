//! Leader election on a coordination.k8s.io Lease, as controller-runtime
//! does it (same lock name as the Go operator, so the two never drain at
//! the same time during a migration): acquire, renew every retry period,
//! and stop leading when a renewal has not succeeded for the renew deadline.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use crate::error::{Error, Result};

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
pub struct Elector {
    api: Api<Lease>,
    identity: String,
    timings: Timings,
}

impl Elector {
    pub fn new(
        client: Client,
        namespace: &str,
        identity: impl Into<String>,
        timings: Timings,
    ) -> Self {
        Elector {
            api: Api::namespaced(client, namespace),
            identity: identity.into(),
            timings,
        }
    }

    /// Tries once to become or stay leader.
    pub async fn try_acquire_or_renew(&self) -> Result<bool> {
        let now = Timestamp::now();
        let secs = self.timings.lease_duration.as_secs().max(1) as i32;
        let existing = self
            .api
            .get_opt(LOCK_NAME)
            .await
            .map_err(Error::kube("reading the leader lease"))?;
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(LOCK_NAME.into()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(Error::kube("creating the leader lease")(e)),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let renewed = spec
            .renew_time
            .as_ref()
            .map(|t| t.0)
            .unwrap_or(Timestamp::UNIX_EPOCH);
        let duration = SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(0) as i64);
        if holder != self.identity && !holder.is_empty() && renewed + duration > now {
            return Ok(false);
        }
        if holder != self.identity {
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            spec.holder_identity = Some(self.identity.clone());
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(secs);
        match self
            .api
            .replace(&lease.name_any(), &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(Error::kube("renewing the leader lease")(e)),
        }
    }

    /// Waits to become leader, then runs `work` while leading. Returns when
    /// `work` ends, or with an error when leadership is lost (the process
    /// should exit then, as controller-runtime's does).
    pub async fn run<F: Future<Output = Result<()>>>(&self, work: F) -> Result<()> {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => tracing::warn!(logger = "leader", error = %e, "leader election"),
            }
            tokio::time::sleep(self.timings.retry_period).await;
        }
        tracing::info!(logger = "leader", identity = %self.identity, "became leader");
        let renew = async {
            let mut last_ok = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(self.timings.retry_period).await;
                match self.try_acquire_or_renew().await {
                    Ok(true) => last_ok = tokio::time::Instant::now(),
                    Ok(false) => {
                        return Error::Config("leader lease taken by another instance".into());
                    }
                    Err(e) => tracing::warn!(logger = "leader", error = %e, "renewing leadership"),
                }
                if last_ok.elapsed() > self.timings.renew_deadline {
                    return Error::Config(
                        "leader lease not renewed within the renew deadline".into(),
                    );
                }
            }
        };
        tokio::select! {
            r = work => r,
            lost = renew => Err(lost),
        }
    }
}
