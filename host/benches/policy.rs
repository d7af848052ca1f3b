//! What a policy decision costs: the embedded default policy's `plan-drain`
//! end to end (convert the pods, instantiate into a fresh store, call,
//! validate) against the same rules run natively in Rust, on realistic pods.
//!
//! Run with `cargo bench -p nmo --bench policy`. Prints a table of medians
//! and the ratio; the targets are 0.5 ms for 110 pods and 15 ms for 5,000.

use std::time::{Duration, Instant};

use nmo::fixtures;
use nmo::policy::types::{Failure, Maintenance};
use nmo::policy::view::{NodeView, PodView};
use nmo::policy::{EngineConfig, PolicyEngine, native, selfcheck};

/// Runs `f` for at least `budget` (and at least 15 times), returns the
/// median and the 95th percentile.
fn measure(budget: Duration, mut f: impl FnMut()) -> (Duration, Duration) {
    for _ in 0..3 {
        f();
    }
    let mut samples = Vec::new();
    let started = Instant::now();
    while samples.len() < 15 || (started.elapsed() < budget && samples.len() < 5_000) {
        let t = Instant::now();
        f();
        samples.push(t.elapsed());
    }
    samples.sort();
    let p95 = samples[(samples.len() * 95 / 100).min(samples.len() - 1)];
    (samples[samples.len() / 2], p95)
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

fn main() {
    let engine = PolicyEngine::new(EngineConfig::default()).expect("engine");
    let compile_started = Instant::now();
    let policy = engine.default_policy().expect("default policy");
    let compile = compile_started.elapsed();
    let budget = Duration::from_secs(2);

    let node = fixtures::node("worker-1");
    let m: Maintenance = selfcheck::sample_maintenance();
    let (tiny_call, _) = measure(budget, || {
        policy
            .on_failure(&m, &Failure::NodeNotFound)
            .expect("verdict");
    });

    println!("nmo policy benchmark (default policy, fresh store per decision)");
    println!(
        "compile + link default policy: {} ms; instantiate + tiny call (on-failure): {} ms",
        ms(compile),
        ms(tiny_call)
    );
    println!();
    println!(
        "{:>6} | {:>10} | {:>10} | {:>10} | {:>10} | {:>10} | {:>10} | {:>7} | target",
        "pods", "view", "call", "wasm e2e", "wasm p95", "native", "native p95", "ratio"
    );
    println!("{}", "-".repeat(109));
    for (count, target_ms) in [(110usize, 0.5f64), (1_000, f64::NAN), (5_000, 15.0)] {
        let pods = fixtures::node_pods("worker-1", count);
        let (convert_med, _) = measure(budget, || {
            std::hint::black_box(pods.iter().map(PodView::from).collect::<Vec<_>>());
        });
        let (wasm_med, wasm_p95) = measure(budget, || {
            let plan = policy.plan_drain_k8s(&m, &node, &pods).expect("plan");
            std::hint::black_box(plan);
        });
        let n = NodeView::from(&node);
        let views: Vec<_> = pods.iter().map(PodView::from).collect();
        let (call_med, _) = measure(budget, || {
            std::hint::black_box(policy.plan_drain_views(&m, &n, &views).expect("plan"));
        });
        let (native_med, native_p95) = measure(budget, || {
            std::hint::black_box(native::default_plan(&pods));
        });
        // The same answer, or the comparison means nothing.
        assert_eq!(
            policy.plan_drain_k8s(&m, &node, &pods).expect("plan"),
            native::default_plan(&pods)
        );
        let ratio = wasm_med.as_secs_f64() / native_med.as_secs_f64();
        let verdict = if target_ms.is_nan() {
            "-".to_string()
        } else if wasm_med.as_secs_f64() * 1e3 <= target_ms {
            format!("<= {target_ms} ms: met")
        } else {
            format!("<= {target_ms} ms: MISSED")
        };
        println!(
            "{:>6} | {:>10} | {:>10} | {:>10} | {:>10} | {:>10} | {:>10} | {:>6.1}x | {}",
            count,
            ms(convert_med),
            ms(call_med),
            ms(wasm_med),
            ms(wasm_p95),
            ms(native_med),
            ms(native_p95),
            ratio,
            verdict
        );
    }
    println!();
    println!(
        "times in ms, medians unless marked p95; wasm e2e = view the k8s objects + instantiate + call + validate;\n\
         call = instantiate + call + validate on records converted beforehand"
    );
}
