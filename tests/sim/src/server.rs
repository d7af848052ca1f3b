//! The HTTP front: discovery, resource routes, watches, tables, faults.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, watch};

use crate::admission;
use crate::api::{self, DeleteOptions, ListOptions};
use crate::error::{ApiError, success_status};
use crate::patch::PatchType;
use crate::proto;
use crate::resources::{self, ResourceType};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::state::{AuditRecord, Sim};
use crate::store::{Change, ChangeKind};
use crate::tables;

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Largest request body accepted (the real server's limit is 3 MiB).
const MAX_BODY: usize = 3 << 20;

/// Serves (HTTPS with `tls`) until `stop` changes.
pub async fn serve(
    sim: Arc<Sim>,
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let sim = sim.clone();
        let stop = stop.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let sim = sim.clone();
                let stop = stop.clone();
                async move { Ok::<_, Infallible>(handle(sim, req, stop).await) }
            });
            let mut http = hyper::server::conn::http1::Builder::new();
            match tls {
                Some(acceptor) => {
                    let Ok(Ok(stream)) =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream))
                            .await
                    else {
                        return;
                    };
                    let _ = http
                        .keep_alive(true)
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                }
                None => {
                    let _ = http
                        .keep_alive(true)
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                }
            }
        });
    }
}

fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).boxed_unsync()
}

fn json_response(code: u16, v: &impl serde::Serialize) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("Content-Type", "application/json")
        .body(full(serde_json::to_vec(v).unwrap_or_default()))
        .expect("valid response")
}

/// The body types a client accepts (its `Accept` header).
#[derive(Debug, Clone, Copy)]
struct Accept {
    /// Kubernetes protobuf comes before any JSON in the list.
    prefer_protobuf: bool,
    /// JSON (or `*/*`) is in the list.
    json: bool,
}

impl Accept {
    fn of(req: &Request<Incoming>) -> Self {
        let Some(header) = req.headers().get("Accept").and_then(|a| a.to_str().ok()) else {
            return Accept {
                prefer_protobuf: false,
                json: true,
            };
        };
        let mut a = Accept {
            prefer_protobuf: false,
            json: false,
        };
        for media in header.split(',') {
            match media.split(';').next().unwrap_or_default().trim() {
                proto::MEDIA_TYPE if !a.json => a.prefer_protobuf = true,
                "application/json" | "application/yaml" | "*/*" | "application/*" | "" => {
                    a.json = true
                }
                _ => {}
            }
        }
        a
    }
}

/// Answers in the body type the client asked for: protobuf for the
/// built-in kinds when it prefers it, JSON otherwise, 406 when it accepts
/// only protobuf and the object has none (a custom resource).
struct Reply<'a> {
    sim: &'a Sim,
    accept: Accept,
}

impl Reply<'_> {
    fn send(&self, code: u16, v: &Value) -> Response<Body> {
        if self.accept.prefer_protobuf {
            match self.sim.proto.encode_object(v) {
                Ok(bytes) => {
                    return Response::builder()
                        .status(code)
                        .header("Content-Type", proto::MEDIA_TYPE)
                        .body(full(bytes))
                        .expect("valid response");
                }
                Err(_) if self.accept.json => {}
                Err(e) => {
                    return json_response(
                        406,
                        &ApiError {
                            code: 406,
                            reason: "NotAcceptable",
                            message: format!(
                                "only the following media types are accepted: application/json, application/yaml ({e})"
                            ),
                            details: None,
                            retry_after: None,
                        }
                        .to_status(),
                    );
                }
            }
        }
        json_response(code, v)
    }

    fn error(&self, e: &ApiError) -> Response<Body> {
        let mut r = self.send(e.code, &e.to_status());
        if let Some(secs) = e.retry_after {
            r.headers_mut().insert("Retry-After", secs.into());
        }
        r
    }
}

fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = json_response(e.code, &e.to_status());
    if let Some(secs) = e.retry_after {
        r.headers_mut().insert("Retry-After", secs.into());
    }
    r
}

fn query(req: &Request<Incoming>) -> HashMap<String, String> {
    req.uri()
        .query()
        .map(|q| {
            form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// What a resource path names.
struct Target {
    rt: ResourceType,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

enum Route {
    Version,
    OpenApiRoot,
    OpenApiGroupVersion(String, String),
    Health,
    ApiVersions,
    GroupList,
    Group(String),
    ResourceList(String, String),
    Resource(Box<Target>),
    NotFound,
}

fn route(sim: &Sim, path: &str) -> Route {
    let parts: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|p| !p.is_empty())
        .collect();
    let (group, version, rest) = match parts.as_slice() {
        ["version"] => return Route::Version,
        ["openapi", "v3"] => return Route::OpenApiRoot,
        ["openapi", "v3", "api", v] => {
            return Route::OpenApiGroupVersion(String::new(), (*v).to_owned());
        }
        ["openapi", "v3", "apis", g, v] => {
            return Route::OpenApiGroupVersion((*g).to_owned(), (*v).to_owned());
        }
        ["healthz" | "livez" | "readyz", ..] => return Route::Health,
        ["api"] => return Route::ApiVersions,
        ["apis"] => return Route::GroupList,
        ["apis", g] => return Route::Group((*g).to_owned()),
        ["api", "v1"] => return Route::ResourceList(String::new(), "v1".into()),
        ["apis", g, v] => return Route::ResourceList((*g).to_owned(), (*v).to_owned()),
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Route::NotFound,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some((*ns).to_owned()), tail),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(*n), None),
        [p, n, s] => (*p, Some(*n), Some(*s)),
        _ => return Route::NotFound,
    };
    let Some(rt) = sim.find_type(group, version, plural) else {
        return Route::NotFound;
    };
    if rt.namespaced != namespace.is_some() && !(rt.namespaced && name.is_none()) {
        return Route::NotFound;
    }
    Route::Resource(Box::new(Target {
        rt,
        namespace,
        name: name.map(str::to_owned),
        subresource: sub.map(str::to_owned),
    }))
}

fn wants_table(req: &Request<Incoming>) -> bool {
    req.headers()
        .get("Accept")
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

async fn read_body(req: Request<Incoming>) -> Result<(Bytes, String), ApiError> {
    let ct = req
        .headers()
        .get("Content-Type")
        .and_then(|c| c.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
    let limited = http_body_util::Limited::new(req.into_body(), MAX_BODY);
    let bytes = limited
        .collect()
        .await
        .map_err(|e| {
            if e.to_string().contains("length limit") {
                ApiError::bad_request(format!("request entity too large: limit is {MAX_BODY}"))
            } else {
                ApiError::bad_request(format!("reading the request body: {e}"))
            }
        })?
        .to_bytes();
    Ok((bytes, ct))
}

/// A request body as JSON: JSON, YAML, or Kubernetes protobuf (what
/// client-go sends for built-in kinds).
fn parse_body(sim: &Sim, bytes: &[u8], ct: &str) -> Result<Value, ApiError> {
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    if ct.starts_with(proto::MEDIA_TYPE) {
        return sim.proto.decode_object(bytes).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request was in an unknown format: {e}"
            ))
        });
    }
    if ct.contains("protobuf") || ct.contains("cbor") {
        return Err(ApiError::unsupported_media(ct));
    }
    if ct.contains("yaml") {
        return serde_saphyr::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "Object 'Kind' is missing in '{}': {e}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        ))
    })
}

fn verb_of(method: &Method, target: &Target, q: &HashMap<String, String>) -> &'static str {
    match (method.as_str(), target.name.is_some()) {
        ("GET", false) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", false) => "deletecollection",
        ("DELETE", true) => "delete",
        _ => "unknown",
    }
}

async fn handle(
    sim: Arc<Sim>,
    req: Request<Incoming>,
    stop: watch::Receiver<bool>,
) -> Response<Body> {
    let path = req.uri().path().to_owned();
    tracing::debug!(method = %req.method(), uri = %req.uri(), "request");
    match route(&sim, &path) {
        Route::Version => json_response(
            200,
            &json!({
                "major": "1", "minor": "32", "gitVersion": "v1.32.0-nmo-sim",
                "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23", "compiler": "gc",
                "platform": "linux/amd64",
            }),
        ),
        Route::Health => Response::new(full("ok")),
        Route::OpenApiRoot => json_response(200, &openapi_root(&sim)),
        Route::OpenApiGroupVersion(g, v) => {
            json_response(200, &openapi_group_version(&sim, &g, &v))
        }
        Route::ApiVersions => json_response(
            200,
            &json!({
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
            }),
        ),
        Route::GroupList => json_response(200, &group_list(&sim)),
        Route::Group(g) => match group_list(&sim)["groups"]
            .as_array()
            .and_then(|gs| gs.iter().find(|x| x["name"] == g.as_str()))
        {
            Some(group) => {
                let mut v = group.clone();
                v["kind"] = json!("APIGroup");
                v["apiVersion"] = json!("v1");
                json_response(200, &v)
            }
            None => not_found(&path),
        },
        Route::ResourceList(g, v) => {
            let list = resource_list(&sim, &g, &v);
            if list["resources"].as_array().is_none_or(|r| r.is_empty())
                && !(g.is_empty() && v == "v1")
            {
                return not_found(&path);
            }
            json_response(200, &list)
        }
        Route::NotFound => not_found(&path),
        Route::Resource(target) => resource_route(&sim, req, *target, stop).await,
    }
}

/// A request on a resource: authorized, audited, the faults injected,
/// then answered (and the answer's code audited).
async fn resource_route(
    sim: &Arc<Sim>,
    req: Request<Incoming>,
    target: Target,
    stop: watch::Receiver<bool>,
) -> Response<Body> {
    let q = query(&req);
    let reply = Reply {
        sim,
        accept: Accept::of(&req),
    };
    let verb = verb_of(req.method(), &target, &q);
    let resource = match &target.subresource {
        Some(s) => format!("{}/{}", target.rt.plural, s),
        None => target.rt.plural.clone(),
    };
    let (user, denied) = authorize(sim, &req, verb, &target, &resource);
    let recorded = audit_request(sim, &req, verb, &target, user, denied.is_some());
    let response = async {
        if let Some(e) = denied {
            return reply.error(&e);
        }
        if let Some(e) = injected_fault(sim, verb, &resource, &target).await {
            return reply.error(&e);
        }
        match resource_request(sim, &reply, req, target, q, verb, stop).await {
            Ok(r) => r,
            Err(e) => reply.error(&e),
        }
    }
    .await;
    let held = sim.answer_delay(verb, &resource);
    if !held.is_zero() {
        tokio::time::sleep(held).await;
    }
    if let Some(i) = recorded {
        let mut audit = sim.audit.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = audit.get_mut(i) {
            r.code = response.status().as_u16();
            r.answered = Some(std::time::Instant::now());
        }
    }
    response
}

/// Records the request in the audit log, when it is on: its index there.
fn audit_request(
    sim: &Sim,
    req: &Request<Incoming>,
    verb: &str,
    target: &Target,
    user: Option<crate::auth::User>,
    denied: bool,
) -> Option<usize> {
    if !sim.record_audit.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    let header = |h: &str| {
        req.headers()
            .get(h)
            .and_then(|u| u.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let mut audit = sim.audit.lock().unwrap_or_else(|p| p.into_inner());
    audit.push(AuditRecord {
        verb: verb.into(),
        group: target.rt.group.clone(),
        resource: target.rt.plural.clone(),
        subresource: target.subresource.clone().unwrap_or_default(),
        namespace: target.namespace.clone().unwrap_or_default(),
        name: target.name.clone().unwrap_or_default(),
        user_agent: header("User-Agent"),
        content_type: header("Content-Type"),
        query: req.uri().query().unwrap_or_default().to_owned(),
        user: user.map(|u| u.name).unwrap_or_default(),
        denied,
        code: 0,
        at: std::time::Instant::now(),
        answered: None,
    });
    Some(audit.len() - 1)
}

/// The latency and the error the test injected for this verb and
/// resource, if any (the latency is waited out here).
async fn injected_fault(
    sim: &Sim,
    verb: &str,
    resource: &str,
    target: &Target,
) -> Option<ApiError> {
    let (latency, fault) = sim.fault_for(verb, resource);
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    Some(match fault? {
        409 => ApiError::stale(&target.rt, target.name.as_deref().unwrap_or_default()),
        429 => ApiError::too_many_requests(
            "injected fault: too many requests, please try again later",
            Vec::new(),
            Some(1),
        ),
        503 => ApiError::unavailable("injected fault: the server is unavailable"),
        403 => ApiError::forbidden("injected fault: forbidden"),
        _ => ApiError::internal("injected fault"),
    })
}

/// Who sent a resource request, and the refusal if authorization is on and
/// the request has no known bearer token (401) or RBAC does not allow it
/// (403, in the real server's words).
fn authorize(
    sim: &Sim,
    req: &Request<Incoming>,
    verb: &str,
    target: &Target,
    resource: &str,
) -> (Option<crate::auth::User>, Option<ApiError>) {
    let enforcing = sim.authorization.load(std::sync::atomic::Ordering::Relaxed);
    // Who it is matters only to RBAC and to the audit log: without
    // either, the store (every request's shared lock) is left alone.
    if !enforcing && !sim.record_audit.load(std::sync::atomic::Ordering::Relaxed) {
        return (None, None);
    }
    let store = sim.store();
    let user = request_user(&store, req);
    if !enforcing {
        return (user, None);
    }
    let Some(who) = user.as_ref() else {
        return (None, Some(ApiError::unauthorized()));
    };
    let access = crate::auth::Access {
        verb: verb.into(),
        group: target.rt.group.clone(),
        resource: resource.into(),
        namespace: target.namespace.clone().unwrap_or_default(),
        name: target.name.clone().unwrap_or_default(),
        path: None,
    };
    if crate::auth::authorize(&store, who, &access) {
        return (user, None);
    }
    let details = json!({"name": access.name, "group": access.group,
        "kind": resource.split('/').next().unwrap_or_default()});
    let denial = ApiError::forbidden(access.denial(who)).with_details(details);
    (user, Some(denial))
}

/// Who a request acts as (its bearer token, or whom it impersonates).
fn request_user(store: &crate::store::Store, req: &Request<Incoming>) -> Option<crate::auth::User> {
    let header = |h: &str| req.headers().get(h).and_then(|v| v.to_str().ok());
    let groups = req
        .headers()
        .get_all("Impersonate-Group")
        .iter()
        .filter_map(|g| g.to_str().ok())
        .map(str::to_owned)
        .collect();
    crate::auth::request_user(
        store,
        header("Authorization"),
        header("Impersonate-User"),
        groups,
    )
}

fn not_found(path: &str) -> Response<Body> {
    let e = ApiError {
        code: 404,
        reason: "NotFound",
        message: "the server could not find the requested resource".into(),
        details: Some(
            json!({"causes": [{"reason": "UnexpectedServerResponse", "message": format!("404 page not found: {path}")}]}),
        ),
        retry_after: None,
    };
    error_response(&e)
}

/// The OpenAPI v3 index. kubectl reads it to learn that the server does
/// field validation itself (so it skips client-side schema validation).
fn openapi_root(sim: &Sim) -> Value {
    let mut paths = serde_json::Map::new();
    let mut gvs: Vec<(String, String)> = sim
        .all_types()
        .iter()
        .map(|t| (t.group.clone(), t.version.clone()))
        .collect();
    gvs.sort();
    gvs.dedup();
    for (g, v) in gvs {
        let key = if g.is_empty() {
            format!("api/{v}")
        } else {
            format!("apis/{g}/{v}")
        };
        let kinds: Vec<String> = sim
            .all_types()
            .iter()
            .filter(|t| t.group == g && t.version == v)
            .map(|t| t.plural.clone())
            .collect();
        let hash = format!(
            "{:016X}",
            kinds
                .join(",")
                .bytes()
                .fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64)
                    .wrapping_mul(0x100000001b3))
        );
        paths.insert(
            key.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}),
        );
    }
    json!({"paths": paths})
}

/// A group-version's OpenAPI v3 document: the PATCH operation of each
/// resource with its group-version-kind and the `fieldValidation` parameter.
fn openapi_group_version(sim: &Sim, group: &str, version: &str) -> Value {
    let mut paths = serde_json::Map::new();
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    for t in sim
        .all_types()
        .iter()
        .filter(|t| t.group == group && t.version == version)
    {
        let path = if t.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", t.plural)
        } else {
            format!("{prefix}/{}/{{name}}", t.plural)
        };
        let gvk = json!({"group": t.group, "version": t.version, "kind": t.kind});
        let params = json!([
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        ]);
        let op = |action: &str| {
            json!({
                "x-kubernetes-group-version-kind": gvk,
                "x-kubernetes-action": action,
                "parameters": params,
                "responses": {"200": {"description": "OK"}},
            })
        };
        paths.insert(path, json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}));
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": crate::openapi::components(group, version, &sim.all_types())},
    })
}

fn group_list(sim: &Sim) -> Value {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for t in sim.all_types() {
        if t.group.is_empty() {
            continue;
        }
        match groups.iter_mut().find(|(g, _)| *g == t.group) {
            Some((_, vs)) => {
                if !vs.contains(&t.version) {
                    vs.push(t.version.clone());
                }
            }
            None => groups.push((t.group.clone(), vec![t.version.clone()])),
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(g, vs)| {
            let versions: Vec<Value> = vs
                .iter()
                .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                .collect();
            json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource_list(sim: &Sim, group: &str, version: &str) -> Value {
    let mut resources_out = Vec::new();
    for t in sim
        .all_types()
        .iter()
        .filter(|t| t.group == group && t.version == version)
    {
        resources_out.push(resources::api_resource(t));
        resources_out.extend(resources::api_subresources(t));
    }
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources_out})
}

fn list_options(q: &HashMap<String, String>) -> Result<ListOptions, ApiError> {
    Ok(ListOptions {
        labels: LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?,
        fields: FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str))
            .map_err(ApiError::bad_request)?,
        limit: q.get("limit").and_then(|l| l.parse().ok()),
        continue_token: q.get("continue").filter(|c| !c.is_empty()).cloned(),
    })
}

fn list_kind(rt: &ResourceType) -> String {
    format!("{}List", rt.kind)
}

/// One request on a resource, as the verb handlers read it.
struct Call<'a> {
    sim: &'a Arc<Sim>,
    reply: &'a Reply<'a>,
    t: Target,
    q: HashMap<String, String>,
    /// `dryRun=All`.
    dry_run: bool,
    /// Who asks, for a webhook's `userInfo`.
    requester: crate::auth::User,
    /// A server-side table is asked for.
    table: bool,
    /// A table's `includeObject`.
    include: String,
}

impl Call<'_> {
    fn ns(&self) -> Option<&str> {
        self.t.namespace.as_deref()
    }

    fn name(&self) -> &str {
        self.t.name.as_deref().unwrap_or_default()
    }

    fn sub(&self) -> Option<&str> {
        self.t.subresource.as_deref()
    }

    /// Asks the validating webhooks about a write (`candidate`, as it
    /// would be stored), unless there are none or it is a subresource's.
    async fn admit(
        &self,
        operation: &'static str,
        name: &str,
        candidate: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        admission::validate(
            self.sim,
            &admission::Attempt {
                rt: &self.t.rt,
                operation,
                namespace: self.ns(),
                name,
                object: candidate,
                old_object: old,
                dry_run: self.dry_run,
                user: &self.requester,
            },
        )
        .await
    }
}

/// A request on a resource (or one of its subresources): the
/// subresources with handlers of their own, then one handler per verb.
async fn resource_request(
    sim: &Arc<Sim>,
    reply: &Reply<'_>,
    req: Request<Incoming>,
    t: Target,
    q: HashMap<String, String>,
    verb: &str,
    stop: watch::Receiver<bool>,
) -> Result<Response<Body>, ApiError> {
    let dry_run = q.get("dryRun").is_some_and(|d| d == "All");
    // Who asks, for a webhook's `userInfo`: the token's user, or the
    // admin a kubeconfig without one stands for.
    let requester = if admission::has_webhooks(sim) {
        request_user(&sim.store(), &req).unwrap_or_else(crate::auth::admin)
    } else {
        crate::auth::admin()
    };
    let table = wants_table(&req);
    let include = q
        .get("includeObject")
        .cloned()
        .unwrap_or_else(|| "Metadata".into());
    let call = Call {
        sim,
        reply,
        t,
        q,
        dry_run,
        requester,
        table,
        include,
    };
    let (rt, ns, name) = (&call.t.rt, call.ns(), call.name());
    match call.sub() {
        Some("scale") => {
            return scale_request(&call, req, verb).await;
        }
        Some("log") if rt.group.is_empty() && rt.plural == "pods" => {
            if verb != "get" {
                return Err(ApiError::method_not_allowed("pods/log supports get only"));
            }
            return pod_log(sim, rt, ns.unwrap_or_default(), name, &call.q, stop);
        }
        Some("token") if rt.group.is_empty() && rt.plural == "serviceaccounts" => {
            return token_request(sim, reply, req, ns.unwrap_or_default(), name, verb).await;
        }
        None | Some("eviction") => {}
        Some("status") if rt.status_subresource => {}
        Some(other) => return Err(ApiError::not_found(rt, &format!("{name}/{other}"))),
    }
    match verb {
        "watch" => {
            let body = WatchBody::choose(sim, &call.t.rt, reply.accept, table);
            watch_response(&call, body, sim.faults().drop_watches_after, stop)
        }
        "list" => list(&call),
        "get" => get(&call),
        "create" if call.sub() == Some("eviction") => evict(&call, req).await,
        "create" if REVIEWS.contains(&call.t.rt.plural.as_str()) => review(&call, req).await,
        "create" => create(&call, req).await,
        "update" => update(&call, req).await,
        "patch" => patch(&call, req).await,
        "delete" => delete(&call, req).await,
        "deletecollection" => delete_collection(&call),
        _ => Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        )),
    }
}

/// The kinds that answer a create without storing it.
const REVIEWS: &[&str] = &[
    "selfsubjectreviews",
    "selfsubjectaccessreviews",
    "tokenreviews",
    "subjectaccessreviews",
];

fn list(call: &Call<'_>) -> Result<Response<Body>, ApiError> {
    let (sim, reply, rt) = (call.sim, call.reply, &call.t.rt);
    let opts = list_options(&call.q)?;
    let res = sim.list(rt, call.ns(), &opts)?;
    let mut meta = json!({"resourceVersion": res.resource_version.to_string()});
    if let Some(c) = &res.continue_token {
        meta["continue"] = json!(c);
        meta["remainingItemCount"] = json!(res.remaining.unwrap_or(0));
    }
    if !call.table && !reply.accept.prefer_protobuf {
        // JSON, written from the stored objects as they are.
        #[derive(serde::Serialize)]
        #[serde(rename_all = "camelCase")]
        struct List<'a> {
            kind: String,
            api_version: String,
            metadata: Value,
            items: Vec<api::Presented<'a>>,
        }
        let list = List {
            kind: list_kind(rt),
            api_version: rt.api_version(),
            metadata: meta,
            items: res.items.iter().map(|o| api::presented(rt, o)).collect(),
        };
        return Ok(json_response(200, &list));
    }
    let items: Vec<Value> = res.items.iter().map(|o| api::present(rt, o)).collect();
    if call.table {
        let table = tables::table(
            rt,
            &items,
            res.resource_version,
            res.continue_token.as_deref(),
            &call.include,
            true,
        );
        return Ok(reply.send(200, &table));
    }
    Ok(reply.send(
        200,
        &json!({"kind": list_kind(rt), "apiVersion": rt.api_version(), "metadata": meta, "items": items}),
    ))
}

fn get(call: &Call<'_>) -> Result<Response<Body>, ApiError> {
    let obj = call.sim.get(&call.t.rt, call.ns(), call.name())?;
    if call.table {
        let rv = obj["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let table = tables::table(&call.t.rt, &[obj], rv, None, &call.include, true);
        return Ok(call.reply.send(200, &table));
    }
    Ok(call.reply.send(200, &obj))
}

/// A pod's `eviction` subresource.
async fn evict(call: &Call<'_>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let rt = &call.t.rt;
    if !(rt.group.is_empty() && rt.plural == "pods") {
        return Err(ApiError::not_found(rt, call.name()));
    }
    let (bytes, ct) = read_body(req).await?;
    let body = parse_body(call.sim, &bytes, &ct)?;
    let status = call
        .sim
        .evict(call.ns().unwrap_or_default(), call.name(), &body)?;
    Ok(call.reply.send(201, &status))
}

/// The reviews: answered, never stored.
async fn review(call: &Call<'_>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let (sim, rt) = (call.sim, &call.t.rt);
    // Without a token (authorization off) the caller is the admin.
    let user = request_user(&sim.store(), &req).unwrap_or_else(crate::auth::admin);
    if rt.plural == "selfsubjectreviews" {
        return Ok(call.reply.send(
            201,
            &json!({"apiVersion": rt.api_version(), "kind": rt.kind, "metadata": {},
                "status": {"userInfo": {"username": user.name, "groups": user.groups}}}),
        ));
    }
    let (bytes, ct) = read_body(req).await?;
    let mut body = parse_body(sim, &bytes, &ct)?;
    body["apiVersion"] = json!(rt.api_version());
    body["kind"] = json!(rt.kind);
    let store = sim.store();
    let answer = match rt.plural.as_str() {
        "selfsubjectaccessreviews" => crate::auth::self_subject_access_review(&store, &user, body),
        "tokenreviews" => crate::auth::token_review(&store, body),
        _ => crate::auth::subject_access_review(&store, body),
    };
    Ok(call.reply.send(201, &answer))
}

async fn create(call: &Call<'_>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let (sim, rt, ns) = (call.sim, &call.t.rt, call.ns());
    let (bytes, ct) = read_body(req).await?;
    let body = parse_body(sim, &bytes, &ct)?;
    if admission::has_webhooks(sim) {
        let candidate = sim.create(rt, ns, body.clone(), true)?;
        let name = candidate["metadata"]["name"].as_str().unwrap_or_default();
        call.admit("CREATE", name, &candidate, None).await?;
    }
    let obj = sim.create(rt, ns, body, call.dry_run)?;
    Ok(call.reply.send(201, &obj))
}

async fn update(call: &Call<'_>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let (sim, rt, ns, name, sub) = (call.sim, &call.t.rt, call.ns(), call.name(), call.sub());
    let (bytes, ct) = read_body(req).await?;
    let body = parse_body(sim, &bytes, &ct)?;
    if sub.is_none() && admission::has_webhooks(sim) {
        let old = sim.get(rt, ns, name)?;
        let candidate = sim.update(rt, ns, name, body.clone(), sub, true)?;
        call.admit("UPDATE", name, &candidate, Some(&old)).await?;
    }
    let updated = sim.update(rt, ns, name, body, sub, call.dry_run)?;
    Ok(call.reply.send(200, &updated))
}

async fn patch(call: &Call<'_>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let (sim, rt, ns, name, sub) = (call.sim, &call.t.rt, call.ns(), call.name(), call.sub());
    let (bytes, ct) = read_body(req).await?;
    let kind = PatchType::from_content_type(&ct).ok_or_else(|| ApiError::unsupported_media(&ct))?;
    let format = if kind == PatchType::Apply {
        "yaml"
    } else {
        "json"
    };
    let patch = parse_body(sim, &bytes, format)?;
    if sub.is_none() && admission::has_webhooks(sim) {
        let old = sim.get(rt, ns, name).ok();
        let candidate = sim.patch(rt, ns, name, kind, &patch, sub, true)?;
        let operation = if old.is_some() { "UPDATE" } else { "CREATE" };
        call.admit(operation, name, &candidate, old.as_ref())
            .await?;
    }
    let patched = sim.patch(rt, ns, name, kind, &patch, sub, call.dry_run)?;
    Ok(call.reply.send(200, &patched))
}

async fn delete(call: &Call<'_>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let (bytes, ct) = read_body(req).await?;
    let body = parse_body(call.sim, &bytes, &ct)?;
    let mut opts = DeleteOptions::from_body(&body);
    if let Some(g) = call
        .q
        .get("gracePeriodSeconds")
        .and_then(|g| g.parse().ok())
    {
        opts.grace_period_seconds = Some(g);
    }
    if let Some(p) = call.q.get("propagationPolicy") {
        opts.propagation = Some(p.clone());
    }
    opts.dry_run |= call.dry_run;
    let obj = call.sim.delete(&call.t.rt, call.ns(), call.name(), &opts)?;
    Ok(call.reply.send(200, &obj))
}

fn delete_collection(call: &Call<'_>) -> Result<Response<Body>, ApiError> {
    let opts = list_options(&call.q)?;
    let res = call.sim.list(&call.t.rt, call.ns(), &opts)?;
    for o in &res.items {
        let n = o["metadata"]["name"].as_str().unwrap_or_default();
        let ons = o["metadata"]["namespace"].as_str();
        let _ = call.sim.delete(
            &call.t.rt,
            ons,
            n,
            &DeleteOptions {
                dry_run: call.dry_run,
                ..Default::default()
            },
        );
    }
    Ok(call.reply.send(200, &success_status(None)))
}

/// `pods/log` (`kubectl logs`): a container's lines, with `container`,
/// `tailLines`, `sinceSeconds`, `limitBytes`, `timestamps` and `follow`
/// (streamed until the pod is gone or has finished).
fn pod_log(
    sim: &Arc<Sim>,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    q: &HashMap<String, String>,
    mut stop: watch::Receiver<bool>,
) -> Result<Response<Body>, ApiError> {
    let flag = |k: &str| q.get(k).is_some_and(|v| v == "true" || v == "1");
    let number = |k: &str| -> Result<Option<u64>, ApiError> {
        q.get(k)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| ApiError::bad_request(format!("{k}: invalid value {v:?}")))
            })
            .transpose()
    };
    let opts = crate::logs::LogOptions {
        container: q.get("container").cloned(),
        follow: flag("follow"),
        tail_lines: number("tailLines")?.map(|n| n as usize),
        limit_bytes: number("limitBytes")?.map(|n| n as usize),
        since_seconds: number("sinceSeconds")?,
        timestamps: flag("timestamps"),
    };
    let pod = sim.get(rt, Some(ns), name)?;
    let (container, started) = api::log_container(&pod, opts.container.as_deref())?;
    let uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if !started && sim.logs.len(&uid, &container) == 0 {
        return Err(ApiError::bad_request(format!(
            "container \"{container}\" in pod \"{name}\" is waiting to start: ContainerCreating"
        )));
    }
    let limit = opts.limit_bytes.unwrap_or(usize::MAX);
    let mut sent = 0usize;
    let mut take = move |text: String| -> Option<Bytes> {
        if sent >= limit {
            return None;
        }
        let room = limit - sent;
        let text = if text.len() > room {
            text.as_bytes()[..room].to_vec()
        } else {
            text.into_bytes()
        };
        sent += text.len();
        Some(Bytes::from(text))
    };
    let first: Vec<Bytes> = opts
        .select(sim.logs.read(&uid, &container, 0))
        .iter()
        .filter_map(|l| take(opts.render(l)))
        .collect();
    let text_plain = |body: Body| {
        Response::builder()
            .status(200)
            .header("Content-Type", "text/plain")
            .body(body)
            .expect("valid response")
    };
    if !opts.follow {
        return Ok(text_plain(full(first.concat())));
    }
    let (tx, out) = mpsc::channel::<Bytes>(64);
    let sim = sim.clone();
    let rt = rt.clone();
    let ns = ns.to_owned();
    let name = name.to_owned();
    tokio::spawn(async move {
        let mut next = sim.logs.len(&uid, &container);
        for b in first {
            if tx.send(b).await.is_err() {
                return;
            }
        }
        loop {
            let written = sim.logs.written.notified();
            let lines = sim.logs.read(&uid, &container, next);
            next = next.max(sim.logs.len(&uid, &container).min(next + lines.len()));
            for l in &lines {
                let Some(b) = take(opts.render(l)) else {
                    return;
                };
                if tx.send(b).await.is_err() {
                    return;
                }
            }
            // The container is done when its pod is gone or has finished.
            let done = sim.get(&rt, Some(&ns), &name).map_or(true, |p| {
                p["metadata"]["uid"].as_str() != Some(uid.as_str())
                    || matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
            });
            if done && lines.is_empty() {
                return;
            }
            tokio::select! {
                _ = written => {}
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                _ = stop.changed() => return,
            }
        }
    });
    let stream = futures::stream::unfold(out, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Ok(text_plain(BodyExt::boxed_unsync(StreamBody::new(
        stream.boxed(),
    ))))
}

/// `serviceaccounts/token` (`kubectl create token NAME`): a bearer token
/// that authenticates as the ServiceAccount. Tokens here are not JWTs:
/// `serviceaccount:<namespace>:<name>`.
async fn token_request(
    sim: &Sim,
    reply: &Reply<'_>,
    req: Request<Incoming>,
    ns: &str,
    name: &str,
    verb: &str,
) -> Result<Response<Body>, ApiError> {
    if verb != "create" {
        return Err(ApiError::method_not_allowed(
            "serviceaccounts/token supports create only",
        ));
    }
    let rt = sim
        .find_type("", "v1", "serviceaccounts")
        .ok_or_else(|| ApiError::internal("no serviceaccounts type"))?;
    sim.get(&rt, Some(ns), name)?;
    let (bytes, ct) = read_body(req).await?;
    let mut body = parse_body(sim, &bytes, &ct)?;
    if !body.is_object() {
        body = json!({});
    }
    let seconds = body["spec"]["expirationSeconds"].as_i64().unwrap_or(3600);
    let expires = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(seconds.clamp(600, 1 << 32)))
        .unwrap_or(jiff::Timestamp::MAX);
    body["apiVersion"] = json!("authentication.k8s.io/v1");
    body["kind"] = json!("TokenRequest");
    body["metadata"] = json!({"name": name, "namespace": ns});
    body["spec"]["expirationSeconds"] = json!(seconds);
    body["status"] = json!({
        "token": format!("serviceaccount:{ns}:{name}"),
        "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    });
    Ok(reply.send(201, &body))
}

fn has_scale(rt: &ResourceType) -> bool {
    rt.group == "apps"
        && matches!(
            rt.plural.as_str(),
            "deployments" | "replicasets" | "statefulsets"
        )
}

/// The `autoscaling/v1` Scale view of an object.
fn scale_of(obj: &Value) -> Value {
    let selector = crate::selectors::to_string(&obj["spec"]["selector"]["matchLabels"]);
    json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {
            "name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"],
            "uid": obj["metadata"]["uid"], "resourceVersion": obj["metadata"]["resourceVersion"],
            "creationTimestamp": obj["metadata"]["creationTimestamp"],
        },
        "spec": {"replicas": obj["spec"]["replicas"]},
        "status": {"replicas": obj["status"]["replicas"].as_i64().unwrap_or(0), "selector": selector},
    })
}

/// The `scale` subresource (kubectl scale).
async fn scale_request(
    call: &Call<'_>,
    req: Request<Incoming>,
    verb: &str,
) -> Result<Response<Body>, ApiError> {
    let (sim, reply, rt) = (call.sim, call.reply, &call.t.rt);
    let (ns, name, dry_run) = (call.ns(), call.name(), call.dry_run);
    if !has_scale(rt) {
        return Err(ApiError::not_found(rt, &format!("{name}/scale")));
    }
    let current = scale_of(&sim.get(rt, ns, name)?);
    let wanted = match verb {
        "get" => return Ok(reply.send(200, &current)),
        "update" => {
            let (bytes, ct) = read_body(req).await?;
            parse_body(sim, &bytes, &ct)?
        }
        "patch" => {
            let (bytes, ct) = read_body(req).await?;
            let kind = PatchType::from_content_type(&ct)
                .ok_or_else(|| ApiError::unsupported_media(&ct))?;
            let p = parse_body(sim, &bytes, "json")?;
            let mut scale = current.clone();
            match kind {
                PatchType::Json => {
                    crate::patch::json_patch(&mut scale, &p).map_err(ApiError::bad_request)?
                }
                PatchType::Strategic => crate::patch::strategic_merge(
                    &mut scale,
                    &p,
                    &sim.proto,
                    sim.proto.message_for("autoscaling/v1", "Scale"),
                ),
                PatchType::Merge | PatchType::Apply => crate::patch::merge_patch(&mut scale, &p),
            }
            scale
        }
        _ => {
            return Err(ApiError::method_not_allowed(
                "scale supports get, update and patch",
            ));
        }
    };
    let replicas = wanted["spec"]["replicas"]
        .as_i64()
        .filter(|r| *r >= 0)
        .ok_or_else(|| {
            ApiError::invalid(
                rt,
                name,
                &[(
                    "spec.replicas".into(),
                    "Invalid value: must be greater than or equal to 0".into(),
                )],
            )
        })?;
    let updated = sim.patch(
        rt,
        ns,
        name,
        PatchType::Merge,
        &json!({"spec": {"replicas": replicas}}),
        None,
        dry_run,
    )?;
    Ok(reply.send(200, &scale_of(&updated)))
}

/// Which watch event, if any, a change is for this watcher.
fn watch_event<'a>(
    c: &'a Change,
    ns: Option<&str>,
    labels: &LabelSelector,
    fields: &FieldSelector,
    rt: &ResourceType,
) -> Option<(&'static str, &'a Value)> {
    let in_ns = |o: &Value| ns.is_none_or(|n| o["metadata"]["namespace"].as_str() == Some(n));
    let sel = |o: &Value| in_ns(o) && api::matches(&api::present_ref(rt, o), labels, fields);
    let now = sel(&c.object);
    let before = c.old.as_ref().is_some_and(|o| sel(o));
    let kind = match c.kind {
        ChangeKind::Deleted if before => "DELETED",
        ChangeKind::Deleted => return None,
        _ if now && before => "MODIFIED",
        _ if now => "ADDED",
        ChangeKind::Modified if before => "DELETED",
        _ => return None,
    };
    Some((kind, &c.object))
}

/// How a watch's events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WatchBody {
    /// One JSON event per line.
    Json,
    /// One JSON event per line, each object a Table row.
    Table,
    /// Length-prefixed protobuf `WatchEvent` frames.
    Protobuf,
}

impl WatchBody {
    fn choose(sim: &Sim, rt: &ResourceType, accept: Accept, table: bool) -> Self {
        if table {
            WatchBody::Table
        } else if accept.prefer_protobuf && sim.proto.supports(&rt.api_version(), &rt.kind) {
            WatchBody::Protobuf
        } else {
            WatchBody::Json
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            WatchBody::Protobuf => proto::WATCH_MEDIA_TYPE,
            WatchBody::Json | WatchBody::Table => "application/json",
        }
    }

    /// One event as this body writes it.
    fn event(self, sim: &Sim, kind: &str, object: &Value) -> Bytes {
        if self == WatchBody::Protobuf
            && let Ok(frame) = sim.proto.encode_watch_event(kind, object)
        {
            return Bytes::from(frame);
        }
        json_line(kind, object)
    }
}

/// A watch: the objects as they are (or the changes since the asked
/// resourceVersion), then every change, until the client goes, the
/// timeout or an injected drop (`drop_after`) ends it, or the server stops.
fn watch_response(
    call: &Call<'_>,
    body_type: WatchBody,
    drop_after: Option<Duration>,
    mut stop: watch::Receiver<bool>,
) -> Result<Response<Body>, ApiError> {
    let (sim, rt, ns, q) = (
        call.sim.clone(),
        call.t.rt.clone(),
        call.t.namespace.clone(),
        &call.q,
    );
    let include = call.include.clone();
    let opts = list_options(q)?;
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|b| b == "true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    let rv: Option<u64> = q
        .get("resourceVersion")
        .and_then(|r| r.parse().ok())
        .filter(|r| *r > 0);
    // A watch of one node's pods follows that node's changes only.
    let node = (rt.storage == "pods")
        .then(|| opts.fields.pinned("spec.nodeName").map(str::to_owned))
        .flatten();
    let (initial, backlog, mut rx, start_rv) = {
        let mut store = sim.store();
        match rv {
            Some(rv) => match store.subscribe_from(rv, node.as_deref()) {
                Some((backlog, rx)) => (Vec::new(), backlog, rx, rv),
                None => return Ok(gone(&sim, body_type, rv, store.rv())),
            },
            None => {
                let rx = store.receiver(node.as_deref());
                let ns_ref = if rt.namespaced { ns.as_deref() } else { None };
                let items: Vec<Arc<Value>> = store
                    .list(&rt.storage, ns_ref)
                    .into_iter()
                    .filter(|o| api::matches(&api::present_ref(&rt, o), &opts.labels, &opts.fields))
                    .collect();
                (items, Vec::new(), rx, store.rv())
            }
        }
    };
    let (tx, out) = mpsc::channel::<Bytes>(256);
    tokio::spawn(async move {
        let render = |kind: &str, obj: &Value, first: &mut bool| {
            render(&sim, &rt, body_type, &include, kind, obj, first)
        };
        let mut first = true;
        let mut last_rv = start_rv;
        let ns = if rt.namespaced { ns } else { None };
        for obj in initial {
            if tx.send(render("ADDED", &obj, &mut first)).await.is_err() {
                return;
            }
        }
        let deadline = [timeout, drop_after].into_iter().flatten().min();
        let sleep = tokio::time::sleep(deadline.unwrap_or(Duration::from_secs(365 * 86400)));
        tokio::pin!(sleep);
        let mut bookmark = tokio::time::interval(Duration::from_secs(1));
        let handle_change = |c: &Change, first: &mut bool| -> Option<Bytes> {
            if c.storage != rt.storage {
                return None;
            }
            let (kind, obj) = watch_event(c, ns.as_deref(), &opts.labels, &opts.fields, &rt)?;
            Some(render(kind, obj, first))
        };
        for c in backlog {
            last_rv = c.rv;
            if let Some(line) = handle_change(&c, &mut first)
                && tx.send(line).await.is_err()
            {
                return;
            }
        }
        loop {
            tokio::select! {
                _ = &mut sleep => return,
                _ = stop.changed() => return,
                _ = bookmark.tick(), if bookmarks && body_type != WatchBody::Table => {
                    let object = json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": {"resourceVersion": last_rv.to_string()}});
                    if tx.send(body_type.event(&sim, "BOOKMARK", &object)).await.is_err() {
                        return;
                    }
                }
                msg = rx.recv() => match msg {
                    Ok(c) => {
                        if c.rv <= last_rv {
                            continue;
                        }
                        last_rv = c.rv;
                        if let Some(line) = handle_change(&c, &mut first)
                            && tx.send(line).await.is_err() {
                                return;
                            }
                    }
                    // Too slow to keep up: end the watch; the client re-lists.
                    Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    });
    Ok(streamed(out, body_type))
}

/// A watch from a resourceVersion the server no longer has: one ERROR
/// event (410 Gone), as the real server answers.
fn gone(sim: &Sim, body_type: WatchBody, rv: u64, now: u64) -> Response<Body> {
    let status = ApiError::gone(format!("too old resource version: {rv} ({now})")).to_status();
    let mut resp = Response::new(full(body_type.event(sim, "ERROR", &status)));
    resp.headers_mut().insert(
        "Content-Type",
        body_type.content_type().parse().expect("valid"),
    );
    resp
}

/// A chunked response of what `out` receives.
fn streamed(out: mpsc::Receiver<Bytes>, body_type: WatchBody) -> Response<Body> {
    let stream = futures::stream::unfold(out, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let body = BodyExt::boxed_unsync(StreamBody::new(stream.boxed()));
    Response::builder()
        .status(StatusCode::OK)
        .header("Content-Type", body_type.content_type())
        .header("Transfer-Encoding", "chunked")
        .body(body)
        .expect("valid response")
}

/// One watch event about a stored object.
fn render(
    sim: &Sim,
    rt: &ResourceType,
    body_type: WatchBody,
    include: &str,
    kind: &str,
    stored: &Value,
    first: &mut bool,
) -> Bytes {
    match body_type {
        WatchBody::Table => {
            let obj = api::present(rt, stored);
            let rv = obj["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            let t = tables::table(rt, std::slice::from_ref(&obj), rv, None, include, *first);
            *first = false;
            body_type.event(sim, kind, &t)
        }
        WatchBody::Protobuf => body_type.event(sim, kind, &api::present(rt, stored)),
        WatchBody::Json => json_line(kind, &api::presented(rt, stored)),
    }
}

/// A JSON watch event line.
fn json_line(kind: &str, object: &impl serde::Serialize) -> Bytes {
    #[derive(serde::Serialize)]
    struct Line<'a, T> {
        #[serde(rename = "type")]
        kind: &'a str,
        object: T,
    }
    let mut line = serde_json::to_vec(&Line { kind, object }).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}
