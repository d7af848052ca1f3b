//! The owner a surge raises: its reads and writes (replicas, the surge
//! record on it, the deletion cost on its pods) and why it may refuse a
//! surge.

use super::*;

/// The workload whose replicas a surge raises.
#[derive(Clone)]
pub(super) struct Owner {
    pub(super) api: Api<DynamicObject>,
    pub(super) kind: Kind,
    pub(super) object: DynamicObject,
    /// This look wrote the owner (or a pod of it): the desk's read is
    /// stale.
    pub(super) wrote: bool,
    /// What this process's surges wrote on owners: the record trusted.
    pub(super) memory: Arc<SurgeMemory>,
}

impl Owner {
    /// Owner `object`, of `kind`, in `namespace`.
    pub(super) fn of(
        client: &Client,
        namespace: &str,
        kind: Kind,
        object: DynamicObject,
        memory: &Arc<SurgeMemory>,
    ) -> Owner {
        Owner {
            api: Api::namespaced_with(client.clone(), namespace, &kind.resource()),
            kind,
            object,
            wrote: false,
            memory: memory.clone(),
        }
    }

    pub(super) fn shown(&self) -> String {
        format!("{}/{}", self.kind, self.object.name_any())
    }

    pub(super) fn replicas(&self) -> i64 {
        replicas_of(&self.object.data)
    }

    /// The owner's surge record: as this process last wrote it, whatever
    /// the owner's annotation now says (rewritten or removed by a tool
    /// that owns annotations, forged); the annotation only when this
    /// process has written none (a surge resumed after a restart), and
    /// only if a surge could have left it so: its count is the owner's
    /// replicas, and the owner carries the surge label naming one of its
    /// maintenances. Anything else there is not a surge of ours: a new
    /// surge starts from the replicas as they stand.
    /// The owner's surge record, as far as it is trusted
    /// ([`SurgeMemory::trusted`]; a record naming a maintenance since
    /// deleted is still one to undo, so every name counts as live here).
    pub(super) fn record(&self) -> Option<Record> {
        let found = Found {
            uid: self.object.metadata.uid.as_deref().unwrap_or_default(),
            annotation: self
                .object
                .annotations()
                .get(SURGE_ANNOTATION)
                .map(String::as_str),
            label: self.object.labels().get(SURGE_LABEL).map(String::as_str),
            replicas: self.replicas(),
        };
        self.memory.trusted(found, &|_: &str| true)
    }

    pub(super) fn selector(&self) -> Option<String> {
        let s: LabelSelector =
            serde_json::from_value(self.object.data["spec"]["selector"].clone()).ok()?;
        let s = kube::core::Selector::try_from(s).ok()?;
        Some(s.to_string())
    }

    /// Why the owner's rules allow no extra pod, if they do not.
    pub(super) fn refuses_surge(&self) -> Option<String> {
        refusal(self.kind.name(), &self.object.data, &self.shown())
    }

    /// How many pods of the owner may surge at once: a Deployment's
    /// `maxSurge` resolved against its replicas before the surges
    /// (`replicas`), as its own rollouts resolve it; one for a bare
    /// ReplicaSet, which has no strategy.
    pub(super) fn max_surge(&self, replicas: i64) -> usize {
        if self.kind != Kind::Deployment {
            return 1;
        }
        usize::try_from(deployment_max_surge(&self.object.data, replicas)).unwrap_or(0)
    }

    /// A Deployment whose controller has not caught up, or that is rolling
    /// out: its ReplicaSets are about to change.
    pub(super) fn settling(&self) -> bool {
        if self.kind != Kind::Deployment {
            return false;
        }
        let d = &self.object.data;
        let generation = self.object.metadata.generation.unwrap_or(0);
        let observed = d["status"]["observedGeneration"].as_i64().unwrap_or(0);
        let replicas = d["spec"]["replicas"].as_i64().unwrap_or(1);
        let updated = d["status"]["updatedReplicas"].as_i64().unwrap_or(0);
        observed < generation
            || updated < replicas.min(d["status"]["replicas"].as_i64().unwrap_or(0))
    }

    /// Writes replicas, annotation and label in one patch that holds only
    /// if the owner is as read where a surge cares: its spec (the
    /// generation) and its surge record, whatever its controller wrote to
    /// its status since (a JSON patch's `test`s; a status written every
    /// few milliseconds would refuse a write conditioned on the whole
    /// object). An owner without a generation, annotations or labels to
    /// test against is written on its resourceVersion instead. A refusal
    /// is a conflict (409) either way; the owner is then as written. The
    /// label names a maintenance with a surge there (the record names them
    /// all).
    pub(super) async fn write(
        &mut self,
        replicas: i64,
        record: Option<&Record>,
    ) -> kube::Result<()> {
        let name = self.object.name_any();
        let params = PatchParams::default();
        let written = match self.tested_patch(replicas, record) {
            Some(ops) => {
                self.api
                    .patch(&name, &params, &Patch::Json::<()>(ops))
                    .await
            }
            None => {
                let patch = json!({
                    "metadata": {
                        "resourceVersion": self.object.resource_version(),
                        "annotations": {SURGE_ANNOTATION: record.map(record_text)},
                        "labels": {SURGE_LABEL: surge_label(record)},
                    },
                    "spec": {"replicas": replicas},
                });
                self.api.patch(&name, &params, &Patch::Merge(&patch)).await
            }
        };
        let written = written.inspect(|object| {
            self.memory.wrote(
                &object.uid().unwrap_or_default(),
                Remembered {
                    kind: self.kind,
                    namespace: object.namespace().unwrap_or_default(),
                    name: object.name_any(),
                    record: record.cloned().unwrap_or_else(Record::none),
                },
            );
        });
        self.object = written.map_err(|e| match e {
            // A test that failed: the owner changed since it was read.
            kube::Error::Api(s) if s.code == 422 => kube::Error::Api(
                kube::core::Status::failure(
                    &format!("{} changed since it was read", self.shown()),
                    "Conflict",
                )
                .with_code(409)
                .boxed(),
            ),
            e => e,
        })?;
        self.wrote = true;
        Ok(())
    }

    /// The JSON patch of [`Owner::write`], if the owner as read has what
    /// its tests need.
    pub(super) fn tested_patch(
        &self,
        replicas: i64,
        record: Option<&Record>,
    ) -> Option<json_patch::Patch> {
        let meta = &self.object.metadata;
        let (annotations, labels) = (meta.annotations.as_ref()?, meta.labels.as_ref()?);
        let pointer = |map: &str, key: &str| {
            format!(
                "/metadata/{map}/{}",
                key.replace('~', "~0").replace('/', "~1")
            )
        };
        let (annotation, label) = (
            pointer("annotations", SURGE_ANNOTATION),
            pointer("labels", SURGE_LABEL),
        );
        let mut ops = vec![
            json!({"op": "test", "path": "/metadata/generation", "value": meta.generation?}),
            json!({"op": "test", "path": annotation, "value": annotations.get(SURGE_ANNOTATION)}),
            json!({"op": "add", "path": "/spec/replicas", "value": replicas}),
        ];
        match record.map(record_text) {
            Some(text) => ops.push(json!({"op": "add", "path": annotation, "value": text})),
            None if annotations.contains_key(SURGE_ANNOTATION) => {
                ops.push(json!({"op": "remove", "path": annotation}));
            }
            None => {}
        }
        match surge_label(record) {
            Some(m) => ops.push(json!({"op": "add", "path": label, "value": m})),
            None if labels.contains_key(SURGE_LABEL) => {
                ops.push(json!({"op": "remove", "path": label}));
            }
            None => {}
        }
        serde_json::from_value(Value::Array(ops)).ok()
    }
}

pub(super) fn record_text(record: &Record) -> String {
    serde_json::to_string(record).unwrap_or_default()
}

/// The surge label's value for `record`: a maintenance it names.
pub(super) fn surge_label(record: Option<&Record>) -> Option<String> {
    record
        .and_then(|r| r.entries().next())
        .map(|e| e.maintenance.clone())
}

/// Why an owner of `kind` with `data` (its object, as JSON) allows no
/// extra pod, if it does not; `shown` names it.
pub(super) fn refusal(kind: &str, data: &Value, shown: &str) -> Option<String> {
    let replicas = replicas_of(data);
    // spec.replicas is an int32: one more than its largest is no replica
    // count the API server takes.
    if replicas >= i64::from(i32::MAX) || replicas < 0 {
        return Some(format!(
            "{shown} has {replicas} replicas: one more is past what spec.replicas holds"
        ));
    }
    if kind != "Deployment" {
        return None;
    }
    if data["spec"]["strategy"]["type"].as_str() == Some("Recreate") {
        return Some(format!(
            "{shown} uses the Recreate strategy: it never runs an extra pod"
        ));
    }
    (deployment_max_surge(data, replicas) < 1)
        .then(|| format!("{shown} has maxSurge 0: it allows no extra pod"))
}

/// The owner whose replicas to raise for a pod of the ReplicaSet `rs`:
/// its Deployment, or the ReplicaSet itself.
pub(super) async fn owner(
    client: &Client,
    namespace: &str,
    rs: &str,
    memory: &Arc<SurgeMemory>,
) -> kube::Result<Owner> {
    let read = |kind: Kind| {
        Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &kind.resource())
    };
    let set = read(Kind::ReplicaSet).get(rs).await?;
    let deployment = set
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == Kind::Deployment.name())
        .map(|o| o.name.clone());
    Ok(match deployment {
        Some(name) => {
            let object = read(Kind::Deployment).get(&name).await?;
            Owner::of(client, namespace, Kind::Deployment, object, memory)
        }
        None => Owner::of(client, namespace, Kind::ReplicaSet, set, memory),
    })
}

/// The owner's pods (by its selector), as one look sees them.
pub(super) async fn owner_pods(
    client: &Client,
    namespace: &str,
    selector: &str,
) -> kube::Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    Ok(pods
        .list(&ListParams::default().labels(selector))
        .await?
        .items)
}

/// The owner's pods that serve and stay: Ready, not terminating, not
/// leaving (the lowest deletion cost: a surge gave it to them), and not
/// among `except` (uids).
pub(super) fn serving(pods: &[Arc<Pod>], except: &[&str]) -> usize {
    let lowest = i32::MIN.to_string();
    pods.iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.annotations().get(DELETION_COST) != Some(&lowest)
                && !except.contains(&p.uid().as_deref().unwrap_or_default())
                && crate::policy::convert::pod_ready(p)
        })
        .count()
}
