//! Kubernetes protobuf, as client-go and controller-runtime send it: the
//! codec checked against k8s-pb's own (prost) messages, then a client that
//! speaks only protobuf for built-in kinds driving the simulated server over
//! HTTP (create, get, list, watch frames, delete with DeleteOptions,
//! eviction, leases, events), and what it gets for a custom resource.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use k8s_pb::api::coordination::v1 as coordination;
use k8s_pb::api::core::v1 as core;
use k8s_pb::api::policy::v1 as policy;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use nmo_sim::proto::Schema;
use nmo_sim::{SimCluster, SimOptions};
use prost::Message;
use serde_json::{Value, json};

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// What controller-runtime sends for built-in kinds.
const CONTROLLER_RUNTIME_ACCEPT: &str = "application/vnd.kubernetes.protobuf, */*";

fn s(v: &str) -> Option<String> {
    Some(v.to_owned())
}

/// `k8s\0` + runtime.Unknown, as client-go's protobuf serializer writes.
fn envelope(api_version: &str, kind: &str, msg: &impl Message) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: s(api_version),
            kind: s(kind),
        }),
        raw: Some(msg.encode_to_vec()),
        content_encoding: s(""),
        content_type: s(""),
    };
    [b"k8s\0".to_vec(), unknown.encode_to_vec()].concat()
}

fn open_envelope(body: &[u8]) -> (String, String, Vec<u8>) {
    let rest = body
        .strip_prefix(b"k8s\0")
        .unwrap_or_else(|| panic!("no protobuf prefix: {:?}", String::from_utf8_lossy(body)));
    let u = Unknown::decode(rest).expect("an Unknown envelope");
    let tm = u.type_meta.unwrap_or_default();
    (
        tm.api_version.unwrap_or_default(),
        tm.kind.unwrap_or_default(),
        u.raw.unwrap_or_default(),
    )
}

/// A pod as a Go client builds it: every non-pointer field written, empty or
/// not, and the fields whose zero value matters.
fn go_pod() -> core::Pod {
    core::Pod {
        metadata: Some(meta::ObjectMeta {
            name: s("web-1"),
            generate_name: s(""),
            namespace: s("default"),
            self_link: s(""),
            uid: s(""),
            resource_version: s(""),
            generation: Some(0),
            creation_timestamp: Some(meta::Time {
                seconds: Some(0),
                nanos: Some(0),
            }),
            labels: BTreeMap::from([("app".to_owned(), "web".to_owned())]),
            owner_references: vec![meta::OwnerReference {
                api_version: s("apps/v1"),
                kind: s("ReplicaSet"),
                name: s("web-abc"),
                uid: s("1234"),
                controller: Some(true),
                block_owner_deletion: None,
            }],
            ..Default::default()
        }),
        spec: Some(core::PodSpec {
            containers: vec![core::Container {
                name: s("web"),
                image: s("nginx:1.27"),
                ports: vec![core::ContainerPort {
                    name: s("http"),
                    container_port: Some(8080),
                    protocol: s("TCP"),
                    host_port: Some(0),
                    host_ip: s(""),
                }],
                resources: Some(core::ResourceRequirements {
                    requests: BTreeMap::from([("cpu".to_owned(), Quantity { string: s("250m") })]),
                    ..Default::default()
                }),
                readiness_probe: Some(core::Probe {
                    handler: Some(core::ProbeHandler {
                        http_get: Some(core::HttpGetAction {
                            path: s("/healthz"),
                            port: Some(IntOrString {
                                r#type: Some(1),
                                int_val: Some(0),
                                str_val: s("http"),
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    period_seconds: Some(5),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            volumes: vec![core::Volume {
                name: s("scratch"),
                volume_source: Some(core::VolumeSource {
                    empty_dir: Some(core::EmptyDirVolumeSource {
                        medium: s(""),
                        size_limit: None,
                    }),
                    ..Default::default()
                }),
            }],
            tolerations: vec![core::Toleration {
                key: s("node.kubernetes.io/unreachable"),
                operator: s("Exists"),
                value: s(""),
                effect: s("NoExecute"),
                toleration_seconds: Some(0),
            }],
            termination_grace_period_seconds: Some(0),
            restart_policy: s(""),
            node_name: s(""),
            host_network: Some(false),
            ..Default::default()
        }),
        status: Some(core::PodStatus {
            phase: s(""),
            ..Default::default()
        }),
    }
}

#[test]
fn a_go_clients_pod_reads_as_the_real_server_would_store_it() {
    let schema = Schema::builtin();
    let body = envelope("v1", "Pod", &go_pod());
    let obj = schema.decode_object(&body).expect("decodes");
    // What `kubectl get -o json` shows for this pod on a real server before
    // defaulting: no empty strings, no zero time, no hostPort 0, but the
    // pointers' explicit zeros kept; the inline VolumeSource and ProbeHandler
    // flattened; IntOrString and Quantity as plain values.
    assert_eq!(
        obj,
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web-1",
                "namespace": "default",
                "labels": {"app": "web"},
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc",
                    "uid": "1234", "controller": true,
                }],
            },
            "spec": {
                "containers": [{
                    "name": "web",
                    "image": "nginx:1.27",
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "resources": {"requests": {"cpu": "250m"}},
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5},
                }],
                "volumes": [{"name": "scratch", "emptyDir": {}}],
                "tolerations": [{
                    "key": "node.kubernetes.io/unreachable", "operator": "Exists",
                    "effect": "NoExecute", "tolerationSeconds": 0,
                }],
                "terminationGracePeriodSeconds": 0,
            },
            "status": {},
        })
    );
}

#[test]
fn what_the_server_writes_reads_back_with_k8s_pb() {
    let schema = Schema::builtin();
    let obj = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web", "namespace": "default", "uid": "u-1", "resourceVersion": "42",
            "generation": 3, "creationTimestamp": "2026-11-30T10:00:00Z",
            "annotations": {"a": "b"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:spec": {"f:replicas": {}}}, "time": "2026-11-30T10:00:00Z"}],
        },
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 1}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx", "env": [{"name": "A", "value": "1"}]}]},
            },
        },
        "status": {"replicas": 2, "readyReplicas": 1, "conditions": [{"type": "Available", "status": "True",
            "lastUpdateTime": "2026-11-30T10:00:01Z"}]},
    });
    let body = schema.encode_object(&obj).expect("encodes");
    let (av, kind, raw) = open_envelope(&body);
    assert_eq!((av.as_str(), kind.as_str()), ("apps/v1", "Deployment"));
    let d = k8s_pb::api::apps::v1::Deployment::decode(raw.as_slice()).expect("k8s-pb decodes it");
    let meta = d.metadata.as_ref().expect("metadata");
    assert_eq!(meta.resource_version.as_deref(), Some("42"));
    assert_eq!(meta.generation, Some(3));
    let created = meta.creation_timestamp.expect("creationTimestamp");
    assert_eq!(created.seconds, Some(1_796_032_800));
    let fields = meta.managed_fields[0]
        .fields_v1
        .as_ref()
        .and_then(|f| f.raw.clone())
        .expect("fieldsV1");
    assert_eq!(
        serde_json::from_slice::<Value>(&fields).expect("JSON"),
        json!({"f:spec": {"f:replicas": {}}})
    );
    let spec = d.spec.as_ref().expect("spec");
    assert_eq!(spec.replicas, Some(0), "an explicit 0 replicas survives");
    let rolling = spec
        .strategy
        .as_ref()
        .and_then(|s| s.rolling_update.as_ref())
        .expect("rollingUpdate");
    assert_eq!(
        rolling
            .max_unavailable
            .as_ref()
            .map(|i| (i.r#type, i.str_val.clone())),
        Some((Some(1), s("25%")))
    );
    assert_eq!(
        rolling.max_surge.as_ref().map(|i| (i.r#type, i.int_val)),
        Some((Some(0), Some(1)))
    );
    let container = &spec
        .template
        .as_ref()
        .unwrap()
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    assert_eq!(container.env[0].value.as_deref(), Some("1"));
    assert_eq!(d.status.as_ref().and_then(|s| s.ready_replicas), Some(1));
    // And back: the same JSON.
    assert_eq!(schema.decode_object(&body).expect("decodes"), obj);
}

#[test]
fn binary_data_and_every_scalar_kind_round_trip() {
    let schema = Schema::builtin();
    let wasm = b"\0asm\x0d\0\x01\0 any bytes \xff\xfe".to_vec();
    let cm = core::ConfigMap {
        metadata: Some(meta::ObjectMeta {
            name: s("policies"),
            ..Default::default()
        }),
        data: BTreeMap::from([("policies.yaml".to_owned(), "default: x\n".to_owned())]),
        binary_data: BTreeMap::from([("x.wasm".to_owned(), wasm.clone())]),
        immutable: Some(false),
    };
    let obj = schema
        .decode_object(&envelope("v1", "ConfigMap", &cm))
        .expect("decodes");
    use base64::Engine;
    assert_eq!(
        obj["binaryData"]["x.wasm"],
        json!(base64::engine::general_purpose::STANDARD.encode(&wasm))
    );
    assert_eq!(obj["data"]["policies.yaml"], json!("default: x\n"));
    let back = schema.encode_object(&obj).expect("encodes");
    let (_, _, raw) = open_envelope(&back);
    let again = core::ConfigMap::decode(raw.as_slice()).expect("decodes");
    assert_eq!(again.binary_data, cm.binary_data);
    assert_eq!(again.data, cm.data);

    // MicroTime (leases) keeps its microseconds; int32 and bools.
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "worker-1", "namespace": "medik8s-leases"},
        "spec": {"holderIdentity": "node-maintenance", "leaseDurationSeconds": 3600,
                 "acquireTime": "2026-11-30T10:00:00.123456Z", "renewTime": "2026-11-30T10:00:05.000001Z",
                 "leaseTransitions": 0},
    });
    let body = schema.encode_object(&lease).expect("encodes");
    let (_, _, raw) = open_envelope(&body);
    let l = coordination::Lease::decode(raw.as_slice()).expect("decodes");
    let spec = l.spec.expect("spec");
    assert_eq!(spec.lease_duration_seconds, Some(3600));
    assert_eq!(spec.acquire_time.and_then(|t| t.nanos), Some(123_456_000));
    assert_eq!(schema.decode_object(&body).expect("decodes"), lease);
}

// ---- over HTTP ----------------------------------------------------------

struct Answer {
    status: u16,
    content_type: String,
    body: Bytes,
}

async fn call(
    c: &SimCluster,
    method: &str,
    path: &str,
    accept: &str,
    body: Option<(&str, Vec<u8>)>,
) -> Answer {
    let stream = tokio::net::TcpStream::connect(c.addr())
        .await
        .expect("connect");
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("Host", "127.0.0.1")
        .header("Accept", accept)
        .header(
            "User-Agent",
            "manager/v0.0.0 (linux/amd64) kubernetes/$Format",
        );
    let payload = match body {
        Some((ct, bytes)) => {
            req = req.header("Content-Type", ct);
            bytes
        }
        None => Vec::new(),
    };
    let resp = send
        .send_request(req.body(Full::new(Bytes::from(payload))).expect("request"))
        .await
        .expect("response");
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("Content-Type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = tokio::time::timeout(Duration::from_secs(20), resp.into_body().collect())
        .await
        .expect("body in time")
        .expect("body")
        .to_bytes();
    Answer {
        status,
        content_type,
        body,
    }
}

/// Sends `msg` as controller-runtime does: protobuf in, protobuf preferred
/// out.
async fn send_protobuf(
    c: &SimCluster,
    method: &str,
    path: &str,
    api_version: &str,
    kind: &str,
    msg: &impl Message,
) -> Answer {
    call(
        c,
        method,
        path,
        CONTROLLER_RUNTIME_ACCEPT,
        Some((PROTOBUF, envelope(api_version, kind, msg))),
    )
    .await
}

async fn cluster() -> SimCluster {
    let c = SimCluster::start(SimOptions {
        time_scale: 20.0,
        ..SimOptions::default()
    })
    .await
    .expect("start");
    c.add_node("worker-1").expect("node");
    c
}

fn pod(name: &str) -> core::Pod {
    core::Pod {
        metadata: Some(meta::ObjectMeta {
            name: s(name),
            namespace: s("default"),
            ..Default::default()
        }),
        spec: Some(core::PodSpec {
            containers: vec![core::Container {
                name: s("app"),
                image: s("busybox"),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protobuf_only_client_creates_reads_lists_and_deletes() {
    let c = cluster().await;
    // Create: protobuf in, protobuf out, with the server's defaults.
    let a = send_protobuf(
        &c,
        "POST",
        "/api/v1/namespaces/default/pods",
        "v1",
        "Pod",
        &pod("p1"),
    )
    .await;
    assert_eq!(a.status, 201, "{:?}", String::from_utf8_lossy(&a.body));
    assert_eq!(a.content_type, PROTOBUF);
    let (av, kind, raw) = open_envelope(&a.body);
    assert_eq!((av.as_str(), kind.as_str()), ("v1", "Pod"));
    let created = core::Pod::decode(raw.as_slice()).expect("a Pod");
    let meta = created.metadata.as_ref().expect("metadata");
    assert!(meta.uid.as_deref().is_some_and(|u| !u.is_empty()));
    assert!(meta.creation_timestamp.and_then(|t| t.seconds).unwrap_or(0) > 1_700_000_000);
    let spec = created.spec.as_ref().expect("spec");
    assert_eq!(
        spec.termination_grace_period_seconds,
        Some(30),
        "API default"
    );
    assert_eq!(
        spec.restart_policy.as_deref(),
        Some("Always"),
        "API default"
    );

    // Get and list.
    let a = call(
        &c,
        "GET",
        "/api/v1/namespaces/default/pods/p1",
        PROTOBUF,
        None,
    )
    .await;
    assert_eq!((a.status, a.content_type.as_str()), (200, PROTOBUF));
    let a = call(&c, "GET", "/api/v1/namespaces/default/pods", PROTOBUF, None).await;
    let (_, kind, raw) = open_envelope(&a.body);
    assert_eq!(kind, "PodList");
    let list = core::PodList::decode(raw.as_slice()).expect("a PodList");
    assert_eq!(list.items.len(), 1);
    assert!(list.metadata.and_then(|m| m.resource_version).is_some());

    // A 404 is a protobuf Status.
    let a = call(
        &c,
        "GET",
        "/api/v1/namespaces/default/pods/nope",
        PROTOBUF,
        None,
    )
    .await;
    assert_eq!(a.status, 404);
    let (_, kind, raw) = open_envelope(&a.body);
    assert_eq!(kind, "Status");
    let status = meta::Status::decode(raw.as_slice()).expect("a Status");
    assert_eq!(status.reason.as_deref(), Some("NotFound"));
    assert_eq!(status.code, Some(404));

    // Delete with protobuf DeleteOptions: gracePeriodSeconds 0 is immediate.
    let opts = meta::DeleteOptions {
        grace_period_seconds: Some(0),
        propagation_policy: s("Background"),
        ..Default::default()
    };
    let a = send_protobuf(
        &c,
        "DELETE",
        "/api/v1/namespaces/default/pods/p1",
        "meta.k8s.io/v1",
        "DeleteOptions",
        &opts,
    )
    .await;
    assert_eq!(a.status, 200, "{:?}", String::from_utf8_lossy(&a.body));
    let a = call(
        &c,
        "GET",
        "/api/v1/namespaces/default/pods/p1",
        PROTOBUF,
        None,
    )
    .await;
    assert_eq!(a.status, 404, "gone at once with gracePeriodSeconds 0");
    c.stop().await;
}

/// An Event created with a protobuf body.
async fn event_in_protobuf(c: &SimCluster) {
    let event = core::Event {
        metadata: Some(meta::ObjectMeta {
            name: s("leader.1"),
            namespace: s("default"),
            ..Default::default()
        }),
        involved_object: Some(core::ObjectReference {
            kind: s("Lease"),
            name: s("leader"),
            namespace: s("default"),
            ..Default::default()
        }),
        reason: s("LeaderElection"),
        message: s("manager-2 became leader"),
        r#type: s("Normal"),
        count: Some(1),
        ..Default::default()
    };
    let a = send_protobuf(
        c,
        "POST",
        "/api/v1/namespaces/default/events",
        "v1",
        "Event",
        &event,
    )
    .await;
    assert_eq!(a.status, 201, "{:?}", String::from_utf8_lossy(&a.body));
}

/// An eviction with a protobuf body, answered with a protobuf Status.
async fn eviction_in_protobuf(c: &SimCluster) {
    send_protobuf(
        c,
        "POST",
        "/api/v1/namespaces/default/pods",
        "v1",
        "Pod",
        &pod("victim"),
    )
    .await;
    let eviction = policy::Eviction {
        metadata: Some(meta::ObjectMeta {
            name: s("victim"),
            namespace: s("default"),
            ..Default::default()
        }),
        delete_options: None,
    };
    let a = send_protobuf(
        c,
        "POST",
        "/api/v1/namespaces/default/pods/victim/eviction",
        "policy/v1",
        "Eviction",
        &eviction,
    )
    .await;
    assert_eq!(a.status, 201, "{:?}", String::from_utf8_lossy(&a.body));
    let (_, kind, raw) = open_envelope(&a.body);
    assert_eq!(kind, "Status");
    assert_eq!(
        meta::Status::decode(raw.as_slice())
            .expect("Status")
            .status
            .as_deref(),
        Some("Success")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_events_and_evictions_in_protobuf() {
    let c = cluster().await;
    let lease = coordination::Lease {
        metadata: Some(meta::ObjectMeta {
            name: s("leader"),
            namespace: s("default"),
            ..Default::default()
        }),
        spec: Some(coordination::LeaseSpec {
            holder_identity: s("manager-1"),
            lease_duration_seconds: Some(15),
            renew_time: Some(meta::MicroTime {
                seconds: Some(1_796_032_800),
                nanos: Some(5_000),
            }),
            ..Default::default()
        }),
    };
    let a = send_protobuf(
        &c,
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases",
        "coordination.k8s.io/v1",
        "Lease",
        &lease,
    )
    .await;
    assert_eq!(a.status, 201, "{:?}", String::from_utf8_lossy(&a.body));
    let (_, _, raw) = open_envelope(&a.body);
    let mut stored = coordination::Lease::decode(raw.as_slice()).expect("a Lease");
    assert_eq!(
        stored.spec.as_ref().and_then(|s| s.renew_time),
        lease.spec.as_ref().and_then(|s| s.renew_time)
    );
    // Update (PUT) with the resourceVersion, as leader election renews.
    if let Some(spec) = stored.spec.as_mut() {
        spec.holder_identity = s("manager-2");
    }
    let a = send_protobuf(
        &c,
        "PUT",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases/leader",
        "coordination.k8s.io/v1",
        "Lease",
        &stored,
    )
    .await;
    assert_eq!(a.status, 200, "{:?}", String::from_utf8_lossy(&a.body));
    // A stale one is a protobuf 409.
    let a = send_protobuf(
        &c,
        "PUT",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases/leader",
        "coordination.k8s.io/v1",
        "Lease",
        &stored,
    )
    .await;
    assert_eq!(a.status, 409);
    assert_eq!(open_envelope(&a.body).1, "Status");

    event_in_protobuf(&c).await;
    eviction_in_protobuf(&c).await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protobuf_watch_is_length_prefixed_watch_events() {
    let c = cluster().await;
    let stream = tokio::net::TcpStream::connect(c.addr())
        .await
        .expect("connect");
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .uri("/api/v1/namespaces/default/pods?watch=true&allowWatchBookmarks=true")
        .header("Host", "127.0.0.1")
        .header("Accept", CONTROLLER_RUNTIME_ACCEPT)
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = send.send_request(req).await.expect("response");
    assert_eq!(
        resp.headers()
            .get("Content-Type")
            .and_then(|v| v.to_str().ok()),
        Some("application/vnd.kubernetes.protobuf;stream=watch")
    );
    let mut body = resp.into_body();
    send_protobuf(
        &c,
        "POST",
        "/api/v1/namespaces/default/pods",
        "v1",
        "Pod",
        &pod("watched"),
    )
    .await;
    let mut buf: Vec<u8> = Vec::new();
    let mut seen: Vec<(String, String)> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    // ADDED, then MODIFIED as the scheduler binds it.
    while !seen.iter().any(|(t, _)| t == "MODIFIED") {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .expect("events in time")
            .expect("stream open")
            .expect("frame");
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
        }
        while buf.len() >= 4 {
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if buf.len() < 4 + len {
                break;
            }
            // A bare WatchEvent, as the real stream sends (client-go's
            // decoder reads the frame as one); only its object is wrapped.
            let frame = &buf[4..4 + len];
            assert!(
                !frame.starts_with(b"k8s\0"),
                "a watch frame carries no envelope"
            );
            let event = meta::WatchEvent::decode(frame).expect("a WatchEvent");
            let inner = event.object.and_then(|o| o.raw).expect("object");
            let (_, kind, raw) = open_envelope(&inner);
            let event_type = event.r#type.unwrap_or_default();
            if event_type != "BOOKMARK" {
                assert_eq!(kind, "Pod");
                let p = core::Pod::decode(raw.as_slice()).expect("a Pod");
                seen.push((
                    event_type,
                    p.metadata.and_then(|m| m.name).unwrap_or_default(),
                ));
            }
            buf.drain(..4 + len);
        }
    }
    assert_eq!(seen[0], ("ADDED".to_owned(), "watched".to_owned()));
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_stay_json_and_garbage_is_a_400() {
    let c = cluster().await;
    c.apply_yaml(include_str!(
        "../../../deploy/crd/nodemaintenance.medik8s.io_nodemaintenances.yaml"
    ))
    .expect("CRD");
    // Only protobuf accepted, for a kind that has none: 406, as a real server.
    let a = call(
        &c,
        "GET",
        "/apis/nodemaintenance.medik8s.io/v1beta1/nodemaintenances",
        PROTOBUF,
        None,
    )
    .await;
    assert_eq!(a.status, 406, "{:?}", String::from_utf8_lossy(&a.body));
    // With `*/*` as controller-runtime sends: JSON.
    let a = call(
        &c,
        "GET",
        "/apis/nodemaintenance.medik8s.io/v1beta1/nodemaintenances",
        CONTROLLER_RUNTIME_ACCEPT,
        None,
    )
    .await;
    assert_eq!(
        (a.status, a.content_type.as_str()),
        (200, "application/json")
    );
    // A body that is not protobuf, or is cut short, or names an unknown kind.
    for body in [
        b"{\"kind\":\"Pod\"}".to_vec(),
        envelope("v1", "Pod", &pod("cut"))[..20].to_vec(),
        envelope("v1", "NoSuchKind", &pod("x")),
    ] {
        let a = call(
            &c,
            "POST",
            "/api/v1/namespaces/default/pods",
            CONTROLLER_RUNTIME_ACCEPT,
            Some((PROTOBUF, body)),
        )
        .await;
        assert_eq!(a.status, 400, "{:?}", String::from_utf8_lossy(&a.body));
    }
    // The server is still fine.
    let a = call(&c, "GET", "/api/v1/namespaces/default/pods", PROTOBUF, None).await;
    assert_eq!(a.status, 200);
    c.stop().await;
}
