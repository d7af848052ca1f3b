//! The policy test harness: run a policy on scenarios and compare its
//! answers with the expected ones.
//!
//! A scenario file is YAML, one scenario per document (`---` between
//! them). The objects are ordinary Kubernetes YAML, what
//! `kubectl get pod -o yaml` prints:
//!
//! ```yaml
//! name: StatefulSet pods go last, one at a time
//! maintenance:            # optional; a NodeMaintenance (default: nodeName node-1)
//!   metadata: {name: nm-1, annotations: {nmo.medik8s.io/give-up-after: 15m}}
//!   spec: {nodeName: node-1, reason: kernel upgrade}
//!   status: {phase: Running, drainProgress: 40}
//! elapsed: 12m            # optional: time since the maintenance was created
//! attempt: 3              # optional: the decision's attempt number (default 1)
//! now: 2026-12-05T22:30:00Z  # optional: what the policy's clock shows (default: when it runs)
//! node:                   # optional; a Node (default: named after spec.nodeName, cordoned)
//!   metadata: {name: node-1, labels: {storage: local}}
//! pods:                   # Pods, or the `kind: List` kubectl prints
//! podsFrom: pods.yaml     # or: a file of them, e.g. `kubectl get pods -o yaml > pods.yaml`
//!                         # as is (relative to this file; in a scenario directory
//!                         # such a file is data, not scenarios)
//!   - metadata: {name: db-0, namespace: default, ownerReferences: [...]}
//!     spec: {containers: [...]}
//! history:                # optional: what the drain did to a pod so far (drain-history)
//!   default/db-0: {pending: 20m, refusedEvictions: 12, attempts: 4, notified: 5m}
//! workloads:              # optional: the Deployments, ReplicaSets and StatefulSets behind
//!                         # the pods (a pod's `workload`), as kubectl prints them
//!   - {kind: ReplicaSet, metadata: {name: web-5d9, namespace: default,
//!       ownerReferences: [{kind: Deployment, name: web, controller: true}]}}
//!   - {kind: Deployment, metadata: {name: web, namespace: default}, spec: {replicas: 1}}
//! failure:                # optional: ask on-failure instead of plan-drain
//!   drainIncomplete: {pending: [default/db-0], timedOut: true, message: "..."}
//!   # drainIncomplete also takes waited: [ns/pod] (wait ran out)
//!   # or: nodeNotFound, {leaseHeld: holder}, {leaseError: msg}, {apiError: msg},
//!   #     {volumesAttached: [csi-abc]}
//! fleet:                  # optional: ask admit instead (may the maintenance start?)
//!   nodes:                # Nodes (Ready unless their status says otherwise); the
//!     - metadata: {name: node-2, labels: {topology.kubernetes.io/zone: a}}
//!                         # maintenance's node is added when not listed
//!   maintenances:         # the other unfinished NodeMaintenances
//!     - {node: node-2, admitted: true, since: 5m}   # name, phase, created, parked: optional
//!     - {node: node-3, admitted: false, created: 1m}
//!   openshiftEtcd: {budgets: 1, disruptionsAllowed: 0, guardReadyOnNode: true}
//!   history:              # maintenances that ended (seen within the policy's history-window)
//!     - {node: node-4, started: 50m, ended: 40m, outcome: Succeeded}   # name: optional
//!   leases: {node-5: node-healthcheck}   # who else holds a node's medik8s lease
//!   claims: {node-6: ["cluster-api default/md-0-abc"]}   # other tools' objects
//! settings: {timeout: 30m}  # optional: the policy's settings (policies.yaml's)
//! expect:
//!   decisions:            # by namespace/name (or name, for namespace default)
//!     default/web-1: evict            # evict | delete | skip | block | surge | notify | wait
//!     default/db-0: {action: evict, order: 1, gracePeriodSeconds: 30}
//!     default/bare: {action: block, reason: "no controller"}   # reason: a substring
//!     default/job-1: {action: wait, timeoutMs: 3600000}        # wait, notify: the timeout
//!     default/db-1: {action: notify, timeoutMs: 600000, then: delete}   # then: evict | delete
//!   attemptTimeoutMs: 30000
//!   maxConcurrentEvictions: 2         # or null for no limit
//!   verdict: retryWithBackoff         # | {retryAfterMs: 5000} | fail | {fail: "substring"}
//!                                     # | park | {park: "substring"}
//!   admission: admit                  # | wait | deny | {wait: "substring"} | {deny: "substring"}
//!   error: invalid_decision           # the policy must fail, in this category
//!                                     # (settings: it refused its settings)
//! ```
//!
//! Only what `expect` names is checked; pods it does not list may get any
//! decision. Every answer is validated exactly as the operator validates
//! it, so a scenario that passes here is an answer the operator acts on.
//!
//! Here: the runner (a scenario asked of a policy, its outcome, a file's
//! report). `scenario`: the format read into what the policy is asked and
//! what it must answer. `check`: an answer against the expectations.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::error::ToolError as Error;
use nmo_policy_runtime::Policy;
type Result<T, E = Error> = std::result::Result<T, E>;
use nmo_policy_runtime::validate::{Action, Admission, Plan, Verdict};

mod check;
mod scenario;

use check::*;
use scenario::*;
pub use scenario::{Scenario, load};

/// How one scenario went.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub name: String,
    pub source: String,
    /// Each difference as `(what, expected, actual)`; empty: passed.
    pub diffs: Vec<(String, String, String)>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.diffs.is_empty()
    }
}

/// What the policy answered.
enum Answer {
    Plan(Plan),
    Verdict(Verdict),
    Admission(Admission),
}

/// Runs one scenario.
pub fn run(policy: &Policy, s: &Scenario) -> Outcome {
    let mut diffs = Vec::new();
    let now = s.now.unwrap_or_else(std::time::SystemTime::now);
    let at = jiff::Timestamp::try_from(now).unwrap_or_else(|_| jiff::Timestamp::now());
    let mut m = super::convert::maintenance(&s.maintenance, s.attempt, at);
    m.elapsed_ms = s.elapsed_ms;
    if s.maintenance.metadata.creation_timestamp.is_none() {
        m.created_ms = m.now_ms.saturating_sub(m.elapsed_ms);
    }
    let e = &s.expect;
    let answer = policy
        .at(now)
        .with_settings(s.settings.clone())
        .and_then(|policy| match (&s.fleet, &s.failure) {
            (Some(fleet), _) => {
                let window = s.settings.history_window();
                let (fleet, position) = fleet.at(m.now_ms, &m.node_name, window);
                policy.admit(&m, position, &fleet).map(Answer::Admission)
            }
            (None, Some(f)) => policy.on_failure(&m, f).map(Answer::Verdict),
            (None, None) => policy
                .plan_drain_shared(
                    &m,
                    s.node.clone(),
                    s.pods.clone().into(),
                    s.history.clone(),
                    s.workloads.clone(),
                )
                .map(Answer::Plan),
        });
    match (answer, &e.error) {
        (Err(err), Some(cat)) if err.category() == cat => {}
        (Err(err), Some(cat)) => diffs.push((
            "error".into(),
            cat.clone(),
            format!("{} ({err})", err.category()),
        )),
        (Err(err), None) => diffs.push((
            "answer".into(),
            "a valid answer".into(),
            format!("error {}: {err}", err.category()),
        )),
        (Ok(_), Some(cat)) => diffs.push(("error".into(), cat.clone(), "a valid answer".into())),
        (Ok(Answer::Admission(got)), None) => {
            if let Some(want) = e.admission.as_ref().filter(|w| !check_admission(w, &got)) {
                let want = match want {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                diffs.push(("admission".into(), want, got.to_string()));
            }
        }
        (Ok(Answer::Plan(plan)), None) => {
            let by_key: BTreeMap<String, (&Action, u32)> = plan
                .steps
                .iter()
                .map(|st| {
                    (
                        format!("{}/{}", st.namespace, st.name),
                        (&st.action, st.order),
                    )
                })
                .collect();
            for (key, want) in &e.decisions {
                let key = if key.contains('/') {
                    key.clone()
                } else {
                    format!("default/{key}")
                };
                match by_key.get(&key) {
                    None => diffs.push((
                        key,
                        format!("{want}"),
                        "(no such pod in the scenario)".into(),
                    )),
                    Some((action, order)) => {
                        if let Err(want) = check_decision(want, action, *order) {
                            diffs.push((key, want, show_action(action, *order)));
                        }
                    }
                }
            }
            if let Some(t) = e.attempt_timeout_ms {
                let got = plan.attempt_timeout.as_millis() as u64;
                if got != t {
                    diffs.push(("attemptTimeoutMs".into(), t.to_string(), got.to_string()));
                }
            }
            if let Some(want) = e.max_concurrent_evictions {
                let got = plan.max_concurrent_evictions.map(|n| n.get());
                if got != want {
                    let show = |v: Option<u32>| v.map_or("null".to_owned(), |n| n.to_string());
                    diffs.push(("maxConcurrentEvictions".into(), show(want), show(got)));
                }
            }
        }
        (Ok(Answer::Verdict(verdict)), None) => {
            if let Some(want) = e.verdict.as_ref().filter(|w| !check_verdict(w, &verdict)) {
                let want = match want {
                    Value::String(s) => s.clone(),
                    other => crate::yaml::to_string(other)
                        .map(|s| format!("{{{}}}", s.trim().replace('\n', ", ")))
                        .unwrap_or_default(),
                };
                diffs.push(("verdict".into(), want, show_verdict(&verdict)));
            }
        }
    }
    Outcome {
        name: s.name.clone(),
        source: s.source.clone(),
        diffs,
    }
}

/// The outcomes of a run, printable.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub outcomes: Vec<Outcome>,
}

impl Report {
    pub fn passed(&self) -> usize {
        self.outcomes.iter().filter(|o| o.passed()).count()
    }

    pub fn failed(&self) -> usize {
        self.outcomes.len() - self.passed()
    }

    /// `PASS`/`FAIL` per scenario, a `-` expected / `+` actual diff under
    /// each failure, and a total line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for o in &self.outcomes {
            let mark = if o.passed() { "PASS" } else { "FAIL" };
            let _ = writeln!(out, "{mark}  {}  ({})", o.name, o.source);
            for (what, want, got) in &o.diffs {
                let _ = writeln!(out, "        {what}");
                let _ = writeln!(out, "          - expected: {want}");
                let _ = writeln!(out, "          + actual:   {got}");
            }
        }
        let _ = writeln!(
            out,
            "{} scenarios: {} passed, {} failed",
            self.outcomes.len(),
            self.passed(),
            self.failed()
        );
        out
    }
}

/// Runs every scenario of `paths` (files or directories) on `policy`.
pub fn run_paths(policy: &Policy, paths: &[PathBuf]) -> Result<Report> {
    let mut report = Report::default();
    for p in paths {
        for s in load(p)? {
            report.outcomes.push(run(policy, &s));
        }
    }
    Ok(report)
}

/// For a policy's own `cargo test`: loads the policy file, runs the
/// scenarios and panics with the report if any fails.
///
/// ```ignore
/// #[test]
/// fn scenarios() {
///     nmo::policy::harness::assert_scenarios(
///         "target/wasm32-wasip2/release/my_policy.wasm",
///         "scenarios",
///     );
/// }
/// ```
pub fn assert_scenarios(policy_wasm: impl AsRef<Path>, scenarios: impl AsRef<Path>) -> Report {
    let engine = nmo_policy_runtime::PolicyEngine::new(nmo_policy_runtime::EngineConfig::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let policy = engine
        .load_file(policy_wasm.as_ref())
        .unwrap_or_else(|e| panic!("{e}"));
    let report =
        run_paths(&policy, &[scenarios.as_ref().to_owned()]).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        report.failed() == 0,
        "policy {} failed scenarios:\n{}",
        policy_wasm.as_ref().display(),
        report.render()
    );
    report
}
