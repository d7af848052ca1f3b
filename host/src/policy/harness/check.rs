//! A policy's answer checked against a scenario's expectations, and
//! shown as a difference reads.

use std::fmt::Write as _;

use serde_json::Value;

use nmo_policy_runtime::validate::{Action, Verdict};

pub(super) fn show_action(a: &Action, order: u32) -> String {
    let grace = |g: &Option<i64>| g.map(|g| format!(" (grace {g}s)")).unwrap_or_default();
    let mut s = match a {
        Action::Skip { reason } | Action::Block { reason } | Action::Wait { reason, .. } => {
            format!("{}: {reason}", a.verb())
        }
        _ => format!("{}{}", a.verb(), grace(&a.grace())),
    };
    if let Some(t) = a.timeout() {
        let _ = write!(s, ", timeoutMs {}", t.as_millis());
    }
    if let Action::Notify(n) = a {
        s.push_str(if n.then_delete {
            ", then delete"
        } else {
            ", then evict"
        });
    }
    if order != 0 {
        let _ = write!(s, ", order {order}");
    }
    s
}

/// The fields an expected decision may name, besides `action`.
pub(super) const DECISION_FIELDS: [&str; 5] =
    ["order", "gracePeriodSeconds", "reason", "timeoutMs", "then"];

/// Whether an expected decision is well formed: a scenario that names an
/// action or a field that does not exist cannot be read (exit code 2), it
/// does not fail as if the policy had answered wrongly.
pub(super) fn expectation(want: &Value) -> std::result::Result<(), String> {
    let (kind, fields) = match want {
        Value::String(s) => (s.as_str(), None),
        Value::Object(o) => (
            o.get("action").and_then(Value::as_str).unwrap_or(""),
            Some(o),
        ),
        _ => ("", None),
    };
    if !ACTIONS.contains(&kind) {
        return Err(format!(
            "{want} is not an action: use one of {} (or {{action, {}}})",
            ACTIONS.join(", "),
            DECISION_FIELDS.join(", ")
        ));
    }
    for (k, v) in fields.into_iter().flatten() {
        let ok = match k.as_str() {
            "action" => true,
            "order" | "timeoutMs" => v.is_u64(),
            "gracePeriodSeconds" => v.is_i64() || v.is_null(),
            "reason" => v.is_string(),
            "then" => v == "evict" || v == "delete",
            other => {
                return Err(format!(
                    "unknown field {other:?}: the fields are action, {}",
                    DECISION_FIELDS.join(", ")
                ));
            }
        };
        if !ok {
            return Err(format!("{k}: {v} is not a valid value"));
        }
    }
    Ok(())
}

/// Compares one expected decision (already checked by [`expectation`])
/// with the actual one; `Err(expected, as shown)` if it does not match.
pub(super) fn check_decision(
    want: &Value,
    got: &Action,
    order: u32,
) -> std::result::Result<(), String> {
    expectation(want).map_err(|why| format!("(bad expectation: {why})"))?;
    let (kind, fields) = match want {
        Value::String(s) => (s.as_str(), None),
        Value::Object(o) => (
            o.get("action").and_then(Value::as_str).unwrap_or(""),
            Some(o),
        ),
        _ => ("", None),
    };
    let (got_kind, got_grace, got_reason) = (got.verb(), got.grace(), got.reason().unwrap_or(""));
    let shown = || {
        let mut s = kind.to_owned();
        for (k, v) in fields.into_iter().flatten() {
            if k != "action" {
                let _ = write!(s, ", {k} {v}");
            }
        }
        s
    };
    let mut ok = kind == got_kind;
    for (k, v) in fields.into_iter().flatten() {
        ok &= match k.as_str() {
            "order" => v.as_u64() == Some(u64::from(order)),
            "gracePeriodSeconds" => v.as_i64() == got_grace || (v.is_null() && got_grace.is_none()),
            "reason" => v.as_str().is_some_and(|r| got_reason.contains(r)),
            "timeoutMs" => got
                .timeout()
                .is_some_and(|t| v.as_u64() == u64::try_from(t.as_millis()).ok()),
            "then" => match got {
                Action::Notify(n) => (v == "delete") == n.then_delete,
                _ => false,
            },
            _ => true,
        };
    }
    if ok { Ok(()) } else { Err(shown()) }
}

/// The pod actions an expectation may name.
pub(super) const ACTIONS: [&str; 7] = [
    "evict", "delete", "skip", "block", "surge", "notify", "wait",
];

pub(super) fn check_verdict(want: &Value, got: &Verdict) -> bool {
    match (want, got) {
        (Value::String(s), Verdict::RetryWithBackoff) => s == "retryWithBackoff",
        (Value::String(s), Verdict::Fail(_)) => s == "fail",
        (Value::String(s), Verdict::Park { .. }) => s == "park",
        (Value::Object(o), Verdict::Park { reason, .. }) => o
            .get("park")
            .and_then(Value::as_str)
            .is_some_and(|want| reason.contains(want)),
        (Value::Object(o), Verdict::RetryAfter(d)) => {
            o.get("retryAfterMs").and_then(Value::as_u64) == Some(d.as_millis() as u64)
        }
        (Value::Object(o), Verdict::Fail(m)) => o
            .get("fail")
            .and_then(Value::as_str)
            .is_some_and(|want| m.contains(want)),
        _ => false,
    }
}

pub(super) fn show_verdict(v: &Verdict) -> String {
    match v {
        Verdict::RetryAfter(d) => format!("{{retryAfterMs: {}}}", d.as_millis()),
        Verdict::RetryWithBackoff => "retryWithBackoff".into(),
        Verdict::Fail(m) => format!("{{fail: {m:?}}}"),
        Verdict::Park { reason, .. } => format!("{{park: {reason:?}}}"),
    }
}
