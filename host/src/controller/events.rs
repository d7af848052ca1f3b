//! Events as the Go operator records them: core/v1 Events with source
//! component `NodeMaintenance`, so `kubectl describe nm` shows them.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, Resource, ResourceExt};

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::error::{Error, Result};

/// The component every event is recorded with.
pub(crate) const COMPONENT: &str = "NodeMaintenance";

/// The event reasons and messages of the Go operator.
pub mod reasons {
    pub(crate) const BEGIN: (&str, &str) = ("BeginMaintenance", "Begin a node maintenance");
    pub(crate) const SUCCEEDED: (&str, &str) =
        ("SucceedMaintenance", "Node maintenance was succeeded");
    pub(crate) const UNCORDON: (&str, &str) = ("UncordonNode", "Uncordon a node");
    pub(crate) const REMOVED: (&str, &str) = ("RemovedMaintenance", "Removed a node maintenance");
    pub const FAILED: (&str, &str) = ("FailedMaintenance", "Failed a node maintenance");
    /// Ours: a policy could not decide (the message says why).
    pub(crate) const POLICY_ERROR: &str = "PolicyError";
    /// Ours: the policy holds the maintenance back (the message is its
    /// reason).
    pub const WAITING: &str = "WaitingMaintenance";
    /// Ours: `spec.nodeName` changed (no webhook refused it): the old node
    /// was restored and the maintenance starts over on the new one.
    pub(crate) const MOVED: &str = "MovedMaintenance";
    /// Ours: the policy admitted a maintenance that was waiting.
    pub(crate) const ADMITTED: (&str, &str) = (
        "AdmittedMaintenance",
        "The policy admitted the node maintenance",
    );
    /// Ours: a pod was removed by force (deleted, or with grace period
    /// 0); the message names the pod and the policy's rule.
    pub(crate) const FORCED: &str = "ForcedPodRemoval";
    /// Ours: a surge's replacement is Ready and the owner removes the pod.
    pub(crate) const SURGED: &str = "PodSurged";
    /// Ours: a surge was not possible; the pod is evicted instead.
    pub(crate) const SURGE_FELL_BACK: &str = "SurgeNotPossible";
    /// Ours: an application was asked to leave (the handshake).
    pub(crate) const NOTIFIED: &str = "EvictionRequested";
    /// Ours: a pod's owner reference cannot be read (an apiVersion not
    /// served, a name no object can have): the pod has no workload for the
    /// policy, and the drain goes on.
    pub(crate) const WORKLOAD_UNREADABLE: &str = "WorkloadUnreadable";
    /// Ours: the policy parked the maintenance.
    pub(crate) const PARKED: &str = "ParkedMaintenance";
}

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Normal,
    Warning,
}

/// Longest event message, as the events API bounds `note`.
pub(crate) const EVENT_MESSAGE_MAX_BYTES: usize = 1024;

/// Events waiting to be written at most; beyond, new ones are dropped
/// with a warning (client-go's recorder drops too when its queue is full).
pub(crate) const QUEUE: usize = 1000;

/// Writes events, in the order recorded, from a task of its own (as
/// client-go's recorder does): a reconcile never waits for an event. The
/// task is owned: [`Recorder::stop`] (a replica losing leadership) ends
/// it, and the next event starts another.
#[derive(Clone)]
pub(crate) struct Recorder {
    client: Client,
    instance: String,
    queue: Arc<Mutex<Option<Writer>>>,
}

/// The writer's queue, and its task.
struct Writer {
    tx: mpsc::Sender<(Event, String)>,
    _task: crate::task::Owned<()>,
}

/// Writes one event, logging it (or why it could not be written).
async fn write(client: &Client, event: Event, object: &str) {
    let namespace = event.metadata.namespace.clone().unwrap_or_default();
    match Api::<Event>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &event)
        .await
    {
        Ok(_) => tracing::info!(
            object = %object,
            reason = event.reason.as_deref().unwrap_or_default(),
            "{}",
            event.message.as_deref().unwrap_or_default()
        ),
        Err(e) => {
            let e = Error::kube("recording an event")(e);
            tracing::warn!(error = %e, "could not record an event");
        }
    }
}

impl Recorder {
    pub fn new(client: Client, instance: impl Into<String>) -> Self {
        Recorder {
            client,
            instance: instance.into(),
            queue: Arc::default(),
        }
    }

    /// The writer's queue, its task started on first use.
    fn queue(&self) -> mpsc::Sender<(Event, String)> {
        use crate::sync::Locked;
        let mut writer = self.queue.locked();
        let writer = writer.get_or_insert_with(|| {
            let (tx, mut rx) = mpsc::channel::<(Event, String)>(QUEUE);
            let client = self.client.clone();
            let task = crate::task::spawn(async move {
                while let Some((event, object)) = rx.recv().await {
                    write(&client, event, &object).await;
                }
            });
            Writer { tx, _task: task }
        });
        writer.tx.clone()
    }

    /// Ends the writer (the events still queued are dropped: a replica
    /// that lost leadership says nothing more).
    pub(crate) fn stop(&self) {
        use crate::sync::Locked;
        self.queue.locked().take();
    }

    /// Records an event about `obj`: queued for the writer. `Err` when it
    /// cannot be queued (the event is dropped).
    pub fn record<K>(&self, obj: &K, type_: EventType, reason: &str, message: &str) -> Result<()>
    where
        K: Resource<DynamicType = ()>,
    {
        let namespace = obj.namespace().unwrap_or_else(|| "default".to_owned());
        let now = Timestamp::now();
        let name = format!("{}.{:x}", obj.name_any(), now.as_nanosecond());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some(K::api_version(&()).into_owned()),
                kind: Some(K::kind(&()).into_owned()),
                name: Some(obj.name_any()),
                namespace: obj.namespace(),
                uid: obj.uid(),
                resource_version: obj.resource_version(),
                ..Default::default()
            },
            reason: Some(reason.to_owned()),
            // Kubernetes bounds an event's note to 1 kB; the text may come
            // from a policy, so it is escaped as well as cut.
            message: Some(crate::text::clean(message, EVENT_MESSAGE_MAX_BYTES)),
            type_: Some(
                match type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            source: Some(EventSource {
                component: Some(COMPONENT.to_owned()),
                host: None,
            }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            count: Some(1),
            reporting_component: Some(COMPONENT.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            action: Some(reason.to_owned()),
            ..Default::default()
        };
        self.queue().try_send((event, obj.name_any())).map_err(|e| {
            Error::EventDropped(match e {
                mpsc::error::TrySendError::Full(_) => "the queue is full",
                mpsc::error::TrySendError::Closed(_) => "the event writer has stopped",
            })
        })
    }
}
