//! The invariant hunter: seeded, property-based (proptest) hostile
//! clusters on nmo-sim, checked against the promises docs/reliability.md
//! lists ("What the hunter checks").
//!
//! Each case builds a cluster of three workers with Deployments of one to
//! four replicas, each behind a budget or not (`minAvailable`,
//! `maxUnavailable: 0`), some with a forged surge record or a
//! `maxUnavailable` past any range, bare pods whose owner reference
//! cannot be read, a pod that asks for an hour's handshake and never
//! answers, a node a human cordoned first; runs a maintenance of
//! `worker-1` under a policy that evicts, surges, waits or forces; and
//! meanwhile a tenant's tool rewrites or removes surge records, or an
//! autoscaler sets the replicas, or the
//! operator is killed and started again, or stopped (SIGTERM) and another
//! started, or the maintenance is deleted mid-drain (mid-wait where there
//! is one). After every change it sees, and at the end, it checks:
//!
//! - no budget ever has fewer serving pods than it promises (surges
//!   included);
//! - a deleted maintenance gives the node back as the human left it, and
//!   every owner its replicas as they were (the autoscaler's, where one
//!   wrote);
//! - nothing a tenant wrote holds the drain: when every budget allows a
//!   disruption, the maintenance succeeds within its bound;
//! - a deleted maintenance is gone within its bound, a wait included (the
//!   wait is an hour's);
//! - a stopped operator ends within its pod's grace period, a wait
//!   included;
//! - the operator never panics, and its writes are bounded.
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
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::json;

use crate::common;
use common::drain_actions::{is_ready, store};
use common::promises::{annotation_owner, deployment};
use common::{ClusterOps, Env};

/// Cases in the test command.
const CASES: u32 = 300;
/// Cases run at once (each its own nmo-sim and operator; they mostly
/// wait, for pods to go and for the drains' bounds).
const AT_ONCE: usize = 8;
/// The most runs spent shrinking a counterexample.
const MAX_SHRINK_RUNS: u32 = 32;
/// The seed of the test command's cases.
const SEED: u64 = 0x6e6d_6f2d_6875_6e74;
/// How long a maintenance every budget lets drain may take (real time, on
/// a busy machine; the drains here take a second or two).
const DRAIN_BOUND: Duration = Duration::from_secs(45);
/// How long a deleted maintenance may take to go in the test command (a
/// busy machine; the long run holds it to [`WAIT_END_GOAL`]).
const GONE_BOUND: Duration = Duration::from_secs(10);
/// The promise: a wait ends within 1 s of its maintenance's deletion
/// (the long run, a benchmark, checks it; the test command checks
/// [`GONE_BOUND`], still far below the hour the wait would take).
const WAIT_END_GOAL: Duration = Duration::from_secs(1);
/// The operator pod's grace period (deploy/manager/manager.yaml): a
/// stopped operator's run ends within it.
const GRACE_PERIOD: Duration = Duration::from_secs(10);
/// How long a drain that cannot end is watched past its meddling.
const WATCHED: Duration = Duration::from_secs(2);
/// The handshake the waiting pod asks for, which it never answers.
const HANDSHAKE: &str = "1h";
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
    /// The operator is stopped (what SIGTERM does) once the drain runs,
    /// mid-wait where there is one; the next one is started.
    Stop,
    /// The maintenance is deleted once the drain runs.
    DeleteMidway,
    /// An autoscaler sets every Deployment's replicas two above what
    /// they were, once the drain runs (two: a surge raises by at most
    /// one here, so its value is never one a surge could have written).
    Autoscale,
}

#[derive(Clone, Debug)]
struct Case {
    policy: &'static str,
    workloads: Vec<Workload>,
    /// Bare pods on the node whose controller reference cannot be read.
    unreadable: u8,
    /// A bare pod asking for an hour's handshake, never answering.
    handshake: bool,
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
        proptest::bool::weighted(0.3),
        proptest::bool::weighted(0.25),
        prop_oneof![
            Just(Meddling::Nothing),
            Just(Meddling::RewriteRecords),
            Just(Meddling::RemoveRecords),
            Just(Meddling::Restart),
            Just(Meddling::Stop),
            Just(Meddling::DeleteMidway),
            Just(Meddling::Autoscale),
        ],
    )
        .prop_map(
            |(policy, workloads, unreadable, handshake, cordoned_by_hand, meddling)| Case {
                policy,
                workloads,
                unreadable,
                handshake,
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

/// The cluster of a case, as built: its apps with their replicas (as
/// their owners last set them: the autoscaler's, once it wrote) and
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
    if case.handshake {
        env.create_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "asks", "namespace": "default",
                "annotations": {"nmo.medik8s.io/handshake": HANDSHAKE}},
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
    !waits(case)
        && case.workloads.iter().all(|w| match w.budget {
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

/// Whether the case's drain waits (an hour) for the handshake.
fn waits(case: &Case) -> bool {
    case.handshake && matches!(case.policy, "no-downtime" | "single-surge")
}

/// Whether the drain waits for the handshake now: the operator has asked
/// the pod to leave (its deadline is on the pod).
async fn waiting(env: &Env) -> bool {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    pods.get_opt("asks").await.ok().flatten().is_some_and(|p| {
        p.annotations()
            .contains_key("nmo.medik8s.io/eviction-deadline")
    })
}

/// What the cases measured of the timing promises.
#[derive(Default)]
struct Timings {
    /// A maintenance deleted mid-wait: how long it took to go.
    gone_mid_wait: Vec<Duration>,
    /// A stopped operator: how long its run took to end.
    stopped: Vec<Duration>,
}

impl Timings {
    fn summary(&self) -> String {
        let max = |v: &[Duration]| v.iter().max().copied().unwrap_or_default();
        format!(
            "{} deletion(s) mid-wait, gone within {:?} at most; {} stop(s), ended within {:?} at most",
            self.gone_mid_wait.len(),
            max(&self.gone_mid_wait),
            self.stopped.len(),
            max(&self.stopped)
        )
    }
}

/// How a case is run: the policies, where its timings go, and the bound a
/// maintenance deleted mid-wait must be gone within.
#[derive(Clone)]
struct Hunt {
    policies: Arc<PolicyStore>,
    timings: Arc<Mutex<Timings>>,
    gone_mid_wait: Duration,
}

/// Runs one case; `Err` names the promise broken.
async fn run(case: Case, hunt: Hunt) -> Result<(), String> {
    let mut env = Env::start_store(3, hunt.policies.clone()).await;
    let result = run_in(&mut env, &case, &hunt).await;
    let panicked = env.controller.is_finished();
    env.stop().await;
    match result {
        Ok(()) if panicked => Err("the operator ended (a panic?)".into()),
        other => other,
    }
}

async fn run_in(env: &mut Env, case: &Case, hunt: &Hunt) -> Result<(), String> {
    let mut built = build(env, case).await;
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
    let midway = matches!(
        case.meddling,
        Meddling::Restart | Meddling::Stop | Meddling::DeleteMidway | Meddling::Autoscale
    );
    let mut meddled = !midway;
    let mut succeeded = false;
    let mut mid_wait = false;
    let mut meddled_at = started;
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
        // Where the drain waits, the meddling comes mid-wait.
        let ripe = if waits(case) {
            waiting(env).await
        } else {
            phase(&nm) == Some(MaintenancePhase::Running)
        };
        if !meddled && ripe {
            meddled = true;
            meddled_at = Instant::now();
            mid_wait = waits(case);
            match case.meddling {
                Meddling::Restart => {
                    env.controller.abort();
                    let _ = (&mut env.controller).await;
                    restart(env, hunt);
                }
                Meddling::Stop => {
                    let took = stop(env).await?;
                    hunt.timings.lock().unwrap().stopped.push(took);
                    restart(env, hunt);
                }
                Meddling::DeleteMidway => break,
                Meddling::Autoscale => autoscale(env, &mut built).await?,
                _ => {}
            }
        }
        // Not a drain that can end: looked at for a while past the
        // meddling (a drain here takes well under a second), then given
        // up.
        if !drainable(case) && meddled && meddled_at.elapsed() > WATCHED {
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
    let bound = if mid_wait && case.meddling == Meddling::DeleteMidway {
        hunt.gone_mid_wait
    } else {
        GONE_BOUND
    };
    while env.nms().get_opt("nm-hunt").await.ok().flatten().is_some() {
        if deleted.elapsed() > bound {
            return Err(format!(
                "the deleted maintenance was not gone within {bound:?}{}",
                if mid_wait { " (deleted mid-wait)" } else { "" }
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if mid_wait && case.meddling == Meddling::DeleteMidway {
        hunt.timings
            .lock()
            .unwrap()
            .gone_mid_wait
            .push(deleted.elapsed());
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

/// Sets every Deployment's replicas two above what they were, as an
/// autoscaler would (a merge patch of `spec.replicas`); what they must end
/// as is then the autoscaler's value.
async fn autoscale(env: &Env, built: &mut Built) -> Result<(), String> {
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), "default");
    for (app, replicas, _) in &mut built.apps {
        *replicas += 2;
        deployments
            .patch(
                app,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"replicas": *replicas}})),
            )
            .await
            .map_err(|e| format!("the autoscaler's write: {e}"))?;
    }
    Ok(())
}

/// Stops the operator as SIGTERM does; how long its run took to end (at
/// most the grace period, or the promise is broken).
async fn stop(env: &mut Env) -> Result<Duration, String> {
    let ctx = env.ctx.as_ref().ok_or("no context to stop")?;
    let asked = Instant::now();
    ctx.stop();
    match tokio::time::timeout(GRACE_PERIOD, &mut env.controller).await {
        Ok(_) => Ok(asked.elapsed()),
        Err(_) => Err(format!(
            "the stopped operator was still running after its {GRACE_PERIOD:?} grace period"
        )),
    }
}

/// Starts the next operator (its context the env's).
fn restart(env: &mut Env, hunt: &Hunt) {
    let (ctx, controller) =
        common::start_controller_tuned(&env.client, hunt.policies.clone(), |_| {});
    env.ctx = Some(ctx);
    env.controller = controller;
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

/// Runs `cases` cases from `seed`, [`AT_ONCE`] at a time, a maintenance
/// deleted mid-wait to be gone within `gone_mid_wait`; the first
/// counterexample (in the order drawn), shrunk one run at a time.
fn hunt(cases: u32, seed: u64, gone_mid_wait: Duration) -> Result<u32, String> {
    let (_dir, policies) = store();
    let hunt = Hunt {
        policies,
        timings: Arc::default(),
        gone_mid_wait,
    };
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let strategy = case();
    let mut trees = (0..cases)
        .map(|_| strategy.new_tree(&mut runner))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let outcomes: Vec<Result<(), String>> = rt.block_on(
        futures::stream::iter(trees.iter().map(|t| run(t.current(), hunt.clone())))
            .buffered(AT_ONCE)
            .collect(),
    );
    println!("hunter: {cases} case(s) run (seed {seed:#x})");
    println!("hunter: {}", hunt.timings.lock().unwrap().summary());
    match outcomes
        .into_iter()
        .enumerate()
        .find_map(|(i, o)| o.err().map(|e| (i, e)))
    {
        None => Ok(cases),
        Some((first, why)) => Err(shrink(&rt, trees.swap_remove(first), why, &hunt)),
    }
}

/// Shrinks a failing case as proptest does (simplify while it fails,
/// complicate when it passes), one run at a time; the smallest failure
/// and why.
fn shrink(
    rt: &tokio::runtime::Runtime,
    mut tree: impl ValueTree<Value = Case>,
    first: String,
    hunt: &Hunt,
) -> String {
    let failing = |c: Case| rt.block_on(run(c, hunt.clone())).err();
    let mut shown = format!("{:?}", tree.current());
    let Some(mut why) = failing(tree.current()) else {
        return format!("a case failed once ({first}) and passed again (a flake?): {shown}");
    };
    let mut runs = 0;
    if tree.simplify() {
        while runs < MAX_SHRINK_RUNS {
            runs += 1;
            match failing(tree.current()) {
                Some(w) => {
                    (why, shown) = (w, format!("{:?}", tree.current()));
                    if !tree.simplify() {
                        break;
                    }
                }
                None => {
                    if !tree.complicate() {
                        break;
                    }
                }
            }
        }
    }
    format!("{why}\n  case: {shown} ({runs} shrinking run(s))")
}

#[test]
fn the_hunter_finds_no_broken_promise() {
    if let Err(first) = hunt(CASES, SEED, GONE_BOUND) {
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
    match hunt(cases, seed, WAIT_END_GOAL) {
        Ok(tried) => println!("hunter: {tried} case(s), no broken promise"),
        Err(first) => panic!("hunter: first counterexample (shrunk): {first}"),
    }
}
