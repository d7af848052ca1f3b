//! The invariant hunter: seeded, property-based (proptest) hostile
//! clusters on nmo-sim, checked against the promises docs/reliability.md
//! lists ("What the hunter checks").
//!
//! Each case builds a cluster of three workers with Deployments of one to
//! four replicas, each behind a budget or not (`minAvailable`,
//! `maxUnavailable: 0`), some with a forged surge record or a
//! `maxUnavailable` past any range, bare pods whose owner reference
//! cannot be read, a node a human cordoned first; runs a maintenance of
//! `worker-1` under a policy that evicts, surges, waits or forces; and
//! meanwhile a tenant's tool rewrites or removes surge records, or the
//! operator is killed and started again, or the maintenance is deleted
//! mid-drain. After every change it sees, and at the end, it checks:
//!
//! - no budget ever has fewer serving pods than it promises (surges
//!   included);
//! - a deleted maintenance gives the node back as the human left it, and
//!   every owner its replicas as they were;
//! - nothing a tenant wrote holds the drain: when every budget allows a
//!   disruption, the maintenance succeeds within its bound;
//! - a deleted maintenance is gone within its bound;
//! - the operator never panics.
//!
//! The test command runs [`CASES`] cases from a fixed seed; a long run:
//! `NMO_HUNT_CASES=500 cargo test -p nmo --test suite hunter::hunt_long --
//! --ignored --nocapture` (it prints the cases tried and the first
//! counterexample, shrunk; `NMO_HUNT_SEED` picks another seed).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use nmo::crd::MaintenancePhase;
use nmo::policy::PolicyStore;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::json;

use crate::common;
use common::drain_actions::{is_ready, store};
use common::promises::{annotation_owner, deployment};
use common::{ClusterOps, Env};

/// Cases in the test command.
const CASES: u32 = 24;
/// The seed of the test command's cases.
const SEED: u64 = 0x6e6d_6f2d_6875_6e74;
/// How long a maintenance every budget lets drain may take (real time, on
/// a busy machine; the drains here take a second or two).
const DRAIN_BOUND: Duration = Duration::from_secs(45);
/// How long a deleted maintenance may take to go.
const GONE_BOUND: Duration = Duration::from_secs(10);
/// The most writes the operator may make in one case (status updates,
/// node patches, pod patches, evictions and deletions, events): a drain of
/// at most 14 pods takes a few dozen; a loop writing without bound
/// (a status rewritten at every heartbeat, a retry with no floor) passes
/// this within seconds.
const WRITES_BOUND: usize = 400;

/// A budget over a Deployment's pods.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Budget {
    None,
    /// `minAvailable: n` (at most the replicas).
    MinAvailable(u32),
    /// `maxUnavailable: 0`: allows nothing, ever.
    Nothing,
}

#[derive(Clone, Debug)]
struct Workload {
    replicas: u32,
    budget: Budget,
    /// A surge record no surge wrote, claiming one replica.
    forged: bool,
    /// `maxUnavailable: 2147483647`.
    huge_unavailable: bool,
}

/// What happens while the drain runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Meddling {
    Nothing,
    /// A tool that owns annotations rewrites every surge record.
    RewriteRecords,
    /// ... or removes it.
    RemoveRecords,
    /// The operator is killed and started again once the drain runs.
    Restart,
    /// The maintenance is deleted once the drain runs.
    DeleteMidway,
}

#[derive(Clone, Debug)]
struct Case {
    policy: &'static str,
    workloads: Vec<Workload>,
    /// Bare pods on the node whose controller reference cannot be read.
    unreadable: u8,
    cordoned_by_hand: bool,
    meddling: Meddling,
}

fn workload() -> impl Strategy<Value = Workload> {
    (1u32..=4)
        .prop_flat_map(|replicas| {
            let budget = prop_oneof![
                Just(Budget::None),
                (1..=replicas).prop_map(Budget::MinAvailable),
                Just(Budget::Nothing),
            ];
            (
                Just(replicas),
                budget,
                proptest::bool::weighted(0.2),
                proptest::bool::weighted(0.2),
            )
        })
        .prop_map(|(replicas, budget, forged, huge_unavailable)| Workload {
            replicas,
            budget,
            forged,
            huge_unavailable,
        })
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![
            Just("default"),
            Just("no-downtime"),
            Just("single-surge"),
            Just("escalate"),
        ],
        proptest::collection::vec(workload(), 1..=3),
        0u8..=2,
        proptest::bool::weighted(0.25),
        prop_oneof![
            Just(Meddling::Nothing),
            Just(Meddling::RewriteRecords),
            Just(Meddling::RemoveRecords),
            Just(Meddling::Restart),
            Just(Meddling::DeleteMidway),
        ],
    )
        .prop_map(
            |(policy, workloads, unreadable, cordoned_by_hand, meddling)| Case {
                policy,
                workloads,
                unreadable,
                cordoned_by_hand,
                meddling,
            },
        )
}

/// The promises checked while a case runs: the budgets' floors, from a
/// watch of every pod.
struct Floors {
    task: tokio::task::JoinHandle<()>,
    broken: Arc<Mutex<Vec<String>>>,
}

impl Floors {
    /// Watches the pods of `apps` (name, least serving pods promised).
    fn watch(client: &Client, apps: Vec<(String, usize)>) -> Floors {
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let broken = Arc::new(Mutex::new(Vec::new()));
        let said = broken.clone();
        let task = tokio::spawn(async move {
            let mut serving: BTreeMap<String, (String, bool)> = BTreeMap::new();
            let mut listed = false;
            let mut events = watcher(pods, watcher::Config::default()).boxed();
            while let Some(Ok(e)) = events.next().await {
                match e {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        let app = p.labels().get("app").cloned().unwrap_or_default();
                        let up = is_ready(&p) && p.metadata.deletion_timestamp.is_none();
                        serving.insert(p.uid().unwrap_or_default(), (app, up));
                    }
                    watcher::Event::Delete(p) => {
                        serving.remove(&p.uid().unwrap_or_default());
                    }
                    watcher::Event::Init => {}
                    watcher::Event::InitDone => listed = true,
                }
                if !listed {
                    continue;
                }
                for (app, floor) in &apps {
                    let n = serving.values().filter(|(a, up)| a == app && *up).count();
                    if n < *floor {
                        said.lock()
                            .unwrap()
                            .push(format!("{app}: {n} serving, its budget promises {floor}"));
                    }
                }
            }
        });
        Floors { task, broken }
    }

    fn stop(self) -> Vec<String> {
        self.task.abort();
        self.broken.lock().unwrap().clone()
    }
}

fn pdb(app: &str, budget: Budget) -> Option<serde_json::Value> {
    let spec = match budget {
        Budget::None => return None,
        Budget::MinAvailable(n) => json!({"minAvailable": n}),
        Budget::Nothing => json!({"maxUnavailable": 0}),
    };
    let mut spec = spec;
    spec["selector"] = json!({"matchLabels": {"app": app}});
    Some(
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": app, "namespace": "default"}, "spec": spec}),
    )
}

/// The cluster of a case, as built: its apps with their replicas and
/// floors, and the node as the human left it.
struct Built {
    apps: Vec<(String, u32, usize)>,
    node_before: Node,
}

async fn build(env: &Env, case: &Case) -> Built {
    let mut apps = Vec::new();
    for (i, w) in case.workloads.iter().enumerate() {
        let app = format!("app-{i}");
        let mut d = deployment(&app, w.replicas);
        if w.forged {
            d["metadata"]["annotations"] = json!({"nmo.medik8s.io/surge":
                r#"{"replicas":1,"serving":0,"surging":[{"pod":"default/x","uid":"u-x","maintenance":"nm-nobody"}]}"#});
        }
        if w.huge_unavailable {
            d["spec"]["strategy"] = json!({"rollingUpdate": {"maxUnavailable": 2147483647}});
        }
        env.create_value(d).await;
        if let Some(p) = pdb(&app, w.budget) {
            env.create_value(p).await;
        }
        let floor = match w.budget {
            Budget::None => 0,
            Budget::MinAvailable(n) => n as usize,
            Budget::Nothing => w.replicas as usize,
        };
        apps.push((app, w.replicas, floor));
    }
    for (app, replicas, _) in &apps {
        common::promises::ready_pods(env, app, *replicas as usize).await;
    }
    // An owner uid that exists: nmo-sim's garbage collector, which goes by
    // uid, keeps the pods.
    let uid = env.node("worker-1").await.uid().unwrap_or_default();
    for i in 0..case.unreadable {
        let name = if i == 0 { "has space" } else { "UPPER" };
        env.create_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("odd-{i}"), "namespace": "default",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": name, "uid": uid, "controller": true}]},
            "spec": {"nodeName": "worker-1", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": "i"}]}}))
            .await;
    }
    if case.cordoned_by_hand {
        common::cordon_by_hand(&env.client, "worker-1").await;
    }
    let node_before = env.node("worker-1").await;
    Built { apps, node_before }
}

/// Whether every budget of the case lets its pods go at some point under
/// the case's policy: then the drain must end.
fn drainable(case: &Case) -> bool {
    case.workloads.iter().all(|w| match w.budget {
        Budget::None => true,
        Budget::Nothing => false,
        // A surge brings the replacement first: the budget then allows
        // one. An eviction needs room above the floor now.
        Budget::MinAvailable(n) => {
            n < w.replicas
                || case.policy == "no-downtime"
                || (case.policy == "single-surge" && w.replicas == 1 && !w.forged)
        }
    })
}

/// Runs one case; `Err` names the promise broken.
async fn run(case: Case, policies: Arc<PolicyStore>) -> Result<(), String> {
    let mut env = Env::start_store(3, policies.clone()).await;
    let result = run_in(&mut env, &case, policies).await;
    let panicked = env.controller.is_finished();
    env.stop().await;
    match result {
        Ok(()) if panicked => Err("the operator ended (a panic?)".into()),
        other => other,
    }
}

async fn run_in(env: &mut Env, case: &Case, policies: Arc<PolicyStore>) -> Result<(), String> {
    let built = build(env, case).await;
    let floors = Floors::watch(
        &env.client,
        built.apps.iter().map(|(a, _, f)| (a.clone(), *f)).collect(),
    );
    let tool = match case.meddling {
        Meddling::RewriteRecords => Some(annotation_owner(&env.client, None, true)),
        Meddling::RemoveRecords => Some(annotation_owner(&env.client, None, false)),
        _ => None,
    };
    let policy = (case.policy != "default").then_some(case.policy);
    env.cluster.record_audit(true);
    env.create_nm_with_policy("nm-hunt", "worker-1", policy)
        .await;
    let started = Instant::now();
    let phase = |nm: &Option<nmo::crd::NodeMaintenance>| {
        nm.as_ref()
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.phase)
    };
    let midway = matches!(case.meddling, Meddling::Restart | Meddling::DeleteMidway);
    let mut meddled = !midway;
    let mut succeeded = false;
    while started.elapsed() < DRAIN_BOUND {
        let nm = env
            .nms()
            .get_opt("nm-hunt")
            .await
            .map_err(|e| e.to_string())?;
        if phase(&nm) == Some(MaintenancePhase::Succeeded) {
            succeeded = true;
            break;
        }
        if !meddled && phase(&nm) == Some(MaintenancePhase::Running) {
            meddled = true;
            match case.meddling {
                Meddling::Restart => {
                    env.controller.abort();
                    let _ = (&mut env.controller).await;
                    env.controller =
                        common::start_controller_tuned(&env.client, policies.clone(), |_| {}).1;
                }
                Meddling::DeleteMidway => break,
                _ => {}
            }
        }
        // Not a drain that can end: looked at for a while, then given up.
        if !drainable(case) && started.elapsed() > Duration::from_secs(6) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if drainable(case) && case.meddling != Meddling::DeleteMidway && !succeeded {
        return Err(format!(
            "every budget allows a disruption, yet the maintenance never succeeded within {DRAIN_BOUND:?}: {:?}",
            env.nms().get("nm-hunt").await.ok().and_then(|n| n.status)
        ));
    }
    let deleted = Instant::now();
    env.nms()
        .delete("nm-hunt", &DeleteParams::default())
        .await
        .map_err(|e| e.to_string())?;
    while env.nms().get_opt("nm-hunt").await.ok().flatten().is_some() {
        if deleted.elapsed() > GONE_BOUND {
            return Err(format!(
                "the deleted maintenance was not gone within {GONE_BOUND:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Some(t) = tool {
        t.abort();
    }
    restored(env, &built).await?;
    let writes = operator_writes(env);
    if writes > WRITES_BOUND {
        return Err(format!(
            "the operator wrote {writes} times in one case (bound {WRITES_BOUND})"
        ));
    }
    let broken = floors.stop();
    if let Some(first) = broken.first() {
        return Err(format!(
            "a budget was passed: {first} ({} times)",
            broken.len()
        ));
    }
    Ok(())
}

/// The operator's writes since the audit began: status updates, node and
/// pod patches, evictions, deletions of pods, events (the test's own
/// writes are to maintenances and Deployments, and not counted).
fn operator_writes(env: &Env) -> usize {
    env.cluster
        .audit()
        .iter()
        .filter(|r| r.user_agent == nmo::client::USER_AGENT)
        .filter(|r| matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete"))
        .filter(|r| {
            matches!(
                (r.resource.as_str(), r.subresource.as_str()),
                ("nodemaintenances", "status") | ("nodes", _) | ("pods", _) | ("events", _)
            )
        })
        .count()
}

/// The node as the human left it, and every Deployment's replicas as they
/// were: waited for a while (the restore is the operator's next pass).
async fn restored(env: &Env, built: &Built) -> Result<(), String> {
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), "default");
    let deadline = Instant::now() + GONE_BOUND;
    loop {
        let node = env.node("worker-1").await;
        // Taints as a set: their order in the list means nothing (the
        // node lifecycle controller adds its own where it likes).
        let spec = |n: &Node| {
            let s = n.spec.clone().unwrap_or_default();
            let mut taints: Vec<String> = s
                .taints
                .unwrap_or_default()
                .iter()
                .map(|t| {
                    format!(
                        "{}={}:{}",
                        t.key,
                        t.value.clone().unwrap_or_default(),
                        t.effect
                    )
                })
                .collect();
            taints.sort();
            (s.unschedulable.unwrap_or(false), taints)
        };
        let mut wrong = Vec::new();
        if spec(&node) != spec(&built.node_before) {
            wrong.push(format!(
                "node: {:?} where the human left {:?}",
                spec(&node),
                spec(&built.node_before)
            ));
        }
        for (app, replicas, _) in &built.apps {
            let d = deployments.get(app).await.map_err(|e| e.to_string())?;
            let now = d.spec.and_then(|s| s.replicas).unwrap_or(1);
            if now != *replicas as i32 {
                wrong.push(format!("{app}: {now} replicas, had {replicas}"));
            }
        }
        if wrong.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("not restored: {}", wrong.join("; ")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `cases` cases from `seed`; the first counterexample, shrunk.
fn hunt(cases: u32, seed: u64) -> Result<u32, String> {
    let (_dir, policies) = store();
    let config = Config {
        cases,
        max_shrink_iters: 32,
        failure_persistence: None,
        ..Config::default()
    };
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let tried = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = tried.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let outcome = runner.run(&case(), move |c| {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let shown = format!("{c:?}");
        rt.block_on(run(c, policies.clone()))
            .map_err(|why| TestCaseError::fail(format!("{why}\n  case: {shown}")))
    });
    let tried = tried.load(std::sync::atomic::Ordering::Relaxed);
    println!("hunter: {tried} case(s) run (seed {seed:#x})");
    outcome.map(|()| tried).map_err(|e| e.to_string())
}

#[test]
fn the_hunter_finds_no_broken_promise() {
    if let Err(first) = hunt(CASES, SEED) {
        panic!("the hunter found a broken promise (shrunk): {first}");
    }
}

#[test]
#[ignore = "a long run: NMO_HUNT_CASES (default 300), NMO_HUNT_SEED"]
fn hunt_long() {
    let cases = std::env::var("NMO_HUNT_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(300);
    let seed = std::env::var("NMO_HUNT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(SEED, |d| d.as_secs())
        });
    match hunt(cases, seed) {
        Ok(tried) => println!("hunter: {tried} case(s), no broken promise"),
        Err(first) => panic!("hunter: first counterexample (shrunk): {first}"),
    }
}
