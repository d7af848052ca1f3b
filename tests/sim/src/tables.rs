//! Server-side tables: what `kubectl get` prints, computed by the server as
//! a real one does (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`).

use jiff::Timestamp;
use serde_json::{Value, json};

use crate::resources::ResourceType;

/// kubectl's short human duration (`duration.HumanDuration`).
pub fn human_duration(secs: i64) -> String {
    // "5m" or "5m3s": a unit and, when not zero, the next smaller one.
    let pair = |big: i64, bu: &str, small: i64, su: &str| {
        if small == 0 {
            format!("{big}{bu}")
        } else {
            format!("{big}{bu}{small}{su}")
        }
    };
    let s = secs.max(0);
    let (m, h) = (s / 60, s / 3600);
    let d = h / 24;
    match () {
        _ if s < 120 => format!("{s}s"),
        _ if m < 10 => pair(m, "m", s % 60, "s"),
        _ if m < 180 => format!("{m}m"),
        _ if h < 8 => pair(h, "h", m % 60, "m"),
        _ if h < 48 => format!("{h}h"),
        _ if d < 8 => pair(d, "d", h % 24, "h"),
        _ if d < 365 * 2 => format!("{d}d"),
        _ => format!("{}y", d / 365),
    }
}

fn age(v: &Value) -> String {
    v.as_str()
        .and_then(|t| t.parse::<Timestamp>().ok())
        .map(|t| human_duration(Timestamp::now().as_second() - t.as_second()))
        .unwrap_or_else(|| "<unknown>".into())
}

fn col(name: &str, type_: &str, format: &str, priority: i64, description: &str) -> Value {
    json!({"name": name, "type": type_, "format": format, "priority": priority, "description": description})
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => "<none>".into(),
        Value::String(s) if s.is_empty() => "<none>".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

/// Evaluates a CRD column's `jsonPath` (the `.a.b[0].c` subset CRDs use).
fn json_path(obj: &Value, path: &str) -> Value {
    let mut v = obj;
    for part in path.trim_start_matches('.').split('.') {
        if part.is_empty() {
            continue;
        }
        let (field, index) = match part.split_once('[') {
            Some((f, rest)) => (f, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        v = &v[field];
        if let Some(i) = index {
            v = &v[i];
        }
    }
    v.clone()
}

fn pod_row(p: &Value) -> Vec<Value> {
    let statuses = p["status"]["containerStatuses"].as_array();
    let total = p["spec"]["containers"].as_array().map_or(0, Vec::len);
    let ready = statuses.map_or(0, |cs| cs.iter().filter(|c| c["ready"] == true).count());
    let restarts: i64 = statuses.map_or(0, |cs| cs.iter().map(|c| int(&c["restartCount"])).sum());
    let mut status = p["status"]["phase"]
        .as_str()
        .unwrap_or("Pending")
        .to_owned();
    if p["status"]["phase"] == "Succeeded" {
        status = "Completed".into();
    }
    if !p["metadata"]["deletionTimestamp"].is_null() {
        status = "Terminating".into();
    }
    vec![
        json!(p["metadata"]["name"]),
        json!(format!("{ready}/{total}")),
        json!(status),
        json!(restarts),
        json!(age(&p["metadata"]["creationTimestamp"])),
        json!(s(&p["status"]["podIP"])),
        json!(s(&p["spec"]["nodeName"])),
        json!("<none>"),
        json!("<none>"),
    ]
}

fn node_row(n: &Value) -> Vec<Value> {
    let ready = n["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .map_or("Unknown", |c| {
            if c["status"] == "True" {
                "Ready"
            } else {
                "NotReady"
            }
        });
    let mut status = ready.to_owned();
    if n["spec"]["unschedulable"] == true {
        status.push_str(",SchedulingDisabled");
    }
    let roles: Vec<&str> = n["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, _)| k.strip_prefix("node-role.kubernetes.io/"))
        .collect();
    let roles = if roles.is_empty() {
        "<none>".to_owned()
    } else {
        roles.join(",")
    };
    vec![
        json!(n["metadata"]["name"]),
        json!(status),
        json!(roles),
        json!(age(&n["metadata"]["creationTimestamp"])),
        json!(
            n["status"]["nodeInfo"]["kubeletVersion"]
                .as_str()
                .unwrap_or("v1.32.0")
        ),
    ]
}

/// Column definitions and a row function for a resource type.
/// Computes the cells of one row.
type RowFn = Box<dyn Fn(&Value) -> Vec<Value>>;

fn name_col() -> Value {
    col(
        "Name",
        "string",
        "name",
        0,
        "Name must be unique within a namespace.",
    )
}

fn age_col() -> Value {
    col(
        "Age",
        "string",
        "",
        0,
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
    )
}

fn created(o: &Value) -> Value {
    json!(age(&o["metadata"]["creationTimestamp"]))
}

/// Name, one column of its own, Age.
fn one_column(column: Value, cell: fn(&Value) -> Value) -> (Vec<Value>, RowFn) {
    (
        vec![name_col(), column, age_col()],
        Box::new(move |o| vec![json!(o["metadata"]["name"]), cell(o), created(o)]),
    )
}

fn layout(rt: &ResourceType) -> (Vec<Value>, RowFn) {
    let name = name_col();
    let age_col = age_col();
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => (
            vec![
                name,
                col(
                    "Ready",
                    "string",
                    "",
                    0,
                    "The aggregate readiness state of this pod for accepting traffic.",
                ),
                col(
                    "Status",
                    "string",
                    "",
                    0,
                    "The aggregate status of the containers in this pod.",
                ),
                col(
                    "Restarts",
                    "string",
                    "",
                    0,
                    "The number of times the containers in this pod have been restarted.",
                ),
                age_col,
                col("IP", "string", "", 1, "IP address allocated to the pod."),
                col(
                    "Node",
                    "string",
                    "",
                    1,
                    "Name of the node this pod is assigned to.",
                ),
                col(
                    "Nominated Node",
                    "string",
                    "",
                    1,
                    "Name of the node where the pod is nominated to run.",
                ),
                col(
                    "Readiness Gates",
                    "string",
                    "",
                    1,
                    "Readiness gates of the pod.",
                ),
            ],
            Box::new(pod_row),
        ),
        ("", "nodes") => (
            vec![
                name,
                col("Status", "string", "", 0, "The status of the node"),
                col("Roles", "string", "", 0, "The roles of the node"),
                age_col,
                col(
                    "Version",
                    "string",
                    "",
                    0,
                    "Kubelet Version reported by the node.",
                ),
            ],
            Box::new(node_row),
        ),
        ("", "namespaces") => one_column(
            col("Status", "string", "", 0, "The status of the namespace"),
            |o| json!(o["status"]["phase"].as_str().unwrap_or("Active")),
        ),
        ("", "events") => (
            vec![
                col(
                    "Last Seen",
                    "string",
                    "",
                    0,
                    "Time since the event was last seen",
                ),
                col("Type", "string", "", 0, "Type of the event"),
                col("Reason", "string", "", 0, "Reason of the event"),
                col("Object", "string", "", 0, "The object the event is about"),
                col("Message", "string", "", 0, "Message of the event"),
            ],
            Box::new(|e| {
                let last = if e["lastTimestamp"].is_null() {
                    &e["eventTime"]
                } else {
                    &e["lastTimestamp"]
                };
                let obj = format!(
                    "{}/{}",
                    e["involvedObject"]["kind"]
                        .as_str()
                        .unwrap_or_default()
                        .to_lowercase(),
                    e["involvedObject"]["name"].as_str().unwrap_or_default()
                );
                vec![
                    json!(age(last)),
                    json!(e["type"]),
                    json!(e["reason"]),
                    json!(obj),
                    json!(e["message"]),
                ]
            }),
        ),
        ("apps", "deployments") => (
            vec![
                name,
                col(
                    "Ready",
                    "string",
                    "",
                    0,
                    "Number of the pod with ready state",
                ),
                col(
                    "Up-to-date",
                    "string",
                    "",
                    0,
                    "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
                ),
                col(
                    "Available",
                    "string",
                    "",
                    0,
                    "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
                ),
                age_col,
            ],
            Box::new(move |d| {
                vec![
                    json!(d["metadata"]["name"]),
                    json!(format!(
                        "{}/{}",
                        int(&d["status"]["readyReplicas"]),
                        int(&d["spec"]["replicas"])
                    )),
                    json!(int(&d["status"]["updatedReplicas"])),
                    json!(int(&d["status"]["availableReplicas"])),
                    created(d),
                ]
            }),
        ),
        ("apps", "replicasets") => (
            vec![
                name,
                col("Desired", "integer", "", 0, "Number of desired pods."),
                col(
                    "Current",
                    "integer",
                    "",
                    0,
                    "Number of actually running pods.",
                ),
                col("Ready", "integer", "", 0, "Number of pods ready."),
                age_col,
            ],
            Box::new(move |r| {
                vec![
                    json!(r["metadata"]["name"]),
                    json!(int(&r["spec"]["replicas"])),
                    json!(int(&r["status"]["replicas"])),
                    json!(int(&r["status"]["readyReplicas"])),
                    created(r),
                ]
            }),
        ),
        ("apps", "statefulsets") => (
            vec![
                name,
                col(
                    "Ready",
                    "string",
                    "",
                    0,
                    "Number of the pod with ready state",
                ),
                age_col,
            ],
            Box::new(move |r| {
                vec![
                    json!(r["metadata"]["name"]),
                    json!(format!(
                        "{}/{}",
                        int(&r["status"]["readyReplicas"]),
                        int(&r["spec"]["replicas"])
                    )),
                    created(r),
                ]
            }),
        ),
        ("apps", "daemonsets") => (
            vec![
                name,
                col(
                    "Desired",
                    "integer",
                    "",
                    0,
                    "The desired number of daemon pods.",
                ),
                col(
                    "Current",
                    "integer",
                    "",
                    0,
                    "The current number of daemon pods.",
                ),
                col(
                    "Ready",
                    "integer",
                    "",
                    0,
                    "The number of daemon pods that are ready.",
                ),
                col(
                    "Up-to-date",
                    "integer",
                    "",
                    0,
                    "The number of daemon pods that run the desired pod spec.",
                ),
                col(
                    "Available",
                    "integer",
                    "",
                    0,
                    "The number of daemon pods that are available.",
                ),
                col(
                    "Node Selector",
                    "string",
                    "",
                    0,
                    "The node selector of the daemon pods.",
                ),
                age_col,
            ],
            Box::new(move |r| {
                let sel = Some(crate::selectors::to_string(
                    &r["spec"]["template"]["spec"]["nodeSelector"],
                ))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "<none>".into());
                let st = &r["status"];
                vec![
                    json!(r["metadata"]["name"]),
                    json!(int(&st["desiredNumberScheduled"])),
                    json!(int(&st["currentNumberScheduled"])),
                    json!(int(&st["numberReady"])),
                    json!(int(&st["updatedNumberScheduled"])),
                    json!(int(&st["numberAvailable"])),
                    json!(sel),
                    created(r),
                ]
            }),
        ),
        ("batch", "jobs") => (
            vec![
                name,
                col("Status", "string", "", 0, "Status of the job."),
                col(
                    "Completions",
                    "string",
                    "",
                    0,
                    "The completion status of the job.",
                ),
                col(
                    "Duration",
                    "string",
                    "",
                    0,
                    "Time required to complete the job.",
                ),
                age_col,
            ],
            Box::new(move |j| {
                let complete = j["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Complete" && c["status"] == "True")
                });
                vec![
                    json!(j["metadata"]["name"]),
                    json!(if complete { "Complete" } else { "Running" }),
                    json!(format!(
                        "{}/{}",
                        int(&j["status"]["succeeded"]),
                        int(&j["spec"]["completions"])
                    )),
                    json!(age(&j["status"]["startTime"])),
                    created(j),
                ]
            }),
        ),
        ("policy", "poddisruptionbudgets") => (
            vec![
                name,
                col(
                    "Min Available",
                    "string",
                    "",
                    0,
                    "The minimum number of pods that must be available.",
                ),
                col(
                    "Max Unavailable",
                    "string",
                    "",
                    0,
                    "The maximum number of pods that may be unavailable.",
                ),
                col(
                    "Allowed Disruptions",
                    "integer",
                    "",
                    0,
                    "Calculated number of pods that may be disrupted at this time.",
                ),
                age_col,
            ],
            Box::new(move |p| {
                let show = |v: &Value| if v.is_null() { "N/A".to_string() } else { s(v) };
                vec![
                    json!(p["metadata"]["name"]),
                    json!(show(&p["spec"]["minAvailable"])),
                    json!(show(&p["spec"]["maxUnavailable"])),
                    json!(int(&p["status"]["disruptionsAllowed"])),
                    created(p),
                ]
            }),
        ),
        ("coordination.k8s.io", "leases") => one_column(
            col("Holder", "string", "", 0, "The holder of the lease."),
            |l| json!(l["spec"]["holderIdentity"].as_str().unwrap_or("")),
        ),
        ("apiextensions.k8s.io", "customresourcedefinitions") => (
            vec![name, col("Created At", "date", "", 0, "The creation time")],
            Box::new(|c| {
                vec![
                    json!(c["metadata"]["name"]),
                    json!(c["metadata"]["creationTimestamp"]),
                ]
            }),
        ),
        _ if !rt.columns.is_empty() => {
            let mut defs = vec![name];
            for c in &rt.columns {
                defs.push(col(
                    &c.name,
                    &c.type_,
                    &c.format,
                    c.priority,
                    &c.description,
                ));
            }
            let columns = rt.columns.clone();
            let has_age = columns.iter().any(|c| c.name == "Age");
            if !has_age {
                defs.push(age_col);
            }
            (
                defs,
                Box::new(move |o| {
                    let mut row = vec![json!(o["metadata"]["name"])];
                    for c in &columns {
                        let v = json_path(o, &c.json_path);
                        row.push(if c.type_ == "date" {
                            json!(age(&v))
                        } else if v.is_null() {
                            json!(null)
                        } else {
                            v
                        });
                    }
                    if !has_age {
                        row.push(created(o));
                    }
                    row
                }),
            )
        }
        _ => (
            vec![name, age_col],
            Box::new(move |o| vec![json!(o["metadata"]["name"]), created(o)]),
        ),
    }
}

/// The row object kubectl needs (metadata only, as a real server sends by
/// default).
fn row_object(rt: &ResourceType, obj: &Value, include: &str) -> Value {
    if include == "Object" {
        return obj.clone();
    }
    if include == "None" {
        return Value::Null;
    }
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj["metadata"],
        "_type": format!("{}/{}", rt.api_version(), rt.kind),
    })
}

/// A Table of `items`.
pub fn table(
    rt: &ResourceType,
    items: &[Value],
    rv: u64,
    cont: Option<&str>,
    include: &str,
    with_columns: bool,
) -> Value {
    let (columns, row) = layout(rt);
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let mut r = json!({"cells": row(o), "object": row_object(rt, o, include)});
            if let Some(m) = r["object"].as_object_mut() {
                m.remove("_type");
            }
            r
        })
        .collect();
    let mut t = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": if with_columns { json!(columns) } else { json!([]) },
        "rows": rows,
    });
    if let Some(c) = cont {
        t["metadata"]["continue"] = json!(c);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::human_duration;

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(125), "2m5s");
        assert_eq!(human_duration(900), "15m");
        assert_eq!(human_duration(3 * 3600 + 120), "3h2m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400), "3d");
    }
}
