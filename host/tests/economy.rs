//! What one maintenance costs the API server and the policy: the requests
//! the operator makes (counted by the simulated server's audit log, by the
//! operator's User-Agent) and the policy calls (counted by the
//! controller's own registry), for a 20-pod node.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use kube::Api;
use kube::api::PostParams;
use nmo::crd::NodeMaintenance;

const PODS: usize = 20;

/// A client of the test itself, told apart from the operator's in the audit.
async fn test_client(env: &Env) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&env.cluster.kubeconfig()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.headers.push((
        hyper::header::USER_AGENT,
        hyper::header::HeaderValue::from_static("economy-test"),
    ));
    kube::Client::try_from(config).unwrap()
}

/// The rewind check's request (a one-item list of NodeMaintenances every
/// `Settings::rewind_check`), made whatever the maintenances do.
const REWIND_CHECK: &str = "list nodemaintenances";

/// The operator's requests so far, by `verb resource[/subresource]`,
/// without the periodic rewind check.
fn operator_requests(env: &Env) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for r in env.cluster.audit() {
        if r.user_agent != nmo::client::USER_AGENT {
            continue;
        }
        let what = if r.subresource.is_empty() {
            format!("{} {}", r.verb, r.resource)
        } else {
            format!("{} {}/{}", r.verb, r.resource, r.subresource)
        };
        if what != REWIND_CHECK {
            *counts.entry(what).or_default() += 1;
        }
    }
    counts
}

/// Waits until the operator has made no request for `quiet` (it is done
/// with what the maintenance started), within `limit`.
async fn settle(env: &Env, quiet: Duration, limit: Duration) -> BTreeMap<String, usize> {
    let started = Instant::now();
    let mut last = operator_requests(env);
    let mut since = Instant::now();
    loop {
        assert!(
            started.elapsed() < limit,
            "the operator never settled: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = operator_requests(env);
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            return last;
        }
    }
}

/// The operator's requests over at least `window` (a measuring window,
/// not a verdict: the assertions are on the counts): how many of each,
/// and how long it was in seconds.
async fn requests_over(env: &Env, window: Duration) -> (BTreeMap<String, usize>, f64) {
    env.cluster.record_audit(true);
    let start = operator_requests(env);
    let started = Instant::now();
    wait_until(
        "the measuring window",
        window + Duration::from_secs(30),
        || async { started.elapsed() >= window },
    )
    .await;
    let elapsed = started.elapsed().as_secs_f64();
    let end = operator_requests(env);
    let delta = end
        .iter()
        .map(|(k, n)| (k.clone(), n - start.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    (delta, elapsed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_twenty_pod_maintenance_costs_one_plan_and_few_requests() {
    let env = Env::start(2).await;
    for i in 0..PODS {
        env.cluster
            .create(bare(
                &format!("p-{i:02}"),
                "worker-1",
                serde_json::json!({}),
                30,
            ))
            .unwrap();
    }
    let client = test_client(&env).await;
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    // The controller is up and idle before counting.
    settle(&env, Duration::from_millis(500), Duration::from_secs(20)).await;
    env.cluster.record_audit(true);

    let nm = common::nm("economy", "worker-1");
    nms.create(&PostParams::default(), &nm).await.unwrap();
    wait_succeeded(&nms, "economy", Duration::from_secs(30)).await;
    let counts = settle(&env, Duration::from_secs(1), Duration::from_secs(30)).await;

    let total: usize = counts.values().sum();
    let plans = policy_calls(&env.metrics.policy, Decision::PlanDrain);
    let verdicts = policy_calls(&env.metrics.policy, Decision::OnFailure);
    println!(
        "one {PODS}-pod maintenance: {total} API requests, {plans} plan(s), {verdicts} verdict(s)"
    );
    for (what, n) in &counts {
        println!("  {n:>3}  {what}");
    }
    let count = |what: &str| counts.get(what).copied().unwrap_or(0);

    // The policy is asked once: the plan is the status's and the drain's.
    assert_eq!(plans, 1);
    assert_eq!(verdicts, 0);
    // One eviction per pod, one list and one watch of the node's pods.
    assert_eq!(count("create pods/eviction"), PODS);
    assert_eq!(count("list pods"), 1, "{counts:?}");
    assert_eq!(count("watch pods"), 1, "{counts:?}");
    // Admission's fleet comes from the controller's node watch: no list
    // of the nodes per decision, however large the cluster.
    assert_eq!(count("list nodes"), 0, "{counts:?}");
    // The node: read once, marked in one patch.
    assert_eq!(count("get nodes"), 1, "{counts:?}");
    assert_eq!(count("patch nodes"), 1, "{counts:?}");
    // The maintenance: finalizer and owner reference in one patch; no
    // read of our own (our writes prove the object current).
    assert_eq!(count("patch nodemaintenances"), 1, "{counts:?}");
    assert_eq!(count("get nodemaintenances"), 0, "{counts:?}");
    // Status: the initialisation, the final write, and progress at most
    // every 250 ms in between.
    let status_writes = count("update nodemaintenances/status");
    assert!((2..=8).contains(&status_writes), "{counts:?}");
    // Two events: begin and succeeded.
    assert_eq!(count("create events"), 2, "{counts:?}");
    // Nothing else worth a line: the lease (read, its namespace, create).
    assert!(
        total <= PODS + 2 + 2 + 1 + 8 + 2 + 4,
        "{total} requests: {counts:?}"
    );
    env.stop().await;
}

/// An `admit` that waits with a reason that changes on every call (a
/// countdown) and asks to be asked again at once: once one event, one
/// status write, one node read and one node list a second per waiting
/// maintenance. Now the recheck has a floor (`admission_recheck_min`) and
/// the reason is written (status and `Waiting` event) at most once per
/// `waiting_update_interval` (2 s here, the floor 100 ms; 30 s and 2 s by
/// default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reason_that_changes_on_every_call_is_written_at_most_once_an_interval() {
    let (cluster, client) = start_cluster(2).await;
    let metrics = metrics();
    let policies = policy_store_counted(HOSTILE, metrics.policy.clone());
    let (_, controller) =
        start_controller_counted(&client, policies, metrics.controller.clone(), |s| {
            s.admission_recheck_min = Duration::from_millis(100);
            s.waiting_update_interval = Duration::from_secs(2);
        });
    let env = Env {
        cluster,
        client,
        controller,
        metrics,
        ctx: None,
    };
    env.cluster.record_audit(true);
    env.create_nm_with_reason("countdown", "worker-1", "admit-countdown")
        .await;
    env.wait_status("countdown", "waiting", |s| s.waiting.is_some())
        .await;
    let mine: Api<NodeMaintenance> = Api::all(test_client(&env).await);
    let first = mine.get("countdown").await.unwrap().status.unwrap();
    let start = operator_requests(&env);
    let started = Instant::now();
    // Watched for long enough that the old behaviour (a write a call)
    // would show many times over.
    wait_until("the reason rewritten", Duration::from_secs(30), || async {
        let now = mine.get("countdown").await.unwrap().status.unwrap();
        now.waiting.map(|w| w.reason) != first.waiting.as_ref().map(|w| w.reason.clone())
            && started.elapsed() >= Duration::from_secs(4)
    })
    .await;
    let elapsed = started.elapsed().as_secs_f64();
    let end = operator_requests(&env);
    let delta = |k: &str| end.get(k).copied().unwrap_or(0) - start.get(k).copied().unwrap_or(0);
    let writes = delta("update nodemaintenances/status");
    let events = delta("create events");
    let calls = nmo_policy_calls(&env);
    let allowed = (elapsed / 2.0).ceil() as usize + 1;
    println!(
        "a countdown reason over {elapsed:.1} s: {writes} status writes, {events} events, {calls} admit calls so far, {} requests",
        end.values().sum::<usize>() - start.values().sum::<usize>()
    );
    assert!(
        writes <= allowed,
        "{writes} status writes in {elapsed:.1} s"
    );
    assert!(events <= allowed, "{events} events in {elapsed:.1} s");
    // Each of those admit calls read the nodes from the watch: no list.
    assert_eq!(delta("list nodes"), 0, "{end:?}");
    // A pass of a waiting maintenance reads nothing: its node comes from
    // the node watch, itself from the controller's cache (a restart with
    // a thousand waiting maintenances was a storm of both reads).
    assert_eq!(delta("get nodes"), 0, "{end:?}");
    assert_eq!(delta("get nodemaintenances"), 0, "{end:?}");
    assert!(
        calls as f64 <= (elapsed + 1.0) / 0.1 + 5.0,
        "{calls} admit calls: the recheck floor does not hold"
    );
    env.stop().await;
}

fn nmo_policy_calls(env: &Env) -> u64 {
    policy_calls(&env.metrics.policy, Decision::Admit)
}

/// Passes of the controller so far, whatever their result.
fn passes(metrics: &nmo::controller::ControllerMetrics) -> u64 {
    use nmo::controller::ReconcileResult::*;
    [Success, Error, Requeue, RequeueAfter]
        .into_iter()
        .map(|r| metrics.reconciles(r))
        .sum()
}

/// A waiting maintenance whose policy gave no `recheck-after` is asked
/// again only when something the policy sees changes (the contract: "none:
/// only when the fleet changes"). Before, each of its passes (every
/// `admission_recheck`, 10 s by default) was a decision over every node
/// and every maintenance: a thousand waiting maintenances kept more than
/// half a core busy deciding the same answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_maintenance_is_asked_again_only_when_its_fleet_changes() {
    let (cluster, client) = start_cluster(3).await;
    let metrics = metrics();
    let engine = nmo::policy::PolicyEngine::observed(
        nmo::policy::EngineConfig::default(),
        metrics.policy.observer(),
    )
    .unwrap();
    let settings = BTreeMap::from([("max".to_owned(), "1".to_owned())]);
    let policy = engine
        .load("max-unavailable", &built_policy("max_unavailable"))
        .unwrap()
        .with_settings(nmo::policy::Settings::from_map(&settings))
        .unwrap();
    let (_, controller) = start_controller_counted(
        &client,
        nmo::policy::PolicyStore::single(policy),
        metrics.controller.clone(),
        |s| {
            s.admission_recheck = Duration::from_millis(200);
            s.admission_recheck_min = Duration::from_millis(100);
        },
    );
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    create_nm_retrying(&nms, "first", "worker-1").await;
    wait_succeeded(&nms, "first", Duration::from_secs(60)).await;
    create_nm_retrying(&nms, "second", "worker-2").await;
    wait_until("second waits", Duration::from_secs(30), || async {
        nms.get("second")
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.waiting.is_some())
    })
    .await;

    // Ten passes of the waiting maintenance in a fleet that does not
    // change: at most one more decision (the pass after its own waiting
    // write, which changed the maintenance itself).
    let admits = policy_calls(&metrics.policy, nmo::policy::Decision::Admit);
    let before = passes(&metrics.controller);
    wait_until("ten more passes", Duration::from_secs(30), || async {
        passes(&metrics.controller) >= before + 10
    })
    .await;
    let asked = policy_calls(&metrics.policy, nmo::policy::Decision::Admit) - admits;
    assert!(
        asked <= 1,
        "{asked} decisions in 10 passes of an unchanged fleet"
    );

    // A change the policy sees (a node's label) asks it again.
    let settled = policy_calls(&metrics.policy, nmo::policy::Decision::Admit);
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    nodes
        .patch(
            "worker-3",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {"rack": "r7"}}})),
        )
        .await
        .unwrap();
    wait_until(
        "asked again after the change",
        Duration::from_secs(30),
        || async { policy_calls(&metrics.policy, nmo::policy::Decision::Admit) > settled },
    )
    .await;

    // The first one's end frees the place: the second goes.
    nms.delete("first", &Default::default()).await.unwrap();
    wait_succeeded(&nms, "second", Duration::from_secs(60)).await;
    cluster.stop().await;
    controller.abort();
}

/// The most of `records` in flight at one moment (arrived, not yet
/// answered).
fn most_in_flight(records: &[nmo_sim::AuditRecord]) -> usize {
    let mut edges: Vec<(Instant, i32)> = Vec::new();
    for r in records {
        let answered = r.answered.expect("every eviction was answered");
        edges.push((r.at, 1));
        edges.push((answered, -1));
    }
    // An answer and an arrival at the same instant: the answer first.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_drains_at_once_share_the_removals_in_flight() {
    // Three nodes of eight pods drained at once, every request taking
    // 100 ms: alone, each drain would send its eight evictions together.
    const NODES: usize = 3;
    const CAP: u16 = 4;
    let (cluster, client) = start_cluster(NODES).await;
    let m = metrics();
    let policies = policy_store_counted(None, m.policy.clone());
    let (_ctx, controller) =
        start_controller_counted(&client, policies, m.controller.clone(), |s| {
            s.removals_in_flight = CAP;
        });
    for n in 1..=NODES {
        for i in 0..8 {
            cluster
                .create(bare(
                    &format!("w{n}-{i}"),
                    &format!("worker-{n}"),
                    serde_json::json!({}),
                    0,
                ))
                .unwrap();
        }
    }
    cluster.set_faults(|f| f.latency = Duration::from_millis(100));
    cluster.record_audit(true);
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    for n in 1..=NODES {
        let nm = NodeMaintenance::new(
            &format!("nm-{n}"),
            nmo::crd::NodeMaintenanceSpec {
                node_name: format!("worker-{n}"),
                reason: None,
            },
        );
        nms.create(&PostParams::default(), &nm).await.unwrap();
    }
    for n in 1..=NODES {
        wait_succeeded(&nms, &format!("nm-{n}"), Duration::from_secs(60)).await;
    }
    let evictions: Vec<_> = cluster
        .audit()
        .into_iter()
        .filter(|r| r.user_agent == nmo::client::USER_AGENT && r.subresource == "eviction")
        .collect();
    let mut sent: BTreeMap<&str, Vec<u16>> = BTreeMap::new();
    for r in &evictions {
        sent.entry(r.name.as_str()).or_default().push(r.code);
    }
    sent.retain(|_, codes| codes.len() > 1);
    assert_eq!(
        evictions.len(),
        NODES * 8,
        "one eviction a pod; evicted more than once (answers): {sent:?}"
    );
    let most = most_in_flight(&evictions);
    println!("at most {most} evictions in flight (cap {CAP})");
    assert!(most <= usize::from(CAP), "{most} evictions in flight");
    // The drains did overlap: the cap was reached, not a drain at a time.
    assert!(most > 1, "the drains ran one eviction at a time");
    controller.abort();
    cluster.stop().await;
}

/// Changes to the Deployments, ReplicaSets and pods of `default`, as a
/// watch sees them, counted from when [`ChangeCount::start`] returns.
struct ChangeCount {
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ChangeCount {
    async fn start(client: &kube::Client) -> Self {
        use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
        use k8s_openapi::api::core::v1::Pod;
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (synced_tx, mut synced_rx) = tokio::sync::mpsc::channel(3);
        let tasks = vec![
            Self::watch(
                Api::<Deployment>::namespaced(client.clone(), "default"),
                &count,
                &synced_tx,
            ),
            Self::watch(
                Api::<ReplicaSet>::namespaced(client.clone(), "default"),
                &count,
                &synced_tx,
            ),
            Self::watch(
                Api::<Pod>::namespaced(client.clone(), "default"),
                &count,
                &synced_tx,
            ),
        ];
        for _ in 0..tasks.len() {
            tokio::time::timeout(Duration::from_secs(30), synced_rx.recv())
                .await
                .expect("the change watches listed within 30 s");
        }
        Self { count, tasks }
    }

    fn watch<K>(
        api: Api<K>,
        count: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
        synced: &tokio::sync::mpsc::Sender<()>,
    ) -> tokio::task::JoinHandle<()>
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
        K::DynamicType: Default,
    {
        use futures::StreamExt;
        use kube::runtime::watcher;
        let (count, synced) = (count.clone(), synced.clone());
        tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::InitDone) => {
                        let _ = synced.send(()).await;
                    }
                    Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        })
    }

    /// The changes seen so far; the watches end.
    fn stop(self) -> usize {
        for t in &self.tasks {
            t.abort();
        }
        self.count.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A two-node cluster with the drain-action policies and `deployment`
/// (a manifest) applied.
async fn with_deployment(deployment: &str) -> (tempfile::TempDir, Env) {
    let (dir, store) = common::drain_actions::store();
    let env = Env::start_store(2, store).await;
    env.apply(deployment).await;
    (dir, env)
}

/// A surge waiting for its replacement looks at its owner when the owner
/// or its pods change, not on a clock. Before, each surge read the pod's
/// ReplicaSet and Deployment and listed the Deployment's pods every
/// 500 ms for as long as it waited (up to its attempt's 5 minutes, and
/// again at the next attempt): 6 requests a second for a replacement
/// that takes an hour to be Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surge_waiting_for_its_replacement_reads_nothing_while_nothing_changes() {
    // Pods that take a simulated day (over an hour here) to be Ready:
    // the replacement is never Ready while the test looks.
    let (_dir, env) = with_deployment(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: slow, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: slow}}
  template:
    metadata:
      labels: {app: slow}
      annotations: {sim.nmo.medik8s.io/startup-seconds: "86400"}
    spec: {containers: [{name: c, image: i}]}
"#,
    )
    .await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.client.clone(), "default");
    let placed = || async {
        pods.list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find_map(|p| p.spec.and_then(|s| s.node_name))
    };
    wait_until(
        "the Deployment's pod placed",
        Duration::from_secs(30),
        || async { placed().await.is_some() },
    )
    .await;
    let node = placed().await.unwrap();
    env.create_nm_with_policy("nm-slow", &node, Some("no-downtime"))
        .await;
    env.wait_status("nm-slow", "waiting for the replacement", |s| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("waiting for a Ready replacement"))
    })
    .await;
    // Long enough for the old clock (a look every 500 ms) to show many
    // times over. On a busy machine the simulated controllers may still
    // write the owner or its pods in the window: each such change may
    // cost one look (a Deployment GET and a pod list), no more.
    let changes = ChangeCount::start(&test_client(&env).await).await;
    let (counts, elapsed) = requests_over(&env, Duration::from_secs(3)).await;
    let changed = changes.stop();
    let count = |k: &str| counts.get(k).copied().unwrap_or(0);
    let reads = count("get deployments") + count("get replicasets") + count("list pods");
    let end = &counts;
    println!(
        "a surge waiting {elapsed:.1} s for its replacement: {reads} reads of its owner, \
         {changed} changes of it; {end:?}"
    );
    assert!(
        reads <= 3 + 2 * changed,
        "{reads} reads of the owner in {elapsed:.1} s while it changed {changed} times: {end:?}"
    );
    // Still waiting, and still says so.
    let status = env.nms().get("nm-slow").await.unwrap().status.unwrap();
    assert_eq!(status.phase, Some(nmo::crd::MaintenancePhase::Running));
    assert!(
        status
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("waiting for a Ready replacement")),
        "{status:?}"
    );
    env.stop().await;
}

/// A policy that retries as soon as the contract allows (`block-now`: a
/// pod blocked, a 1 ms attempt, `retry-after-ms: 0`, floored at 1 s) on
/// a drain that fails the same way each time: the status is renewed
/// (`lastUpdate`) at most once per `waiting_update_interval` (2 s here),
/// as every reason a policy gives is. Before, every retry wrote it: one
/// status write a second per maintenance for as long as it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_at_once_renews_the_status_at_most_once_an_interval() {
    let policies = policy_store_counted(HOSTILE, metrics().policy);
    let env = Env::start_tuned(2, policies, |s| {
        s.waiting_update_interval = Duration::from_secs(2);
    })
    .await;
    env.cluster
        .create(bare("held", "worker-1", serde_json::json!({}), 30))
        .unwrap();
    env.create_nm_with_reason("hammer", "worker-1", "block-now")
        .await;
    env.wait_status("hammer", "the blocked pod reported", |s| {
        s.last_error.is_some()
    })
    .await;
    let verdicts_before = policy_calls(&env.metrics.policy, Decision::OnFailure);
    // Long enough for a write a retry (one a second) to show.
    let (counts, elapsed) = requests_over(&env, Duration::from_secs(6)).await;
    let writes = counts
        .get("update nodemaintenances/status")
        .copied()
        .unwrap_or(0);
    let end = &counts;
    let retries = policy_calls(&env.metrics.policy, Decision::OnFailure) - verdicts_before;
    let allowed = (elapsed / 2.0).ceil() as usize + 1;
    println!("retries at once over {elapsed:.1} s: {retries} retries, {writes} status writes");
    // The retries did go on (the 1 s floor), the writes did not follow.
    assert!(retries >= 4, "{retries} retries in {elapsed:.1} s");
    assert!(
        writes <= allowed,
        "{writes} status writes for {retries} identical retries in {elapsed:.1} s: {end:?}"
    );
    env.stop().await;
}

/// The pods of one Deployment surged from one node leave together: the
/// replacements are asked for in one raise of the replicas, and the pods
/// whose replacements are Ready are handed over in one claim and one
/// lowering, so the owner is written a few times per maintenance, not
/// three times per pod (raise, claim, lower: before, each pod's own
/// turn, one after another, and each written over a read another had made
/// stale).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owners_pods_are_surged_in_rounds_not_one_by_one() {
    let (_dir, env) = with_deployment(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: wide, namespace: default}
spec:
  replicas: 16
  strategy: {rollingUpdate: {maxSurge: "100%"}}
  selector: {matchLabels: {app: wide}}
  template:
    metadata:
      labels: {app: wide}
      annotations: {sim.nmo.medik8s.io/startup-seconds: "2"}
    spec: {terminationGracePeriodSeconds: 1, containers: [{name: c, image: i}]}
"#,
    )
    .await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.client.clone(), "default");
    let ready_on = |node: &'static str| {
        let pods = pods.clone();
        async move {
            pods.list(&kube::api::ListParams::default().labels("app=wide"))
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .filter(|p| {
                            common::drain_actions::is_ready(p)
                                && p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                                    == Some(node)
                        })
                        .count()
                })
                .unwrap_or(0)
        }
    };
    wait_until("16 Ready pods", Duration::from_secs(60), || async {
        ready_on("worker-1").await + ready_on("worker-2").await >= 16
    })
    .await;
    let surged = ready_on("worker-1").await;
    assert!(
        surged >= 4,
        "the workload's pods spread: {surged} on worker-1"
    );
    env.cluster.record_audit(true);
    let before = env.cluster.audit().len();
    env.create_nm_with_policy("nm-wide", "worker-1", Some("no-downtime"))
        .await;
    wait_succeeded(&env.nms(), "nm-wide", Duration::from_secs(120)).await;
    let written: Vec<u16> = env.cluster.audit()[before..]
        .iter()
        .filter(|r| {
            r.user_agent == nmo::client::USER_AGENT
                && r.verb == "patch"
                && r.resource == "deployments"
        })
        .map(|r| r.code)
        .collect();
    let accepted = written.iter().filter(|c| **c < 300).count();
    println!(
        "{surged} pods of one Deployment surged: {accepted} writes of it accepted, {} sent",
        written.len()
    );
    assert!(
        accepted * 2 <= surged * 3,
        "{accepted} writes of the Deployment for {surged} surged pods \
         (one pod at a time takes three each): {written:?}"
    );
    assert_eq!(ready_on("worker-1").await, 0, "every pod left worker-1");
    assert!(
        ready_on("worker-2").await >= 16,
        "the replacements serve on worker-2"
    );
    env.stop().await;
}

/// A tenant heartbeating its pod's handshake ten times a second drives no
/// stream of writes: the deadline is written back once it has moved by
/// half an extension (here 15 s), and the status only when what it shows
/// changes. (Before: a pod patch a second and a status write at every
/// beat's new deadline, 233 status writes and 57 pod patches a minute.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_heartbeating_ten_times_a_second_drives_few_writes() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Patch, PatchParams};
    use serde_json::json;
    let (_dir, env) = common::drain_actions::sim(2).await;
    env.cluster
        .create(bare(
            "chatty",
            "worker-1",
            json!({"nmo.medik8s.io/handshake": "30s"}),
            1,
        ))
        .unwrap();
    env.create_nm_with_policy("nm-chatty", "worker-1", Some("no-downtime"))
        .await;
    // The tenant's client: its requests are not the operator's.
    let pods: Api<Pod> = Api::namespaced(test_client(&env).await, "default");
    wait_until("the application asked", Duration::from_secs(30), || async {
        pods.get("chatty")
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("nmo.medik8s.io/eviction-requested")
    })
    .await;
    env.cluster.record_audit(true);
    let start = operator_requests(&env);
    let started = Instant::now();
    let mut beats = 0;
    while started.elapsed() < Duration::from_secs(4) {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let beat = json!({"metadata": {"annotations": {"nmo.medik8s.io/eviction-heartbeat": now}}});
        pods.patch("chatty", &PatchParams::default(), &Patch::Merge(&beat))
            .await
            .unwrap();
        beats += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let end = operator_requests(&env);
    let delta = |k: &str| end.get(k).copied().unwrap_or(0) - start.get(k).copied().unwrap_or(0);
    let (patches, writes) = (delta("patch pods"), delta("update nodemaintenances/status"));
    println!(
        "{beats} heartbeats over {elapsed:.1} s: {patches} pod patches, {writes} status writes"
    );
    assert!(patches <= 1, "{patches} pod patches for {beats} heartbeats");
    assert!(writes <= 2, "{writes} status writes for {beats} heartbeats");
    // It answers: the drain goes on.
    let ready = json!({"metadata": {"annotations": {"nmo.medik8s.io/eviction-ready": "true"}}});
    pods.patch("chatty", &PatchParams::default(), &Patch::Merge(&ready))
        .await
        .unwrap();
    env.wait_phase("nm-chatty", nmo::crd::MaintenancePhase::Succeeded)
        .await;
    env.stop().await;
}
