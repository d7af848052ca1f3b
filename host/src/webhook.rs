//! The validating admission webhook for NodeMaintenance, over TLS, with the
//! Go operator's rules and messages:
//! - create: the node must exist; no other NodeMaintenance may target it;
//!   on OpenShift a control-plane node may not enter maintenance when that
//!   would break etcd quorum;
//! - update: `spec.nodeName` is immutable.
//!
//! Beyond the Go operator, at [`CRD_GUARD_PATH`]: the NodeMaintenance CRD
//! is not deleted while NodeMaintenances exist. Deleting it deletes them
//! all at once, and when the operator goes with it (`kubectl delete -k`
//! of the whole install) their nodes stay cordoned and tainted with no
//! one to restore them, and the CRD stays half-deleted until a reinstall
//! finishes the deletion under the new operator.
//!
//! The certificate and key are read from a directory (`tls.crt`,
//! `tls.key`, as cert-manager and controller-runtime lay them out) and
//! read again whenever they change on disk.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::crd::NodeMaintenance;
use crate::error::Result;

/// The path the Go operator's webhook is registered at.
pub const PATH: &str = "/validate-nodemaintenance-medik8s-io-v1beta1-nodemaintenance";
/// How long a create waits for the NodeMaintenance watch to show what the
/// API server has before it lists instead.
const CATCH_UP: std::time::Duration = std::time::Duration::from_secs(2);

/// Where the CRD deletion guard is registered.
pub const CRD_GUARD_PATH: &str = "/validate-nodemaintenance-crd-deletion";
/// Largest AdmissionReview accepted (the servers' default body limit).
pub use crate::server::MAX_BODY;

/// The Go operator's messages.
pub mod messages {
    pub fn node_not_found(node: &str) -> String {
        format!("invalid nodeName, no node with name {node} found")
    }
    pub fn already_exists(node: &str) -> String {
        format!("invalid nodeName, a NodeMaintenance for node {node} already exists")
    }
    pub const NODE_NAME_IMMUTABLE: &str = "updating spec.NodeName isn't allowed";
    /// nmo's own: the CRD deletion guard's refusal, naming some of the
    /// maintenances that hold it (`more`: there are others).
    pub fn crd_in_use(held: &[String], more: bool) -> String {
        format!(
            "NodeMaintenances exist ({}{}): deleting their CRD would delete them all, and with the operator gone their nodes would stay cordoned and tainted. Delete them first (kubectl delete nodemaintenances --all) and wait until they are gone, or uninstall keeping them (kubectl delete -k deploy/uninstall; helm uninstall keeps the CRD)",
            held.join(", "),
            if more { ", ..." } else { "" }
        )
    }
    pub(crate) fn etcd_quorum(node: &str) -> String {
        format!(
            "can not put master/control-plane node into maintenance at this moment, disrupting node {node} will violate etcd quorum"
        )
    }
}

/// The webhook's metrics, controller-runtime's. Cheap to clone.
#[derive(Clone, Debug)]
pub struct WebhookMetrics {
    requests: prometheus::IntCounterVec,
    latency: prometheus::HistogramVec,
    in_flight: prometheus::IntGaugeVec,
    panics: prometheus::IntCounterVec,
}

impl WebhookMetrics {
    /// Registers the webhook's families on `registry`.
    pub fn register(registry: &prometheus::Registry) -> crate::metrics::Result<Self> {
        let m = WebhookMetrics {
            requests: crate::metrics::counter_vec(
                registry,
                "controller_runtime_webhook_requests_total",
                "Total number of admission requests by HTTP status code.",
                &["webhook", "code"],
            )?,
            latency: crate::metrics::histogram_vec(
                registry,
                "controller_runtime_webhook_latency_seconds",
                "Histogram of the latency of processing admission requests",
                &["webhook"],
                crate::metrics::exponential(0.001, 2.0, 14),
            )?,
            in_flight: crate::metrics::gauge_vec(
                registry,
                "controller_runtime_webhook_requests_in_flight",
                "Current number of admission requests being served.",
                &["webhook"],
            )?,
            panics: crate::metrics::counter_vec(
                registry,
                "controller_runtime_webhook_panics_total",
                "Total number of webhook panics",
                &[],
            )?,
        };
        // As controller-runtime: the series exist at 0 from the start.
        m.requests.with_label_values(&[PATH, "200"]);
        m.in_flight.with_label_values(&[PATH]).set(0);
        m.panics.with_label_values::<&str>(&[]);
        Ok(m)
    }

    /// One admission request answered with `code` after `seconds`.
    fn answered(&self, code: &str, seconds: f64) {
        self.requests.with_label_values(&[PATH, code]).inc();
        self.latency.with_label_values(&[PATH]).observe(seconds);
    }
}

/// What the rules need.
#[derive(Clone)]
pub struct Validator {
    client: Client,
    openshift: bool,
    policies: Option<Arc<crate::policy::PolicyStore>>,
    metrics: Option<WebhookMetrics>,
    /// Where the node leases and the maintenance history are.
    lease_namespace: String,
    /// What the process follows (the nodes, the NodeMaintenances, the
    /// leases, other tools' claims): read instead of a list per request
    /// once each watch has listed.
    watched: Option<Arc<crate::admission::Watched>>,
}

impl Validator {
    /// Detects OpenShift by the `config.openshift.io` API group.
    pub async fn new(client: Client) -> Self {
        let openshift = crate::admission::is_openshift(&client).await;
        Validator {
            client,
            openshift,
            policies: None,
            metrics: None,
            lease_namespace: crate::node_lease::DEFAULT_NAMESPACE.to_owned(),
            watched: None,
        }
    }

    /// Reads the cluster from `watched`'s caches (the caller follows the
    /// fleet and the NodeMaintenances for as long as the webhook serves),
    /// falling back to the API server while a watch has not listed.
    pub fn with_watched(mut self, watched: Arc<crate::admission::Watched>) -> Self {
        self.watched = Some(watched);
        self
    }

    /// The node `name`: the watch's when it shows it, else the API
    /// server's (a node created a moment ago is not refused for the
    /// watch's lag).
    async fn node(&self, name: &str) -> std::result::Result<Option<Node>, String> {
        if let Some(node) = self.watched.as_ref().and_then(|w| w.nodes.get(name)) {
            return Ok(Some(node));
        }
        Api::<Node>::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(|e| format!("could not check the node: {e}"))
    }

    /// Whether another NodeMaintenance than `nm` names its node. From the
    /// watch once it has listed, and once it shows as many maintenances as
    /// the API server has now (a one-item list says how many): a
    /// maintenance created a moment ago, which the watch has not shown
    /// yet, is waited for (at most [`CATCH_UP`]), so a second create for
    /// the same node right after the first is refused, as the Go
    /// operator's e2e suite expects. Listed otherwise.
    async fn node_taken(&self, nm: &NodeMaintenance) -> std::result::Result<bool, String> {
        let taken = |o: &NodeMaintenance| {
            o.spec.node_name == nm.spec.node_name && o.name_any() != nm.name_any()
        };
        let api = Api::<NodeMaintenance>::all(self.client.clone());
        if let Some(watched) = &self.watched {
            let one = api
                .list(&ListParams::default().limit(1))
                .await
                .map_err(|e| format!("could not list NodeMaintenances: {e}"))?;
            let exist = one.items.len() as u64
                + one.metadata.remaining_item_count.unwrap_or(0).max(0) as u64;
            let deadline = Instant::now() + CATCH_UP;
            // A watch that has not listed (or fails) is not waited for:
            // the list below answers at once.
            while let Some(all) = watched.maintenances.snapshot() {
                if all.iter().any(|o| taken(o)) {
                    return Ok(true);
                }
                if all.len() as u64 >= exist {
                    return Ok(false);
                }
                if Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
        let others = api
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("could not list NodeMaintenances: {e}"))?;
        Ok(others.items.iter().any(taken))
    }

    /// The fleet around `nm`: from the watches once they have listed, else
    /// listed.
    async fn around(&self, nm: &NodeMaintenance) -> crate::error::Result<crate::admission::Around> {
        if let Some(watched) = &self.watched
            && let Some(around) = crate::admission::from_watches(
                watched,
                &self.client,
                nm,
                self.openshift,
                &self.lease_namespace,
            )
            .await?
        {
            return Ok(around);
        }
        crate::admission::listed(&self.client, nm, self.openshift, &self.lease_namespace).await
    }

    /// Also refuses a NodeMaintenance whose
    /// `nodemaintenance.medik8s.io/policy` annotation names a policy the
    /// operator has not loaded (beyond the Go operator's rules: without
    /// this, such a maintenance would wait, doing nothing, until the policy
    /// appears).
    /// The namespace of the node leases and the maintenance history (the
    /// operator's `LEASE_NAMESPACE`).
    pub fn with_lease_namespace(mut self, namespace: &str) -> Self {
        self.lease_namespace = namespace.to_owned();
        self
    }

    pub fn with_policies(mut self, policies: Arc<crate::policy::PolicyStore>) -> Self {
        self.policies = Some(policies);
        self
    }

    /// Counts the webhook's requests in `metrics`.
    pub fn with_metrics(mut self, metrics: WebhookMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The access rules in force (policies.yaml's `access`; the defaults
    /// without the operator's policies).
    fn access(&self) -> crate::policy::access::Access {
        self.policies
            .as_ref()
            .map(|p| p.current().access().clone())
            .unwrap_or_default()
    }

    /// Validates a create by `who`; `Err(message)` refuses.
    pub(crate) async fn validate_create_by(
        &self,
        nm: &NodeMaintenance,
        who: &crate::policy::access::Requester,
    ) -> std::result::Result<(), String> {
        let access = self.access();
        if let Some(name) = annotated_policy(nm)
            && let Some(why) = access.annotation_refused(who, name)
        {
            return Err(why);
        }
        let node = self.node(&nm.spec.node_name).await?;
        if let Some(node) = &node
            && let Some(why) = access.node_refused(who, &nm.spec.node_name, node.labels())
        {
            return Err(why);
        }
        self.validate_create(nm).await
    }

    /// Validates a create whoever asks (the Go operator's rules and the
    /// policy's); `Err(message)` refuses.
    pub async fn validate_create(&self, nm: &NodeMaintenance) -> std::result::Result<(), String> {
        let node_name = &nm.spec.node_name;
        let Some(node) = self.node(node_name).await? else {
            return Err(messages::node_not_found(node_name));
        };
        if self.node_taken(nm).await? {
            return Err(messages::already_exists(node_name));
        }
        if let (Some(policies), Some(name)) = (
            &self.policies,
            nm.annotations().get(crate::policy::POLICY_ANNOTATION),
        ) {
            let set = policies.current();
            if !set.contains(name.trim()) {
                return Err(format!(
                    "invalid {} annotation: policy {:?} is not loaded (loaded: {})",
                    crate::policy::POLICY_ANNOTATION,
                    name.trim(),
                    set.names().join(", ")
                ));
            }
        }
        match self.denied(nm, &node).await? {
            Some(message) => Err(message),
            None => Ok(()),
        }
    }

    /// What the maintenance's policy says to it now: the message when its
    /// `admit` denies it (waiting is not refusing: the controller holds a
    /// waiting maintenance back). Without the operator's policies (a
    /// webhook on its own), the Go operator's etcd rule.
    async fn denied(
        &self,
        nm: &NodeMaintenance,
        node: &Node,
    ) -> std::result::Result<Option<String>, String> {
        let selected = match &self.policies {
            Some(p) => Some(
                p.current()
                    .select_for(nm, Some(node.labels()))
                    .map_err(|e| e.to_string())?,
            ),
            None => None,
        };
        if selected.is_none() && !(self.openshift && is_control_plane(node)) {
            return Ok(None);
        }
        let around = self
            .around(nm)
            .await
            .map_err(|e| format!("could not read the cluster for admission: {e}"))?;
        let Some(selected) = selected else {
            let allowed = around
                .fleet
                .etcd
                .as_ref()
                .is_none_or(crate::admission::etcd_can_lose_one);
            return Ok((!allowed).then(|| messages::etcd_quorum(&nm.spec.node_name)));
        };
        let record =
            crate::policy::convert::maintenance(nm, 1, k8s_openapi::jiff::Timestamp::now());
        match around.ask(&selected.policy, record).await {
            Ok(Some(crate::policy::Admission::Deny(message))) => Ok(Some(message)),
            Ok(_) => Ok(None),
            // The policy could not decide: the controller meets the same
            // error and reports it on the maintenance; refusing here would
            // hide it behind a webhook message.
            Err(e) => {
                tracing::warn!(error = %e, "the policy's admit failed; allowing the NodeMaintenance");
                Ok(None)
            }
        }
    }

    /// Validates an update by `who`: the Go operator's rule, and a policy
    /// annotation added or changed needs the same grant as at creation.
    pub(crate) fn validate_update_by(
        &self,
        old: &NodeMaintenance,
        new: &NodeMaintenance,
        who: &crate::policy::access::Requester,
    ) -> std::result::Result<(), String> {
        Self::validate_update(old, new)?;
        match annotated_policy(new) {
            Some(name) if annotated_policy(old) != Some(name) => {
                match self.access().annotation_refused(who, name) {
                    Some(why) => Err(why),
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    /// Validates an update; `Err(message)` refuses.
    pub(crate) fn validate_update(
        old: &NodeMaintenance,
        new: &NodeMaintenance,
    ) -> std::result::Result<(), String> {
        if old.spec.node_name != new.spec.node_name {
            return Err(messages::NODE_NAME_IMMUTABLE.to_owned());
        }
        Ok(())
    }

    /// The CRD deletion guard: the NodeMaintenance CRD (`name`) is not
    /// deleted while any NodeMaintenance exists, one being deleted
    /// included (its node is not restored yet). Read from the API server,
    /// not a cache: a deletion is rare, and a stale "none" would lose
    /// them.
    async fn crd_deletion(&self, name: &str) -> std::result::Result<(), String> {
        use kube::Resource;
        let ours = format!(
            "{}.{}",
            NodeMaintenance::plural(&()),
            NodeMaintenance::group(&())
        );
        if name != ours {
            return Ok(());
        }
        const SHOWN: u32 = 5;
        let some = Api::<NodeMaintenance>::all(self.client.clone())
            .list(&ListParams::default().limit(SHOWN))
            .await
            .map_err(|e| format!("could not check for NodeMaintenances: {e}"))?;
        if some.items.is_empty() {
            return Ok(());
        }
        let held: Vec<String> = some
            .items
            .iter()
            .map(|nm| format!("{} on node {}", nm.name_any(), nm.spec.node_name))
            .collect();
        let more = some
            .metadata
            .continue_
            .as_deref()
            .is_some_and(|c| !c.is_empty());
        Err(messages::crd_in_use(&held, more))
    }

    /// Answers one AdmissionReview body: the HTTP status and the body.
    ///
    /// The review is read with kube's admission types; the objects in it
    /// are read apart, so one that is not a NodeMaintenance is refused
    /// with a message (as controller-runtime answers) rather than taken
    /// for a malformed review.
    pub async fn review(&self, body: &[u8]) -> (StatusCode, Value) {
        let bad = |why: String| (StatusCode::BAD_REQUEST, error_body(&why));
        let mut raw: Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => return bad(format!("the body is not an AdmissionReview: {e}")),
        };
        let object = raw
            .pointer_mut("/request/object")
            .map(Value::take)
            .unwrap_or(Value::Null);
        let old_object = raw
            .pointer_mut("/request/oldObject")
            .map(Value::take)
            .unwrap_or(Value::Null);
        let review: AdmissionReview<DynamicObject> = match serde_json::from_value(raw) {
            Ok(r) => r,
            Err(e) => return bad(format!("the body is not an AdmissionReview: {e}")),
        };
        let request: AdmissionRequest<DynamicObject> = match review.try_into() {
            Ok(r) => r,
            Err(e) => return bad(format!("the AdmissionReview has no request: {e}")),
        };
        let parse = |v: &Value| {
            serde_json::from_value::<NodeMaintenance>(v.clone())
                .map_err(|e| format!("the object is not a NodeMaintenance: {e}"))
        };
        let who = crate::policy::access::Requester {
            username: request.user_info.username.clone().unwrap_or_default(),
            groups: request.user_info.groups.clone().unwrap_or_default(),
        };
        let crd_deletion = request.resource.group == "apiextensions.k8s.io"
            && request.resource.resource == "customresourcedefinitions";
        let verdict = match request.operation {
            Operation::Delete if crd_deletion => self.crd_deletion(&request.name).await,
            _ if crd_deletion => Ok(()),
            Operation::Create => match parse(&object) {
                Ok(nm) => self.validate_create_by(&nm, &who).await,
                Err(e) => Err(e),
            },
            Operation::Update => parse(&old_object)
                .and_then(|old| Ok((old, parse(&object)?)))
                .and_then(|(old, new)| self.validate_update_by(&old, &new, &who)),
            _ => Ok(()),
        };
        let mut response = AdmissionResponse::from(&request);
        // controller-runtime's `admission.Allowed`: status code 200, and
        // (as every metav1.Status it writes) an empty `metadata`.
        response.result.code = 200;
        response.result.metadata = Some(Default::default());
        if let Err(message) = verdict {
            // controller-runtime's `admission.Denied`: 403 Forbidden.
            response = response.deny(message);
            response.result.code = 403;
            response.result.reason = "Forbidden".into();
        }
        match serde_json::to_value(response.into_review()) {
            Ok(v) => (StatusCode::OK, v),
            Err(e) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                error_body(&format!("writing the answer: {e}")),
            ),
        }
    }
}

/// The policy a NodeMaintenance names with the annotation, if any.
fn annotated_policy(nm: &NodeMaintenance) -> Option<&str> {
    nm.annotations()
        .get(crate::policy::POLICY_ANNOTATION)
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
}

fn error_body(message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 400, "reason": "BadRequest", "message": message})
}

fn is_control_plane(node: &Node) -> bool {
    node.labels().keys().any(|k| {
        k == "node-role.kubernetes.io/master" || k == "node-role.kubernetes.io/control-plane"
    })
}

/// Serves the webhook over TLS on `listener` until dropped, under the
/// default [`ConnLimits`](crate::server::ConnLimits).
pub async fn serve(listener: TcpListener, cert_dir: &Path, validator: Validator) -> Result<()> {
    serve_with(
        listener,
        cert_dir,
        validator,
        crate::server::ConnLimits::default(),
    )
    .await
}

/// [`serve`] under given limits: the TLS handshake and the request headers
/// each have a timeout, and connections are capped.
pub async fn serve_with(
    listener: TcpListener,
    cert_dir: &Path,
    validator: Validator,
    limits: crate::server::ConnLimits,
) -> Result<()> {
    let config = crate::tls::tls_config(Arc::new(crate::tls::ReloadingCert::new(cert_dir)?))?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let budget = crate::server::BodyBudget::new(&limits);
    let handler: crate::server::Handler = Arc::new(move |req: Request<Incoming>| {
        let validator = validator.clone();
        let budget = budget.clone();
        Box::pin(async move { handle(&validator, &budget, req).await })
    });
    crate::server::serve_tls(listener, acceptor, handler, limits).await;
    Ok(())
}

async fn handle(
    validator: &Validator,
    budget: &crate::server::BodyBudget,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let started = Instant::now();
    let in_flight = validator
        .metrics
        .as_ref()
        .map(|m| m.in_flight.with_label_values(&[PATH]));
    if let Some(g) = &in_flight {
        g.inc();
    }
    let (code, body) = if req.uri().path() != PATH && req.uri().path() != CRD_GUARD_PATH {
        (
            StatusCode::NOT_FOUND,
            error_body(&format!("no webhook at {}", req.uri().path())),
        )
    } else if req.method() != hyper::Method::POST {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            error_body("the webhook takes POST"),
        )
    } else {
        match budget.read(req.into_body()).await {
            Ok(body) => validator.review(&body.bytes).await,
            Err(e) => (e.status(), error_body(&e.to_string())),
        }
    };
    if let Some(g) = &in_flight {
        g.dec();
    }
    if let Some(m) = &validator.metrics {
        m.answered(code.as_str(), started.elapsed().as_secs_f64());
    }
    Response::builder()
        .status(code)
        .header("Content-Type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(&body).unwrap_or_default(),
        )))
        .expect("valid response")
}
