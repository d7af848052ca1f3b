//! API errors as the real API server reports them: a `Status` object with
//! the same code, reason and message.

use serde_json::{Value, json};

use crate::resources::ResourceType;

/// An error answer of the API.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
    /// Seconds for a `Retry-After` header (429s).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    fn rt_details(rt: &ResourceType, name: &str) -> Value {
        let mut d = json!({"name": name, "kind": rt.plural});
        if !rt.group.is_empty() {
            d["group"] = json!(rt.group);
        }
        d
    }

    /// A JSON patch that does not apply: the real server answers its generic
    /// 422 (`errors.NewGenericServerResponse`), the patch library's text
    /// left out, as kube-apiserver 1.35 does.
    pub fn patch_does_not_apply() -> Self {
        Self::new(
            422,
            "Invalid",
            "the server rejected our request due to an error in our request",
        )
        .with_details(json!({}))
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", rt.qualified()),
        )
        .with_details(Self::rt_details(rt, name))
    }

    pub fn namespace_not_found(ns: &str) -> Self {
        Self::new(404, "NotFound", format!("namespaces \"{ns}\" not found"))
            .with_details(json!({"name": ns, "kind": "namespaces"}))
    }

    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", rt.qualified()),
        )
        .with_details(Self::rt_details(rt, name))
    }

    pub fn conflict(rt: &ResourceType, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                rt.qualified()
            ),
        )
        .with_details(Self::rt_details(rt, name))
    }

    pub fn stale(rt: &ResourceType, name: &str) -> Self {
        Self::conflict(
            rt,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 Invalid, with one cause per (field, message).
    pub fn invalid(rt: &ResourceType, name: &str, causes: &[(String, String)]) -> Self {
        let text: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let msg = if text.len() == 1 {
            text[0].clone()
        } else {
            format!("[{}]", text.join(", "))
        };
        let mut d = Self::rt_details(rt, name);
        d["kind"] = json!(rt.kind);
        d["causes"] = causes
            .iter()
            .map(|(f, m)| json!({"reason": "FieldValueInvalid", "message": m, "field": f}))
            .collect();
        Self::new(
            422,
            "Invalid",
            format!("{}.{} \"{name}\" is invalid: {msg}", rt.kind, rt.group).replace(". \"", " \""),
        )
        .with_details(d)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media(ct: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {ct:?})"
            ),
        )
    }

    /// A strategic merge patch of a custom resource (the real server has no
    /// Go type to take the merge keys from).
    pub fn strategic_merge_unsupported() -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// A 429. `retry_after` adds a `Retry-After` header, as API priority
    /// and fairness does; a PDB refusal has none (client-go would otherwise
    /// retry it silently, and kubectl drain reports it itself).
    pub fn too_many_requests(
        message: impl Into<String>,
        causes: Vec<Value>,
        retry_after: Option<u64>,
    ) -> Self {
        let mut e = Self::new(429, "TooManyRequests", message);
        if !causes.is_empty() {
            e.details = Some(json!({"causes": causes}));
        }
        e.retry_after = retry_after;
        e
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    /// A 503, as an API server that is shutting down (or a webhook or
    /// aggregated API behind it that is not there) answers.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        if let Some(r) = self.retry_after {
            s["details"]["retryAfterSeconds"] = json!(r);
        }
        s
    }
}

/// A `Status` of success (for deletions and evictions).
pub fn success_status(details: Option<Value>) -> Value {
    let mut s = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
    });
    if let Some(d) = details {
        s["details"] = d;
    }
    s
}
