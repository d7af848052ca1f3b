//! API semantics: what create, get, list, update, patch, delete and evict do
//! to the store, as the real API server does it. The HTTP layer and the
//! simulated controllers both go through here.

use std::sync::Arc;

use jiff::Timestamp;
use rand::Rng;
use serde_json::{Value, json};

use crate::error::{ApiError, success_status};
use crate::patch::{self, PatchType};
use crate::resources::{self, ResourceType};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::state::{Sim, Termination};
use crate::store::{ObjKey, Store};

/// Now, as the API server writes timestamps.
pub fn now_rfc3339() -> String {
    Timestamp::now()
        .round(jiff::Unit::Second)
        .unwrap_or(Timestamp::now())
        .to_string()
}

/// Now with microseconds (`MicroTime`, for leases and events).
pub fn now_micro() -> String {
    let t = Timestamp::now();

    t.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
}

/// Parses an RFC 3339 timestamp.
pub fn parse_time(s: &str) -> Option<Timestamp> {
    s.parse().ok()
}

fn random_suffix() -> String {
    const CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| CHARS[rng.random_range(0..CHARS.len())] as char)
        .collect()
}

/// Options of a delete.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub propagation: Option<String>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub dry_run: bool,
}

impl DeleteOptions {
    /// From a `DeleteOptions` body (and/or query values already merged in).
    pub fn from_body(v: &Value) -> Self {
        DeleteOptions {
            grace_period_seconds: v["gracePeriodSeconds"].as_i64(),
            propagation: v["propagationPolicy"].as_str().map(str::to_owned),
            precondition_uid: v["preconditions"]["uid"].as_str().map(str::to_owned),
            precondition_rv: v["preconditions"]["resourceVersion"]
                .as_str()
                .map(str::to_owned),
            dry_run: v["dryRun"].as_array().is_some_and(|a| !a.is_empty()),
        }
    }
}

/// A list request's filters.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

/// The answer to a list.
pub struct ListResult {
    pub items: Vec<Arc<Value>>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
}

/// Whether this object matches the selectors.
pub fn matches(obj: &Value, labels: &LabelSelector, fields: &FieldSelector) -> bool {
    (labels.is_empty() || labels.matches(&obj["metadata"]["labels"]))
        && (fields.is_empty() || fields.matches(obj))
}

/// Converts a stored core/v1 event into events.k8s.io/v1, and back.
mod events {
    use serde_json::{Value, json};

    const PAIRS: &[(&str, &str)] = &[
        ("involvedObject", "regarding"),
        ("message", "note"),
        ("source", "deprecatedSource"),
        ("firstTimestamp", "deprecatedFirstTimestamp"),
        ("lastTimestamp", "deprecatedLastTimestamp"),
        ("count", "deprecatedCount"),
        ("reportingComponent", "reportingController"),
        ("reportingInstance", "reportingInstance"),
        ("related", "related"),
        ("action", "action"),
        ("reason", "reason"),
        ("type", "type"),
        ("eventTime", "eventTime"),
        ("series", "series"),
    ];

    pub fn to_new(core: &Value) -> Value {
        let mut out = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": core["metadata"]});
        for (c, n) in PAIRS {
            if !core[c].is_null() {
                out[n] = core[c].clone();
            }
        }
        out
    }

    pub fn to_core(new: &Value) -> Value {
        let mut out = json!({"apiVersion": "v1", "kind": "Event", "metadata": new["metadata"]});
        for (c, n) in PAIRS {
            if !new[n].is_null() {
                out[c] = new[n].clone();
            }
        }
        // A real server fills source.component from reportingController for
        // readers of core/v1 that expect it.
        if out["source"].is_null() && !out["reportingComponent"].is_null() {
            out["source"] = json!({"component": out["reportingComponent"]});
        }
        if out["count"].is_null() {
            out["count"] = json!(1);
        }
        out
    }
}

/// Whether objects of this type are stored in another version's shape.
fn is_new_events(rt: &ResourceType) -> bool {
    rt.group == "events.k8s.io"
}

/// The stored object as seen through `rt`.
pub fn present(rt: &ResourceType, obj: &Value) -> Value {
    if is_new_events(rt) {
        return events::to_new(obj);
    }
    let mut v = obj.clone();
    v["apiVersion"] = json!(rt.api_version());
    v["kind"] = json!(rt.kind);
    v
}

fn to_storage(rt: &ResourceType, obj: Value) -> Value {
    if is_new_events(rt) {
        events::to_core(&obj)
    } else {
        obj
    }
}

impl Sim {
    fn check_namespace(
        &self,
        store: &Store,
        rt: &ResourceType,
        ns: Option<&str>,
    ) -> Result<(), ApiError> {
        if !rt.namespaced {
            return Ok(());
        }
        let ns = ns.ok_or_else(|| ApiError::bad_request("a namespace is required"))?;
        if store.get("namespaces", &ObjKey::new("", ns)).is_none() {
            return Err(ApiError::namespace_not_found(ns));
        }
        Ok(())
    }

    /// Creates an object.
    pub fn create(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        body: Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        let mut obj = to_storage(rt, body);
        let meta_ns = obj["metadata"]["namespace"].as_str().map(str::to_owned);
        if rt.namespaced {
            let ns = ns.ok_or_else(|| ApiError::bad_request("a namespace is required"))?;
            if let Some(m) = &meta_ns
                && m != ns
                && !m.is_empty()
            {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            obj["metadata"]["namespace"] = json!(ns);
        } else if let Some(m) = obj["metadata"].as_object_mut() {
            m.remove("namespace");
        }
        let name = match obj["metadata"]["name"].as_str() {
            Some(n) if !n.is_empty() => n.to_owned(),
            _ => match obj["metadata"]["generateName"].as_str() {
                Some(g) if !g.is_empty() => format!("{g}{}", random_suffix()),
                _ => {
                    return Err(ApiError::invalid(
                        rt,
                        "",
                        &[(
                            "metadata.name".into(),
                            "Required value: name or generateName is required".into(),
                        )],
                    ));
                }
            },
        };
        validate_name(rt, &name)?;
        obj["metadata"]["name"] = json!(name);
        let mut store = self.store();
        self.check_namespace(&store, rt, ns)?;
        let key = ObjKey::new(
            if rt.namespaced {
                ns.unwrap_or_default()
            } else {
                ""
            },
            &name,
        );
        if store.get(&rt.storage, &key).is_some() {
            return Err(ApiError::already_exists(rt, &name));
        }
        let meta = obj["metadata"].as_object_mut().expect("object");
        meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
        meta.remove("deletionTimestamp");
        meta.remove("deletionGracePeriodSeconds");
        meta.remove("resourceVersion");
        if !rt.group.is_empty() && !is_new_events(rt) {
            meta.insert("generation".into(), json!(1));
        }
        self.check_types(rt, &mut obj)?;
        crate::defaults::apply(rt, &mut obj);
        crate::defaults::on_create(rt, &mut obj);
        self.defaults_on_create(rt, &mut obj);
        schema_defaults(rt, &mut obj);
        validate_object(rt, &obj, &name)?;
        obj["apiVersion"] = json!(if is_new_events(rt) {
            "v1".to_string()
        } else {
            rt.api_version()
        });
        obj["kind"] = json!(rt.kind);
        if dry_run {
            return Ok(present(rt, &obj));
        }
        let stored = store.put(&rt.storage, obj);
        drop(store);
        self.after_write(rt, &stored);
        Ok(present(rt, &stored))
    }

    fn defaults_on_create(&self, rt: &ResourceType, obj: &mut Value) {
        if rt.status_subresource && rt.schema.is_some() {
            // Custom resources: status is only written through /status.
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
        match (rt.group.as_str(), rt.plural.as_str()) {
            ("", "pods") => {
                obj["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
            }
            ("", "namespaces") => {
                obj["status"] = json!({"phase": "Active"});
            }
            _ => {}
        }
    }

    /// Side effects of a stored write: CRDs start or stop serving, and the
    /// controllers wake up.
    fn after_write(&self, rt: &ResourceType, stored: &Value) {
        if rt.plural == "customresourcedefinitions" {
            self.register_crd(stored);
        }
        self.wake.notify_one();
    }

    fn register_crd(&self, crd: &Value) {
        let new_types = resources::from_crd(crd);
        {
            let mut types = self.types.write().unwrap_or_else(|p| p.into_inner());
            let group = crd["spec"]["group"].as_str().unwrap_or_default();
            let plural = crd["spec"]["names"]["plural"].as_str().unwrap_or_default();
            types.retain(|t| !(t.group == group && t.plural == plural));
            types.extend(new_types);
        }
        // Mark it established, as the apiextensions controller does.
        if crd["status"]["conditions"]
            .as_array()
            .is_none_or(|c| c.is_empty())
        {
            let mut c = crd.clone();
            let now = now_rfc3339();
            c["status"] = json!({
                "acceptedNames": crd["spec"]["names"],
                "storedVersions": crd["spec"]["versions"].as_array().into_iter().flatten()
                    .filter(|v| v["storage"].as_bool() == Some(true))
                    .map(|v| v["name"].clone()).collect::<Vec<_>>(),
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                     "message": "no conflicts found", "lastTransitionTime": now},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                     "message": "the initial names have been accepted", "lastTransitionTime": now},
                ],
            });
            self.store()
                .put("customresourcedefinitions.apiextensions.k8s.io", c);
        }
    }

    fn unregister_crd(&self, crd: &Value) {
        let group = crd["spec"]["group"].as_str().unwrap_or_default().to_owned();
        let plural = crd["spec"]["names"]["plural"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        self.types
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|t| !(t.group == group && t.plural == plural));
        let storage = format!("{plural}.{group}");
        let mut store = self.store();
        for obj in store.list(&storage, None) {
            store.remove(&storage, &ObjKey::of(&obj));
        }
    }

    /// Reads one object.
    pub fn get(&self, rt: &ResourceType, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
        let key = ObjKey::new(
            if rt.namespaced {
                ns.unwrap_or_default()
            } else {
                ""
            },
            name,
        );
        self.store()
            .get(&rt.storage, &key)
            .map(|o| present(rt, &o))
            .ok_or_else(|| ApiError::not_found(rt, name))
    }

    /// Lists objects, filtered and paginated.
    pub fn list(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Result<ListResult, ApiError> {
        let store = self.store();
        let rv = store.rv();
        let ns = if rt.namespaced { ns } else { None };
        // One node's pods come from the node index, as the watch cache
        // serves them.
        let candidates = match opts.fields.pinned("spec.nodeName") {
            Some(node) if rt.storage == "pods" => {
                let mut pods = store.pods_on(node);
                if let Some(ns) = ns {
                    pods.retain(|p| p["metadata"]["namespace"].as_str() == Some(ns));
                }
                pods
            }
            _ => store.list(&rt.storage, ns),
        };
        let mut items: Vec<Arc<Value>> = candidates
            .into_iter()
            .filter(|o| matches(&present_ref(rt, o), &opts.labels, &opts.fields))
            .collect();
        drop(store);
        if let Some(token) = &opts.continue_token {
            let (ns_after, name_after) = token
                .split_once('/')
                .ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
            let after = ObjKey::new(ns_after, name_after);
            items.retain(|o| ObjKey::of(o) > after);
        }
        let mut continue_token = None;
        let mut remaining = None;
        if let Some(limit) = opts.limit.filter(|l| *l > 0)
            && items.len() > limit
        {
            remaining = Some(items.len() - limit);
            items.truncate(limit);
            let last = ObjKey::of(items.last().expect("non-empty"));
            continue_token = Some(format!("{}/{}", last.namespace, last.name));
        }
        Ok(ListResult {
            items,
            resource_version: rv,
            continue_token,
            remaining,
        })
    }

    /// Replaces an object (PUT), or its status (`subresource` = status).
    pub fn update(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        body: Value,
        subresource: Option<&str>,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        let body = to_storage(rt, body);
        if body["metadata"]["name"].as_str().is_some_and(|n| n != name) {
            return Err(ApiError::bad_request(
                "the name of the object does not match the name on the URL",
            ));
        }
        let key = ObjKey::new(
            if rt.namespaced {
                ns.unwrap_or_default()
            } else {
                ""
            },
            name,
        );
        let mut store = self.store();
        let Some(old) = store.get(&rt.storage, &key) else {
            return Err(ApiError::not_found(rt, name));
        };
        if let Some(rv) = body["metadata"]["resourceVersion"].as_str()
            && !rv.is_empty()
            && old["metadata"]["resourceVersion"].as_str() != Some(rv)
        {
            return Err(ApiError::stale(rt, name));
        }
        let mut new = merge_update(rt, &old, body, subresource);
        self.check_types(rt, &mut new)?;
        crate::defaults::apply(rt, &mut new);
        schema_defaults(rt, &mut new);
        validate_object(rt, &new, name)?;
        self.commit(&mut store, rt, &key, &old, new, dry_run)
    }

    /// Stores an updated object, unless nothing changed; completes a
    /// deletion whose last finalizer went.
    fn commit(
        &self,
        store: &mut Store,
        rt: &ResourceType,
        key: &ObjKey,
        old: &Value,
        mut new: Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if new == *old {
            return Ok(present(rt, old));
        }
        if dry_run {
            return Ok(present(rt, &new));
        }
        let deleting = !new["metadata"]["deletionTimestamp"].is_null();
        let no_finalizers = new["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty());
        let graceful_pod =
            rt.plural == "pods" && rt.group.is_empty() && self.is_terminating_pod(&new);
        if deleting && no_finalizers && !graceful_pod {
            let stored = store.put(&rt.storage, new);
            let last = store.remove(&rt.storage, key).unwrap_or(stored);
            self.after_delete(rt, &last);
            return Ok(present(rt, &last));
        }
        let stored = store.put(&rt.storage, new);
        self.after_write(rt, &stored);
        Ok(present(rt, &stored))
    }

    fn is_terminating_pod(&self, pod: &Value) -> bool {
        pod["metadata"]["uid"].as_str().is_some_and(|u| {
            self.terminating
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(u)
        })
    }

    fn after_delete(&self, rt: &ResourceType, last: &Value) {
        if rt.plural == "customresourcedefinitions" {
            self.unregister_crd(last);
        }
        if let Some(uid) = last["metadata"]["uid"].as_str() {
            self.terminating
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(uid);
        }
        self.wake.notify_one();
    }

    /// Patches an object (or its status). An apply patch creates the
    /// object when it does not exist.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        kind: PatchType,
        patch: &Value,
        subresource: Option<&str>,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let key = ObjKey::new(
            if rt.namespaced {
                ns.unwrap_or_default()
            } else {
                ""
            },
            name,
        );
        let old = self.store().get(&rt.storage, &key);
        let Some(old) = old else {
            if kind == PatchType::Apply && subresource.is_none() {
                let mut body = patch.clone();
                body["metadata"]["name"] = json!(name);
                return self.create(rt, ns, body, dry_run);
            }
            return Err(ApiError::not_found(rt, name));
        };
        let mut target = present(rt, &old);
        match kind {
            PatchType::Json => patch::json_patch(&mut target, patch)
                .map_err(|_| ApiError::patch_does_not_apply())?,
            PatchType::Merge | PatchType::Apply => patch::merge_patch(&mut target, patch),
            PatchType::Strategic => {
                let msg = self.proto.message_for(&rt.api_version(), &rt.kind);
                if msg.is_none() {
                    return Err(ApiError::strategic_merge_unsupported());
                }
                patch::strategic_merge(&mut target, patch, &self.proto, msg)
            }
        }
        if !target.is_object() {
            return Err(ApiError::bad_request("the patch did not produce an object"));
        }
        let target = to_storage(rt, target);
        let mut store = self.store();
        let Some(current) = store.get(&rt.storage, &key) else {
            return Err(ApiError::not_found(rt, name));
        };
        // A patch that names a resourceVersion is a precondition.
        let patch_rv = patch["metadata"]["resourceVersion"].as_str();
        if patch_rv.is_some_and(|rv| current["metadata"]["resourceVersion"].as_str() != Some(rv)) {
            return Err(ApiError::stale(rt, name));
        }
        if current["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
            // Changed under us while patching: retry once on the new state
            // (the real server retries patches internally).
            drop(store);
            return self.patch(rt, ns, name, kind, patch, subresource, dry_run);
        }
        let mut new = merge_update(rt, &current, target, subresource);
        self.check_types(rt, &mut new)?;
        crate::defaults::apply(rt, &mut new);
        schema_defaults(rt, &mut new);
        validate_object(rt, &new, name)?;
        self.commit(&mut store, rt, &key, &current, new, dry_run)
    }

    /// Deletes an object: at once, or by setting deletionTimestamp when
    /// finalizers or a pod's grace period say so.
    pub fn delete(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let mut store = self.store();
        let (answer, removed) = self.delete_locked(&mut store, rt, ns, name, opts)?;
        drop(store);
        match removed {
            Some(last) => self.after_delete(rt, &last),
            None => self.wake.notify_one(),
        }
        Ok(answer)
    }

    /// The delete itself, under the store lock. Returns the answer and, when
    /// the object is gone for good, its last state.
    fn delete_locked(
        &self,
        store: &mut Store,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<(Value, Option<Value>), ApiError> {
        let key = ObjKey::new(
            if rt.namespaced {
                ns.unwrap_or_default()
            } else {
                ""
            },
            name,
        );
        let Some(old) = store.get(&rt.storage, &key) else {
            return Err(ApiError::not_found(rt, name));
        };
        preconditions(rt, name, &old, opts)?;
        if opts.dry_run {
            return Ok((present(rt, &old), None));
        }
        if opts.propagation.as_deref() == Some("Orphan") {
            orphan_dependents(store, &old);
        }
        let has_finalizers = old["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        let is_pod = rt.group.is_empty() && rt.plural == "pods";
        let grace = if is_pod { pod_grace(&old, opts) } else { 0 };
        if is_pod && grace > 0 {
            return Ok((self.terminate(store, rt, &old, grace), None));
        }
        if has_finalizers {
            if old["metadata"]["deletionTimestamp"].is_null() {
                let mut new = (*old).clone();
                new["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
                new["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                let stored = store.put(&rt.storage, new);
                return Ok((present(rt, &stored), None));
            }
            return Ok((present(rt, &old), None));
        }
        let last = store.remove(&rt.storage, &key).expect("present");
        if rt.group.is_empty() && rt.plural == "namespaces" {
            remove_namespace_contents(store, name);
        }
        Ok((present(rt, &last), Some((*last).clone())))
    }

    /// A pod deleted with a grace period: terminating until its
    /// containers stop or the period ends (a shorter grace period on a
    /// second delete shortens the wait). The answer.
    fn terminate(&self, store: &mut Store, rt: &ResourceType, old: &Value, grace: i64) -> Value {
        let uid = old["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let now = self.clock.now();
        let mut terminating = self.terminating.lock().unwrap_or_else(|p| p.into_inner());
        let already = old["metadata"]["deletionGracePeriodSeconds"].as_i64();
        // A shorter grace period on a second delete shortens the wait.
        if already.is_none_or(|a| grace < a) {
            let started = terminating.get(&uid).map_or(now, |t| t.started);
            let deadline = terminating
                .get(&uid)
                .map_or(now + grace as f64, |t| t.deadline.min(now + grace as f64));
            let first = !terminating.contains_key(&uid);
            let ends = crate::cluster::termination_ends(old, started, deadline);
            terminating.insert(
                uid.clone(),
                Termination {
                    started,
                    deadline,
                    ends,
                },
            );
            drop(terminating);
            if first {
                for c in old["spec"]["containers"].as_array().into_iter().flatten() {
                    let name = c["name"].as_str().unwrap_or_default();
                    self.logs.append(
                        &uid,
                        name,
                        &format!("[nmo-sim] {name}: received SIGTERM, grace period {grace}s"),
                    );
                }
            }
            let mut new = old.clone();
            let at = Timestamp::now() + jiff::SignedDuration::from_secs(grace);
            new["metadata"]["deletionTimestamp"] =
                json!(at.round(jiff::Unit::Second).unwrap_or(at).to_string());
            new["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            let stored = store.put(&rt.storage, new);
            return present(rt, &stored);
        }
        present(rt, old)
    }

    /// Rejects a built-in object whose fields have the wrong JSON types,
    /// with the real server's 400.
    fn check_types(&self, rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
        let cannot = |e: String| {
            ApiError::bad_request(format!(
                "{kind} in version \"{version}\" cannot be handled as a {kind}: {e}",
                kind = rt.kind,
                version = rt.version
            ))
        };
        self.proto
            .check_types(&rt.api_version(), &rt.kind, obj)
            .map_err(|e| cannot(e.to_string()))?;
        canonical_bytes(rt, obj).map_err(cannot)
    }

    /// Removes a terminating pod for good (the kubelet's last step).
    pub fn finish_pod_deletion(&self, ns: &str, name: &str, uid: &str) {
        let mut store = self.store();
        let key = ObjKey::new(ns, name);
        if store
            .get("pods", &key)
            .is_some_and(|p| p["metadata"]["uid"].as_str() == Some(uid))
        {
            let has_finalizers = store.get("pods", &key).is_some_and(|p| {
                p["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty())
            });
            if !has_finalizers {
                store.remove("pods", &key);
            }
        }
        drop(store);
        self.terminating
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
        self.wake.notify_one();
    }

    /// The Eviction subresource: a PodDisruptionBudget-checked delete. The
    /// check and the delete happen under one lock, so two evictions racing
    /// for the last allowed disruption cannot both win.
    pub fn evict(&self, ns: &str, name: &str, body: &Value) -> Result<Value, ApiError> {
        let pods = self.find_type("", "v1", "pods").expect("pods are built in");
        if body["metadata"]["name"].as_str().is_some_and(|n| n != name) {
            return Err(ApiError::bad_request(format!(
                "name in URL does not match name in Eviction object: {name}"
            )));
        }
        let opts = DeleteOptions::from_body(&body["deleteOptions"]);
        let mut store = self.store();
        let pod = store
            .get("pods", &ObjKey::new(ns, name))
            .ok_or_else(|| ApiError::not_found(&pods, name))?;
        let terminal = matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        );
        let pending = pod["status"]["phase"].as_str() == Some("Pending");
        let deleting = !pod["metadata"]["deletionTimestamp"].is_null();
        let budget = if terminal || pending || deleting {
            None
        } else {
            check_disruption_budget(&store, ns, &pod)?
        };
        if opts.dry_run {
            return Ok(success_status(None));
        }
        if let Some((pdb, status)) = budget {
            // As the real API server: the eviction itself spends the
            // disruption (the pod in disruptedPods, one fewer allowed),
            // written before the pod is deleted.
            store.put(
                "poddisruptionbudgets.policy",
                spend_disruption(&pdb, status, name),
            );
        }
        let (_, removed) = self.delete_locked(&mut store, &pods, Some(ns), name, &opts)?;
        drop(store);
        match removed {
            Some(last) => self.after_delete(&pods, &last),
            None => self.wake.notify_one(),
        }
        Ok(success_status(None))
    }
}

/// `pdb` with the disruption of the pod `name` spent on `status` (its
/// status now): the pod in `disruptedPods`, one disruption fewer allowed.
fn spend_disruption(pdb: &Value, mut status: Value, name: &str) -> Value {
    let allowed = status["disruptionsAllowed"].as_i64().unwrap_or(0) - 1;
    status["disruptionsAllowed"] = json!(allowed.max(0));
    let mut disrupted = pdb["status"]["disruptedPods"].clone();
    if !disrupted.is_object() {
        disrupted = json!({});
    }
    disrupted[name] = json!(now_rfc3339());
    status["disruptedPods"] = disrupted;
    if allowed <= 0 {
        status["conditions"][0]["status"] = json!("False");
        status["conditions"][0]["reason"] = json!("InsufficientPods");
    }
    let mut new = pdb.clone();
    new["status"] = status;
    new
}

/// Refuses an eviction that would take a PodDisruptionBudget below what it
/// allows; the budget that allows it, with its status now.
fn check_disruption_budget(
    store: &Store,
    ns: &str,
    pod: &Value,
) -> Result<Option<(Arc<Value>, Value)>, ApiError> {
    let pdbs: Vec<Arc<Value>> = store
        .list("poddisruptionbudgets.policy", Some(ns))
        .into_iter()
        .filter(|pdb| {
            LabelSelector::from_object(&pdb["spec"]["selector"])
                .map(|s| !s.is_empty() && s.matches(&pod["metadata"]["labels"]))
                .unwrap_or(false)
        })
        .collect();
    if pdbs.len() > 1 {
        return Err(ApiError::internal(
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        ));
    }
    let Some(pdb) = pdbs.into_iter().next() else {
        return Ok(None);
    };
    let status = crate::cluster::pdb_status(store, &pdb);
    if status["disruptionsAllowed"].as_i64().unwrap_or(0) <= 0 {
        let pdb_name = pdb["metadata"]["name"].as_str().unwrap_or_default();
        return Err(ApiError::too_many_requests(
            "Cannot evict pod as it would violate the pod's disruption budget.",
            vec![json!({
                "reason": "DisruptionBudget",
                "message": format!(
                    "The disruption budget {pdb_name} needs {} healthy pods and has {} currently",
                    status["desiredHealthy"], status["currentHealthy"]
                ),
            })],
            None,
        ));
    }
    Ok(Some((pdb, status)))
}

/// A stored object as `rt` presents it, written out without a copy (a
/// list or a watch event serializes it as it is stored, with its type
/// fields).
pub struct Presented<'a> {
    api_version: String,
    kind: &'a str,
    obj: std::borrow::Cow<'a, Value>,
}

pub fn presented<'a>(rt: &'a ResourceType, obj: &'a Value) -> Presented<'a> {
    Presented {
        api_version: rt.api_version(),
        kind: &rt.kind,
        obj: present_ref(rt, obj),
    }
}

impl serde::Serialize for Presented<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let Some(fields) = self.obj.as_object() else {
            return self.obj.serialize(s);
        };
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("apiVersion", &self.api_version)?;
        m.serialize_entry("kind", self.kind)?;
        for (k, v) in fields {
            if k != "apiVersion" && k != "kind" {
                m.serialize_entry(k, v)?;
            }
        }
        m.end()
    }
}

/// A stored object as `rt` presents it, without cloning when nothing
/// changes but the type fields (selectors never look at those).
pub fn present_ref<'a>(rt: &ResourceType, obj: &'a Value) -> std::borrow::Cow<'a, Value> {
    if is_new_events(rt) {
        std::borrow::Cow::Owned(present(rt, obj))
    } else {
        std::borrow::Cow::Borrowed(obj)
    }
}

/// The new stored object for an update of the main resource or of status.
fn merge_update(rt: &ResourceType, old: &Value, body: Value, subresource: Option<&str>) -> Value {
    let mut new = if subresource == Some("status") {
        let mut n = old.clone();
        n["status"] = body["status"].clone();
        n
    } else {
        let mut n = body;
        if rt.status_subresource {
            if old["status"].is_null() {
                if let Some(m) = n.as_object_mut() {
                    m.remove("status");
                }
            } else {
                n["status"] = old["status"].clone();
            }
        }
        n
    };
    // Fields the server owns.
    let meta = new["metadata"].as_object_mut().expect("object");
    for f in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "namespace",
        "name",
    ] {
        match old["metadata"].get(f) {
            Some(v) => {
                meta.insert(f.into(), v.clone());
            }
            None => {
                meta.remove(f);
            }
        }
    }
    new["apiVersion"] = old["apiVersion"].clone();
    new["kind"] = old["kind"].clone();
    if subresource.is_none() && !old["metadata"]["generation"].is_null() {
        let changed = |o: &Value, n: &Value| {
            o.as_object()
                .into_iter()
                .flatten()
                .chain(n.as_object().into_iter().flatten())
                .any(|(k, _)| {
                    !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind")
                        && o[k] != n[k]
                })
        };
        if changed(old, &new) {
            let g = old["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
            new["metadata"]["generation"] = json!(g);
        }
    }
    new
}

fn orphan_dependents(store: &mut Store, owner: &Value) {
    let Some(uid) = owner["metadata"]["uid"].as_str() else {
        return;
    };
    let storages: Vec<String> = ["pods", "replicasets.apps", "jobs.batch"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for storage in storages {
        for obj in store.list(&storage, None) {
            let owned = obj["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|o| o.iter().any(|r| r["uid"].as_str() == Some(uid)));
            if owned {
                let mut n = (*obj).clone();
                if let Some(refs) = n["metadata"]["ownerReferences"].as_array_mut() {
                    refs.retain(|r| r["uid"].as_str() != Some(uid));
                }
                store.put(&storage, n);
            }
        }
    }
}

fn remove_namespace_contents(store: &mut Store, ns: &str) {
    let storages: Vec<String> = crate::resources::builtin()
        .into_iter()
        .filter(|r| r.namespaced)
        .map(|r| r.storage)
        .collect();
    for storage in storages {
        for obj in store.list(&storage, Some(ns)) {
            store.remove(&storage, &ObjKey::of(&obj));
        }
    }
}

fn validate_name(rt: &ResourceType, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.chars().all(|c| {
            c.is_ascii_lowercase()
                || c.is_ascii_digit()
                || c == '-'
                || c == '.'
                || (c == ':' && rt.group.starts_with("rbac"))
        })
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            rt,
            name,
            &[(
                "metadata.name".into(),
                format!(
                    "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
                ),
            )],
        ))
    }
}

/// Schema checks: required fields (CRDs, from their schema) and the
/// built-in requirements the operator and kubectl rely on.
fn validate_object(rt: &ResourceType, obj: &Value, name: &str) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    if let Some(schema) = &rt.schema {
        check_schema(schema, obj, "", &mut causes);
    }
    if rt.group.is_empty()
        && rt.plural == "pods"
        && obj["spec"]["containers"]
            .as_array()
            .is_none_or(|c| c.is_empty())
    {
        causes.push(("spec.containers".into(), "Required value".into()));
    }
    // apimachinery's ValidateAnnotationsSize: keys and values together.
    const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;
    let annotations: usize = obj["metadata"]["annotations"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
                .sum()
        })
        .unwrap_or(0);
    if annotations > TOTAL_ANNOTATION_SIZE_LIMIT {
        causes.push((
            "metadata.annotations".into(),
            format!("Too long: must have at most {TOTAL_ANNOTATION_SIZE_LIMIT} bytes"),
        ));
    }
    // A ConfigMap's data and binaryData (decoded) together: 1 MiB.
    if rt.group.is_empty() && rt.plural == "configmaps" {
        const MAX_CONFIGMAP_BYTES: usize = 1024 * 1024;
        let size = |field: &str, decoded: bool| -> usize {
            obj[field]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| {
                            let len = v.as_str().map_or(0, str::len);
                            k.len() + if decoded { len / 4 * 3 } else { len }
                        })
                        .sum()
                })
                .unwrap_or(0)
        };
        if size("data", false) + size("binaryData", true) > MAX_CONFIGMAP_BYTES {
            causes.push((
                "[]".into(),
                format!("Too long: must have at most {MAX_CONFIGMAP_BYTES} bytes"),
            ));
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(rt, name, &causes))
    }
}

fn check_schema(schema: &Value, v: &Value, path: &str, causes: &mut Vec<(String, String)>) {
    let join = |k: &str| {
        if path.is_empty() {
            k.to_owned()
        } else {
            format!("{path}.{k}")
        }
    };
    if let Some(req) = schema["required"].as_array() {
        for r in req.iter().filter_map(Value::as_str) {
            if v.get(r).is_none_or(Value::is_null) {
                causes.push((join(r), "Required value".into()));
            }
        }
    }
    let type_ok = match (schema["type"].as_str(), v) {
        (_, Value::Null) => true,
        (Some("string"), x) => x.is_string(),
        (Some("integer"), x) => x.is_i64() || x.is_u64(),
        (Some("number"), x) => x.is_number(),
        (Some("boolean"), x) => x.is_boolean(),
        (Some("array"), x) => x.is_array(),
        (Some("object"), x) => x.is_object(),
        _ => true,
    };
    if !type_ok && !path.is_empty() {
        causes.push((
            path.to_owned(),
            format!(
                "Invalid value: {}: {path} in body must be of type {}",
                compact(v),
                schema["type"].as_str().unwrap_or_default()
            ),
        ));
        return;
    }
    if let (Some(s), Some(min)) = (v.as_str(), schema["minLength"].as_u64())
        && (s.chars().count() as u64) < min
    {
        causes.push((
            path.to_owned(),
            format!("Invalid value: \"{s}\": {path} in body should be at least {min} chars long"),
        ));
    }
    if let (Some(s), Some(max)) = (v.as_str(), schema["maxLength"].as_u64())
        && (s.chars().count() as u64) > max
    {
        causes.push((
            path.to_owned(),
            format!("Too long: may not be more than {max} bytes"),
        ));
    }
    if let Some(props) = schema["properties"].as_object() {
        for (k, s) in props {
            if let Some(child) = v.get(k) {
                check_schema(s, child, &join(k), causes);
            }
        }
    }
}

fn compact(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        other => other.to_string(),
    }
}

/// The container a `pods/log` request reads, and whether it has started:
/// the one named, or the pod's only container. The errors are the real
/// server's.
pub fn log_container(pod: &Value, container: Option<&str>) -> Result<(String, bool), ApiError> {
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let names: Vec<&str> = ["initContainers", "containers"]
        .iter()
        .flat_map(|k| pod["spec"][*k].as_array().into_iter().flatten())
        .filter_map(|c| c["name"].as_str())
        .collect();
    let regular: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let name = match container.filter(|c| !c.is_empty()) {
        Some(c) if names.contains(&c) => c.to_owned(),
        Some(c) => {
            return Err(ApiError::bad_request(format!(
                "container {c} is not valid for pod {pod_name}"
            )));
        }
        None if regular.len() == 1 => regular[0].to_owned(),
        None => {
            return Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {pod_name}, choose one of: [{}]",
                regular.join(" ")
            )));
        }
    };
    let started = pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| s["name"] == name.as_str() && !s["state"]["waiting"].is_object());
    Ok((name, started))
}

/// A ConfigMap's `binaryData` and a Secret's `data` are bytes: the real
/// server decodes their base64 as Go's encoding/json does (line breaks
/// ignored, as in kustomize's line-wrapped output; anything else not base64
/// refused) and answers them re-encoded, canonical. Stored as answered.
fn canonical_bytes(rt: &ResourceType, obj: &mut Value) -> Result<(), String> {
    use base64::Engine;
    let field = match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "configmaps") => "binaryData",
        ("", "secrets") => "data",
        _ => return Ok(()),
    };
    let Some(map) = obj.get_mut(field).and_then(Value::as_object_mut) else {
        return Ok(());
    };
    let engine = base64::engine::general_purpose::STANDARD;
    for value in map.values_mut() {
        let Some(text) = value.as_str() else { continue };
        if !text.contains(['\n', '\r']) && engine.decode(text).is_ok() {
            continue;
        }
        let joined: String = text.chars().filter(|c| !matches!(c, '\n' | '\r')).collect();
        let bytes = engine.decode(&joined).map_err(|e| match e {
            base64::DecodeError::InvalidByte(at, _) => {
                format!("illegal base64 data at input byte {at}")
            }
            _ => format!("illegal base64 data at input byte {}", joined.len()),
        })?;
        *value = Value::String(engine.encode(bytes));
    }
    Ok(())
}

/// A custom resource's structural schema, as the real server applies it:
/// a missing field with a `default` gets it, inside objects that exist (an
/// absent `status` gets none until it is written), and a field the schema
/// does not know is pruned (unless the schema preserves unknown fields).
fn schema_defaults(rt: &ResourceType, obj: &mut Value) {
    fn walk(schema: &Value, obj: &mut Value) {
        match obj {
            Value::Object(map) => {
                let known = schema["properties"].as_object();
                let preserves = schema["x-kubernetes-preserve-unknown-fields"] == true
                    || schema.get("additionalProperties").is_some();
                if let Some(known) = known.filter(|_| !preserves) {
                    map.retain(|k, _| known.contains_key(k));
                }
                for (key, sub) in schema["properties"].as_object().into_iter().flatten() {
                    match map.get_mut(key) {
                        Some(v) => walk(sub, v),
                        None => {
                            if let Some(d) = sub.get("default") {
                                map.insert(key.clone(), d.clone());
                            }
                        }
                    }
                }
            }
            Value::Array(items) => {
                if let Some(sub) = schema.get("items") {
                    for item in items {
                        walk(sub, item);
                    }
                }
            }
            _ => {}
        }
    }
    if let Some(schema) = &rt.schema {
        // The object's own apiVersion, kind and metadata are never pruned.
        let kept: Vec<(String, Value)> = ["apiVersion", "kind", "metadata"]
            .iter()
            .filter_map(|k| Some(((*k).to_owned(), obj.get(*k)?.clone())))
            .collect();
        walk(schema, obj);
        if let Value::Object(map) = obj {
            for (k, v) in kept {
                map.entry(k).or_insert(v);
            }
        }
    }
}

/// The delete's preconditions (uid, resourceVersion), as the real server
/// words their failure.
fn preconditions(
    rt: &ResourceType,
    name: &str,
    old: &Value,
    opts: &DeleteOptions,
) -> Result<(), ApiError> {
    let checks = [
        ("UID", "uid", &opts.precondition_uid),
        ("ResourceVersion", "resourceVersion", &opts.precondition_rv),
    ];
    for (what, field, wanted) in checks {
        let has = old["metadata"][field].as_str().unwrap_or_default();
        if let Some(wanted) = wanted
            && has != wanted
        {
            return Err(ApiError::conflict(
                rt,
                name,
                &format!(
                    "Precondition failed: {what} in precondition: {wanted}, {what} in object meta: {has}"
                ),
            ));
        }
    }
    Ok(())
}

/// The grace period a pod is deleted with: the delete's, else its own;
/// none for a pod not scheduled or already finished.
fn pod_grace(old: &Value, opts: &DeleteOptions) -> i64 {
    let own = old["spec"]["terminationGracePeriodSeconds"]
        .as_i64()
        .unwrap_or(30);
    let g = opts.grace_period_seconds.unwrap_or(own).max(0);
    let scheduled = old["spec"]["nodeName"]
        .as_str()
        .is_some_and(|n| !n.is_empty());
    let finished = matches!(
        old["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    );
    if scheduled && !finished { g } else { 0 }
}
