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

/// Computes the cells of one row.
type RowFn = Box<dyn Fn(&Value) -> Vec<Value>>;

/// One column as the server describes it: name, type, format, priority,
/// description.
type Col = (&'static str, &'static str, &'static str, i64, &'static str);

const NAME: Col = (
    "Name",
    "string",
    "name",
    0,
    "Name must be unique within a namespace.",
);
const AGE: Col = (
    "Age",
    "string",
    "",
    0,
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
);

fn col_value((name, type_, format, priority, description): &Col) -> Value {
    col(name, type_, format, *priority, description)
}

/// A built-in resource's table, as data: its columns, and how a row is
/// read from an object.
struct Layout {
    group: &'static str,
    plural: &'static str,
    columns: &'static [Col],
    row: fn(&Value) -> Vec<Value>,
}

const LAYOUTS: &[Layout] = &[
    Layout {
        group: "",
        plural: "pods",
        columns: &[
            NAME,
            (
                "Ready",
                "string",
                "",
                0,
                "The aggregate readiness state of this pod for accepting traffic.",
            ),
            (
                "Status",
                "string",
                "",
                0,
                "The aggregate status of the containers in this pod.",
            ),
            (
                "Restarts",
                "string",
                "",
                0,
                "The number of times the containers in this pod have been restarted.",
            ),
            AGE,
            ("IP", "string", "", 1, "IP address allocated to the pod."),
            (
                "Node",
                "string",
                "",
                1,
                "Name of the node this pod is assigned to.",
            ),
            (
                "Nominated Node",
                "string",
                "",
                1,
                "Name of the node where the pod is nominated to run.",
            ),
            (
                "Readiness Gates",
                "string",
                "",
                1,
                "Readiness gates of the pod.",
            ),
        ],
        row: pod_row,
    },
    Layout {
        group: "",
        plural: "nodes",
        columns: &[
            NAME,
            ("Status", "string", "", 0, "The status of the node"),
            ("Roles", "string", "", 0, "The roles of the node"),
            AGE,
            (
                "Version",
                "string",
                "",
                0,
                "Kubelet Version reported by the node.",
            ),
        ],
        row: node_row,
    },
    Layout {
        group: "",
        plural: "namespaces",
        columns: &[
            NAME,
            ("Status", "string", "", 0, "The status of the namespace"),
            AGE,
        ],
        row: namespace_row,
    },
    Layout {
        group: "",
        plural: "events",
        columns: &[
            (
                "Last Seen",
                "string",
                "",
                0,
                "Time since the event was last seen",
            ),
            ("Type", "string", "", 0, "Type of the event"),
            ("Reason", "string", "", 0, "Reason of the event"),
            ("Object", "string", "", 0, "The object the event is about"),
            ("Message", "string", "", 0, "Message of the event"),
        ],
        row: event_row,
    },
    Layout {
        group: "apps",
        plural: "deployments",
        columns: &[
            NAME,
            (
                "Ready",
                "string",
                "",
                0,
                "Number of the pod with ready state",
            ),
            (
                "Up-to-date",
                "string",
                "",
                0,
                "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
            ),
            (
                "Available",
                "string",
                "",
                0,
                "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
            ),
            AGE,
        ],
        row: deployment_row,
    },
    Layout {
        group: "apps",
        plural: "replicasets",
        columns: &[
            NAME,
            ("Desired", "integer", "", 0, "Number of desired pods."),
            (
                "Current",
                "integer",
                "",
                0,
                "Number of actually running pods.",
            ),
            ("Ready", "integer", "", 0, "Number of pods ready."),
            AGE,
        ],
        row: replicaset_row,
    },
    Layout {
        group: "apps",
        plural: "statefulsets",
        columns: &[
            NAME,
            (
                "Ready",
                "string",
                "",
                0,
                "Number of the pod with ready state",
            ),
            AGE,
        ],
        row: statefulset_row,
    },
    Layout {
        group: "apps",
        plural: "daemonsets",
        columns: &[
            NAME,
            (
                "Desired",
                "integer",
                "",
                0,
                "The desired number of daemon pods.",
            ),
            (
                "Current",
                "integer",
                "",
                0,
                "The current number of daemon pods.",
            ),
            (
                "Ready",
                "integer",
                "",
                0,
                "The number of daemon pods that are ready.",
            ),
            (
                "Up-to-date",
                "integer",
                "",
                0,
                "The number of daemon pods that run the desired pod spec.",
            ),
            (
                "Available",
                "integer",
                "",
                0,
                "The number of daemon pods that are available.",
            ),
            (
                "Node Selector",
                "string",
                "",
                0,
                "The node selector of the daemon pods.",
            ),
            AGE,
        ],
        row: daemonset_row,
    },
    Layout {
        group: "batch",
        plural: "jobs",
        columns: &[
            NAME,
            ("Status", "string", "", 0, "Status of the job."),
            (
                "Completions",
                "string",
                "",
                0,
                "The completion status of the job.",
            ),
            (
                "Duration",
                "string",
                "",
                0,
                "Time required to complete the job.",
            ),
            AGE,
        ],
        row: job_row,
    },
    Layout {
        group: "policy",
        plural: "poddisruptionbudgets",
        columns: &[
            NAME,
            (
                "Min Available",
                "string",
                "",
                0,
                "The minimum number of pods that must be available.",
            ),
            (
                "Max Unavailable",
                "string",
                "",
                0,
                "The maximum number of pods that may be unavailable.",
            ),
            (
                "Allowed Disruptions",
                "integer",
                "",
                0,
                "Calculated number of pods that may be disrupted at this time.",
            ),
            AGE,
        ],
        row: pdb_row,
    },
    Layout {
        group: "coordination.k8s.io",
        plural: "leases",
        columns: &[
            NAME,
            ("Holder", "string", "", 0, "The holder of the lease."),
            AGE,
        ],
        row: lease_row,
    },
    Layout {
        group: "apiextensions.k8s.io",
        plural: "customresourcedefinitions",
        columns: &[NAME, ("Created At", "date", "", 0, "The creation time")],
        row: crd_row,
    },
];

fn created(o: &Value) -> Value {
    json!(age(&o["metadata"]["creationTimestamp"]))
}

fn name(o: &Value) -> Value {
    json!(o["metadata"]["name"])
}

/// `ready/desired` from two counts.
fn ratio(ready: &Value, desired: &Value) -> Value {
    json!(format!("{}/{}", int(ready), int(desired)))
}

fn namespace_row(o: &Value) -> Vec<Value> {
    let phase = o["status"]["phase"].as_str().unwrap_or("Active");
    vec![name(o), json!(phase), created(o)]
}

fn event_row(e: &Value) -> Vec<Value> {
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
}

fn deployment_row(d: &Value) -> Vec<Value> {
    vec![
        name(d),
        ratio(&d["status"]["readyReplicas"], &d["spec"]["replicas"]),
        json!(int(&d["status"]["updatedReplicas"])),
        json!(int(&d["status"]["availableReplicas"])),
        created(d),
    ]
}

fn replicaset_row(r: &Value) -> Vec<Value> {
    vec![
        name(r),
        json!(int(&r["spec"]["replicas"])),
        json!(int(&r["status"]["replicas"])),
        json!(int(&r["status"]["readyReplicas"])),
        created(r),
    ]
}

fn statefulset_row(r: &Value) -> Vec<Value> {
    vec![
        name(r),
        ratio(&r["status"]["readyReplicas"], &r["spec"]["replicas"]),
        created(r),
    ]
}

fn daemonset_row(r: &Value) -> Vec<Value> {
    let sel = Some(crate::selectors::to_string(
        &r["spec"]["template"]["spec"]["nodeSelector"],
    ))
    .filter(|s| !s.is_empty())
    .unwrap_or_else(|| "<none>".into());
    let st = &r["status"];
    vec![
        name(r),
        json!(int(&st["desiredNumberScheduled"])),
        json!(int(&st["currentNumberScheduled"])),
        json!(int(&st["numberReady"])),
        json!(int(&st["updatedNumberScheduled"])),
        json!(int(&st["numberAvailable"])),
        json!(sel),
        created(r),
    ]
}

fn job_row(j: &Value) -> Vec<Value> {
    let complete = j["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Complete" && c["status"] == "True")
    });
    vec![
        name(j),
        json!(if complete { "Complete" } else { "Running" }),
        ratio(&j["status"]["succeeded"], &j["spec"]["completions"]),
        json!(age(&j["status"]["startTime"])),
        created(j),
    ]
}

fn pdb_row(p: &Value) -> Vec<Value> {
    let show = |v: &Value| if v.is_null() { "N/A".to_string() } else { s(v) };
    vec![
        name(p),
        json!(show(&p["spec"]["minAvailable"])),
        json!(show(&p["spec"]["maxUnavailable"])),
        json!(int(&p["status"]["disruptionsAllowed"])),
        created(p),
    ]
}

fn lease_row(l: &Value) -> Vec<Value> {
    let holder = l["spec"]["holderIdentity"].as_str().unwrap_or("");
    vec![name(l), json!(holder), created(l)]
}

fn crd_row(c: &Value) -> Vec<Value> {
    vec![name(c), json!(c["metadata"]["creationTimestamp"])]
}

/// A custom resource's table: its CRD's printer columns (and Age, unless
/// they have one).
fn printer_columns(rt: &ResourceType) -> (Vec<Value>, RowFn) {
    let mut defs = vec![col_value(&NAME)];
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
        defs.push(col_value(&AGE));
    }
    let row = move |o: &Value| {
        let mut row = vec![name(o)];
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
    };
    (defs, Box::new(row))
}

/// The columns and the row function for a resource type: a built-in
/// layout, a CRD's printer columns, or Name and Age.
fn layout(rt: &ResourceType) -> (Vec<Value>, RowFn) {
    if let Some(l) = LAYOUTS
        .iter()
        .find(|l| l.group == rt.group && l.plural == rt.plural)
    {
        return (l.columns.iter().map(col_value).collect(), Box::new(l.row));
    }
    if !rt.columns.is_empty() {
        return printer_columns(rt);
    }
    (
        vec![col_value(&NAME), col_value(&AGE)],
        Box::new(|o| vec![name(o), created(o)]),
    )
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
