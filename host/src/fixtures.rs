//! Realistic Kubernetes objects for tests, benchmarks and the policy
//! harness: pods as the controllers and the kubelet leave them (labels,
//! owners, annotations, volumes, conditions), of every kind a drain meets.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, EmptyDirVolumeSource, Node, NodeSpec, Pod, PodCondition,
    PodSpec, PodStatus, Taint, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;

use crate::policy::convert::MIRROR_ANNOTATION;

/// The kinds of pod a drain has to deal with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodKind {
    /// Owned by a ReplicaSet of a Deployment.
    Deployment,
    /// Owned by a StatefulSet.
    StatefulSet,
    /// Owned by a DaemonSet.
    DaemonSet,
    /// Owned by a Job, still running.
    Job,
    /// Owned by a Job, finished (phase Succeeded).
    CompletedJob,
    /// No owner at all.
    Bare,
    /// A static pod's mirror (owned by the Node, mirror annotation).
    Mirror,
    /// A Deployment pod with an emptyDir volume.
    EmptyDir,
    /// A Deployment pod already being deleted.
    Terminating,
}

impl PodKind {
    /// Every kind, for tables of cases.
    pub const ALL: [PodKind; 9] = [
        PodKind::Deployment,
        PodKind::StatefulSet,
        PodKind::DaemonSet,
        PodKind::Job,
        PodKind::CompletedJob,
        PodKind::Bare,
        PodKind::Mirror,
        PodKind::EmptyDir,
        PodKind::Terminating,
    ];
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn owner(api_version: &str, kind: &str, name: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: format!("{:08x}-0000-4000-8000-000000000000", fnv(name)),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// A small stable hash, for made-up uids.
fn fnv(s: &str) -> u32 {
    s.bytes().fold(0x811c9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x01000193)
    })
}

fn timestamp(secs: i64) -> Time {
    Time(Timestamp::from_second(secs).expect("valid timestamp"))
}

/// A pod's name, owners and the labels its owner gives it, by kind.
fn identity(
    kind: PodKind,
    app: &str,
    index: usize,
    node: &str,
) -> (String, Vec<OwnerReference>, Vec<(&'static str, String)>) {
    let hash = format!("{:x}", fnv(app) % 0xfffff);
    match kind {
        PodKind::Deployment | PodKind::EmptyDir | PodKind::Terminating => (
            format!("{app}-{hash}-{index:05}"),
            vec![owner("apps/v1", "ReplicaSet", &format!("{app}-{hash}"))],
            vec![("pod-template-hash", hash.clone())],
        ),
        PodKind::StatefulSet => (
            format!("{app}-{index}"),
            vec![owner("apps/v1", "StatefulSet", app)],
            vec![
                (
                    "statefulset.kubernetes.io/pod-name",
                    format!("{app}-{index}"),
                ),
                ("controller-revision-hash", format!("{app}-{hash}")),
            ],
        ),
        PodKind::DaemonSet => (
            format!("{app}-{hash}{index}"),
            vec![owner("apps/v1", "DaemonSet", app)],
            vec![("controller-revision-hash", hash.clone())],
        ),
        PodKind::Job | PodKind::CompletedJob => (
            format!("{app}-{index}-{hash}"),
            vec![owner("batch/v1", "Job", &format!("{app}-{index}"))],
            vec![("batch.kubernetes.io/job-name", format!("{app}-{index}"))],
        ),
        PodKind::Bare => (format!("{app}-{index}"), Vec::new(), Vec::new()),
        PodKind::Mirror => (
            format!("{app}-{node}"),
            vec![OwnerReference {
                controller: Some(true),
                block_owner_deletion: None,
                ..owner("v1", "Node", node)
            }],
            vec![("tier", "control-plane".into())],
        ),
    }
}

/// A pod of `kind` named after `app` and `index`, bound to `node`.
pub fn pod(kind: PodKind, namespace: &str, app: &str, index: usize, node: &str) -> Pod {
    let (name, owners, extra_labels) = identity(kind, app, index, node);
    let mut all_labels = labels(&[
        ("app", app),
        ("app.kubernetes.io/name", app),
        ("app.kubernetes.io/part-of", "shop"),
        ("app.kubernetes.io/version", "1.4.2"),
    ]);
    for (k, v) in extra_labels {
        all_labels.insert(k.into(), v);
    }
    let mut annotations = labels(&[
        ("kubectl.kubernetes.io/restartedAt", "2026-11-01T09:00:00Z"),
        ("prometheus.io/scrape", "true"),
        ("prometheus.io/port", "9090"),
    ]);
    if kind == PodKind::Mirror {
        annotations.insert(MIRROR_ANNOTATION.into(), format!("{:x}", fnv(&name)));
        annotations.insert("kubernetes.io/config.source".into(), "file".into());
    }
    let mut volumes = vec![Volume {
        name: "config".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: format!("{app}-config"),
            ..Default::default()
        }),
        ..Default::default()
    }];
    if kind == PodKind::EmptyDir {
        volumes.push(Volume {
            name: "scratch".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        });
    }
    let phase = if kind == PodKind::CompletedJob {
        "Succeeded"
    } else {
        "Running"
    };
    let ready = phase == "Running";
    Pod {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.into()),
            uid: Some(format!(
                "{:08x}-{:04x}-4000-8000-{:012x}",
                fnv(&name),
                index % 0xffff,
                fnv(namespace)
            )),
            resource_version: Some(format!("{}", 1000 + index)),
            creation_timestamp: Some(timestamp(1_790_000_000)),
            deletion_timestamp: (kind == PodKind::Terminating).then(|| timestamp(1_790_000_600)),
            labels: Some(all_labels),
            annotations: Some(annotations),
            owner_references: (!owners.is_empty()).then_some(owners),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: app.into(),
                image: Some(format!("registry.example/{app}:1.4.2")),
                ..Default::default()
            }],
            volumes: Some(volumes),
            termination_grace_period_seconds: Some(30),
            priority: Some(if kind == PodKind::Mirror {
                2_000_001_000
            } else {
                0
            }),
            priority_class_name: (kind == PodKind::Mirror)
                .then(|| "system-node-critical".to_string()),
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some(phase.into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// `count` pods on `node` in the mix a busy worker carries: mostly
/// Deployment pods, some StatefulSet, DaemonSet, Job, emptyDir and bare pods,
/// one mirror pod.
pub fn node_pods(node: &str, count: usize) -> Vec<Pod> {
    (0..count)
        .map(|i| {
            let kind = match i % 20 {
                _ if i == 0 => PodKind::Mirror,
                1 | 2 => PodKind::DaemonSet,
                3 | 4 => PodKind::StatefulSet,
                5 => PodKind::Job,
                6 => PodKind::CompletedJob,
                7 => PodKind::EmptyDir,
                8 => PodKind::Bare,
                _ => PodKind::Deployment,
            };
            let app = format!("app{}", i % 37);
            pod(kind, &format!("team-{}", i % 7), &app, i, node)
        })
        .collect()
}

/// A worker node, with labels and a taint of its own, not cordoned.
pub fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("{:08x}-0000-4000-8000-00000000beef", fnv(name))),
            labels: Some(labels(&[
                ("kubernetes.io/hostname", name),
                ("kubernetes.io/os", "linux"),
                ("node-role.kubernetes.io/worker", ""),
                ("topology.kubernetes.io/zone", "zone-a"),
            ])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: "example.com/gpu".into(),
                value: Some("true".into()),
                effect: "PreferNoSchedule".into(),
                time_added: None,
            }]),
            ..Default::default()
        }),
        status: Some(k8s_openapi::api::core::v1::NodeStatus {
            conditions: Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// The record of a NodeMaintenance `nm-1` on `worker-1` whose reason is
/// `reason` (the hostile test policy misbehaves as the reason says).
pub fn maintenance(reason: &str) -> crate::policy::types::Maintenance {
    crate::policy::types::Maintenance {
        name: "nm-1".into(),
        node_name: "worker-1".into(),
        reason: reason.into(),
        labels: Vec::new(),
        annotations: Vec::new(),
        phase: None,
        drain_progress: 0,
        error_on_lease_count: 0,
        attempt: 1,
        elapsed_ms: 0,
        now_ms: 1_767_607_200_000,
        created_ms: 1_767_607_200_000,
    }
}
