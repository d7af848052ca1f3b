//! kube-rs against the simulated cluster: watches, optimistic concurrency,
//! evictions under a PodDisruptionBudget, pagination, and each fault switch.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{
    Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::runtime::watcher;
use kube::{Client, Config};
use nmo_sim::{FaultRule, SimCluster, SimOptions};
use serde_json::json;

async fn start(opts: SimOptions) -> (SimCluster, Client) {
    let c = SimCluster::start(opts).await.expect("start");
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&c.kubeconfig()).expect("kubeconfig");
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    // kube 5 retries 429s up to 15 times by default; these tests look at
    // what the server answers.
    config.default_retry = false;
    let client = Client::try_from(config).expect("client");
    (c, client)
}

fn cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"suite": "kube"}},
        "data": {"v": value},
    }))
    .unwrap()
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

#[tokio::test]
async fn a_watcher_sees_every_change_in_order() {
    let (c, client) = start(SimOptions::default()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &cm("before", "0"))
        .await
        .unwrap();

    let mut events = watcher(cms.clone(), watcher::Config::default().labels("suite=kube")).boxed();
    // The initial list.
    let mut seen = Vec::new();
    loop {
        match events.try_next().await.unwrap().unwrap() {
            watcher::Event::InitDone => break,
            watcher::Event::InitApply(o) => seen.push(format!("init {}", o.metadata.name.unwrap())),
            _ => {}
        }
    }
    assert_eq!(seen, ["init before"]);

    cms.create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap();
    for v in 2..=4 {
        cms.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": v.to_string()}})),
        )
        .await
        .unwrap();
    }
    cms.delete("a", &DeleteParams::default()).await.unwrap();

    let mut changes = Vec::new();
    while changes.len() < 5 {
        let ev = tokio::time::timeout(Duration::from_secs(5), events.try_next())
            .await
            .expect("event in time")
            .unwrap()
            .unwrap();
        match ev {
            watcher::Event::Apply(o) => changes.push(format!("apply {}", o.data.unwrap()["v"])),
            watcher::Event::Delete(o) => {
                changes.push(format!("delete {}", o.metadata.name.unwrap()))
            }
            _ => {}
        }
    }
    assert_eq!(
        changes,
        ["apply 1", "apply 2", "apply 3", "apply 4", "delete a"]
    );
    c.stop().await;
}

#[tokio::test]
async fn a_stale_update_gets_409_and_resource_versions_grow() {
    let (c, client) = start(SimOptions::default()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let first = cms
        .create(&PostParams::default(), &cm("x", "1"))
        .await
        .unwrap();
    let mut newer = first.clone();
    newer.data = Some([("v".to_string(), "2".to_string())].into());
    let second = cms
        .replace("x", &PostParams::default(), &newer)
        .await
        .unwrap();
    let rv = |o: &ConfigMap| {
        o.metadata
            .resource_version
            .clone()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert!(rv(&second) > rv(&first));

    let mut stale = first.clone();
    stale.data = Some([("v".to_string(), "3".to_string())].into());
    let err = cms
        .replace("x", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(409), "{err}");
    assert!(
        err.to_string().contains("the object has been modified"),
        "{err}"
    );
    assert_eq!(cms.get("x").await.unwrap().data.unwrap()["v"], "2");

    let err = cms
        .create(&PostParams::default(), &cm("x", "9"))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(409));
    assert!(err.to_string().contains("already exists"), "{err}");
    let err = cms.get("nope").await.unwrap_err();
    assert_eq!(api_code(&err), Some(404));
    c.stop().await;
}

#[tokio::test]
async fn lists_paginate_and_filter() {
    let (c, client) = start(SimOptions::default()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    for i in 0..25 {
        cms.create(
            &PostParams::default(),
            &cm(&format!("cm-{i:02}"), &i.to_string()),
        )
        .await
        .unwrap();
    }
    let mut names = Vec::new();
    let mut lp = ListParams::default().labels("suite=kube").limit(10);
    loop {
        let page = cms.list(&lp).await.unwrap();
        assert!(page.items.len() <= 10);
        names.extend(page.items.into_iter().map(|o| o.metadata.name.unwrap()));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
            _ => break,
        }
    }
    assert_eq!(names.len(), 25);
    let one = cms
        .list(&ListParams::default().fields("metadata.name=cm-07"))
        .await
        .unwrap();
    assert_eq!(one.items.len(), 1);
    c.stop().await;
}

async fn wait_until<F: Fn() -> Fut, Fut: std::future::Future<Output = bool>>(what: &str, f: F) {
    let started = Instant::now();
    while !f().await {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn eviction_is_refused_under_a_pdb_until_a_replacement_is_ready() {
    let (c, client) = start(SimOptions {
        time_scale: 10.0,
        ..SimOptions::default()
    })
    .await;
    c.add_node("worker-1").unwrap();
    c.add_node("worker-2").unwrap();
    c.apply_yaml(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: db\n  namespace: default\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {app: db}\n  template:\n    metadata:\n      labels: {app: db}\n    spec:\n      containers:\n      - name: db\n        image: db\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: db\n  namespace: default\nspec:\n  minAvailable: 1\n  selector:\n    matchLabels: {app: db}\n",
    )
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let ready = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    let ready_count = || async {
        pods.list(&ListParams::default().labels("app=db"))
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| ready(p) && p.metadata.deletion_timestamp.is_none())
            .count()
    };
    wait_until("one ready db pod", || async { ready_count().await == 1 }).await;
    let victim = pods
        .list(&ListParams::default().labels("app=db"))
        .await
        .unwrap()
        .items[0]
        .metadata
        .name
        .clone()
        .unwrap();

    let err = pods
        .evict(&victim, &EvictParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(429), "{err}");
    assert!(
        err.to_string()
            .contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "{err}"
    );

    let deploys: Api<Deployment> = Api::namespaced(client, "default");
    deploys
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    wait_until("two ready db pods", || async { ready_count().await == 2 }).await;
    pods.evict(&victim, &EvictParams::default())
        .await
        .expect("eviction allowed now");
    // Gone after its grace period; the Deployment replaces it.
    wait_until("the evicted pod gone", || async {
        pods.get_opt(&victim).await.unwrap().is_none()
    })
    .await;
    wait_until("a replacement", || async { ready_count().await == 2 }).await;
    c.stop().await;
}

#[tokio::test]
async fn injected_errors_reach_the_client() {
    let (c, client) = start(SimOptions::default()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &cm("x", "1"))
        .await
        .unwrap();
    for code in [500u16, 409] {
        c.set_faults(|f| {
            f.rules = vec![FaultRule {
                verb: Some("get".into()),
                resource: Some("configmaps".into()),
                rate: 1.0,
                code,
            }]
        });
        let err = cms.get("x").await.unwrap_err();
        assert_eq!(api_code(&err), Some(code), "{err}");
    }
    // Other verbs and resources are untouched by a targeted rule.
    assert_eq!(
        cms.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    c.set_faults(|f| f.rules.clear());
    assert!(cms.get("x").await.is_ok());
    c.stop().await;
}

#[tokio::test]
async fn injected_429s_carry_retry_after() {
    let (c, _client) = start(SimOptions::default()).await;
    c.set_faults(|f| {
        f.rules = vec![FaultRule {
            verb: None,
            resource: Some("configmaps".into()),
            rate: 1.0,
            code: 429,
        }]
    });
    // A raw request shows the header client-go and kube honour.
    let out = tokio::process::Command::new("curl")
        .args([
            "-s",
            "-i",
            &format!("{}/api/v1/namespaces/default/configmaps", c.url()),
        ])
        .output()
        .await;
    if let Ok(out) = out {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("HTTP/1.1 429"), "{text}");
        assert!(
            text.to_ascii_lowercase().contains("retry-after: 1"),
            "{text}"
        );
    }
    c.stop().await;
}

#[tokio::test]
async fn injected_latency_slows_every_request() {
    let (c, client) = start(SimOptions::default()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    c.set_faults(|f| f.latency = Duration::from_millis(200));
    let started = Instant::now();
    cms.list(&ListParams::default()).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200));
    c.stop().await;
}

#[tokio::test]
async fn dropped_watches_end_and_a_watcher_recovers() {
    let (c, client) = start(SimOptions::default()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    c.set_faults(|f| f.drop_watches_after = Some(Duration::from_millis(300)));
    let stream = cms.watch(&WatchParams::default(), "0").await.unwrap();
    let started = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(5), stream.collect::<Vec<_>>()).await;
    assert!(ended.is_ok(), "the watch stream ended by itself");
    assert!(started.elapsed() < Duration::from_secs(5));
    // kube's watcher re-watches and still delivers changes.
    let mut events = watcher(cms.clone(), watcher::Config::default()).boxed();
    cms.create(&PostParams::default(), &cm("late", "1"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    cms.create(&PostParams::default(), &cm("later", "2"))
        .await
        .unwrap();
    let mut names = std::collections::HashSet::new();
    while !names.contains("later") {
        let ev = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("event")
            .expect("stream");
        if let Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) = ev {
            names.insert(o.metadata.name.unwrap());
        }
    }
    assert!(names.contains("late"));
    c.stop().await;
}

#[tokio::test]
async fn a_watch_from_a_compacted_version_gets_410() {
    let (c, client) = start(SimOptions {
        watch_history: 5,
        ..SimOptions::default()
    })
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    for i in 0..20 {
        cms.create(&PostParams::default(), &cm(&format!("c{i}"), "x"))
            .await
            .unwrap();
    }
    let mut stream = cms
        .watch(&WatchParams::default(), "2")
        .await
        .unwrap()
        .boxed();
    match stream.next().await {
        Some(Ok(WatchEvent::Error(e))) => assert_eq!(e.code, 410, "{e:?}"),
        Some(Err(e)) => assert!(
            e.to_string().contains("410") || e.to_string().contains("too old"),
            "{e}"
        ),
        other => panic!("expected 410 Gone, got {other:?}"),
    }
    c.stop().await;
}

#[tokio::test]
async fn a_paused_kubelet_leaves_pods_pending_and_terminating() {
    let (c, client) = start(SimOptions::default()).await;
    c.add_node("worker-1").unwrap();
    c.set_faults(|f| f.kubelet_paused = true);
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_until("scheduled", || async {
        pods.get("p")
            .await
            .unwrap()
            .spec
            .and_then(|s| s.node_name)
            .is_some()
    })
    .await;
    let p = pods.get("p").await.unwrap();
    assert_eq!(
        p.spec.unwrap().node_name.as_deref(),
        Some("worker-1"),
        "scheduled"
    );
    assert_eq!(
        p.status.unwrap().phase.as_deref(),
        Some("Pending"),
        "but not started"
    );
    c.set_faults(|f| f.kubelet_paused = false);
    wait_until("running", || async {
        pods.get("p")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref()
            == Some("Running")
    })
    .await;
    c.set_faults(|f| f.kubelet_paused = true);
    pods.delete("p", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(
        pods.get("p")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some(),
        "stuck terminating"
    );
    c.set_faults(|f| f.kubelet_paused = false);
    wait_until("gone", || async {
        pods.get_opt("p").await.unwrap().is_none()
    })
    .await;
    c.stop().await;
}

/// A list of one node's pods is answered from the node index: it must
/// still honour the namespace, other selectors, pagination, deleted pods,
/// pods on no node, a node whose name another's begins with, and a node
/// name nothing is on.
#[tokio::test]
async fn a_list_of_one_nodes_pods_is_exact() {
    let (c, client) = start(SimOptions::default()).await;
    c.add_node("a").unwrap();
    c.add_node("ab").unwrap();
    c.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}}))
        .unwrap();
    for (ns, name, node, app) in [
        ("default", "p1", Some("a"), "x"),
        ("default", "p2", Some("ab"), "x"),
        ("other", "p3", Some("a"), "y"),
        ("default", "p4", None, "x"),
        ("default", "p5", Some("a"), "y"),
    ] {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
            "spec": {"containers": [{"name": "c", "image": "i"}],
                     "nodeSelector": {"nowhere": "true"}},
        });
        if let Some(n) = node {
            pod["spec"]["nodeName"] = json!(n);
        }
        c.create(pod).unwrap();
    }
    let names = |api: Api<Pod>, lp: ListParams| async move {
        let mut names: Vec<String> = api
            .list(&lp)
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect();
        names.sort();
        names
    };
    let all: Api<Pod> = Api::all(client.clone());
    let default: Api<Pod> = Api::namespaced(client.clone(), "default");
    let on_a = ListParams::default().fields("spec.nodeName=a");
    assert_eq!(names(all.clone(), on_a.clone()).await, ["p1", "p3", "p5"]);
    assert_eq!(names(default.clone(), on_a.clone()).await, ["p1", "p5"]);
    assert_eq!(
        names(all.clone(), on_a.clone().labels("app=y")).await,
        ["p3", "p5"]
    );
    assert_eq!(
        names(
            all.clone(),
            ListParams::default().fields("spec.nodeName=a,metadata.namespace!=other")
        )
        .await,
        ["p1", "p5"]
    );
    assert!(
        names(
            all.clone(),
            ListParams::default().fields("spec.nodeName=nowhere")
        )
        .await
        .is_empty()
    );
    assert_eq!(
        names(all.clone(), ListParams::default().fields("spec.nodeName=")).await,
        ["p4"]
    );
    // Pages of one over the index keep their order and lose nothing.
    let page = all.list(&on_a.clone().limit(1)).await.unwrap();
    assert_eq!(page.items.len(), 1);
    let token = page.metadata.continue_.clone().expect("more to come");
    let rest = all
        .list(&on_a.clone().continue_token(&token))
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 2);
    // Deleted at once (no kubelet delay with a zero grace period): gone
    // from the index.
    default
        .delete(
            "p1",
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    wait_until("p1 gone", || {
        let all = all.clone();
        let on_a = on_a.clone();
        async move { !names(all, on_a).await.contains(&"p1".to_owned()) }
    })
    .await;
    assert_eq!(names(all.clone(), on_a.clone()).await, ["p3", "p5"]);
}
