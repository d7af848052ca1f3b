//! What a policy decision costs: the embedded default policy's `plan-drain`
//! end to end (convert the pods, instantiate into a fresh store, call,
//! validate) against the same rules run natively in Rust, on realistic pods.
//!
//! Run with `cargo bench -p nmo --bench policy`. Prints a table of medians
//! and the ratio; the targets are 0.2 ms for 110 pods and 5 ms for 5,000.

use std::time::{Duration, Instant};

mod common;

use common::measure;

use nmo::fixtures;
use nmo::policy::types::{Failure, Maintenance};
use nmo::policy::{EngineConfig, PolicyEngine, native, selfcheck};

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
    let (tiny_call, _) = measure(budget, 15, || {
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
        "{:>6} | {:>10} | {:>10} | {:>10} | {:>10} | {:>10} | {:>7} | target",
        "pods", "wasm e2e", "wasm p95", "with copy", "native", "native p95", "ratio"
    );
    println!("{}", "-".repeat(96));
    for (count, target_ms) in [(110usize, 0.2f64), (1_000, f64::NAN), (5_000, 5.0)] {
        let pods = fixtures::node_pods("worker-1", count);
        let shared: std::sync::Arc<[k8s_openapi::api::core::v1::Pod]> = pods.clone().into();
        let (wasm_med, wasm_p95) = measure(budget, 15, || {
            let plan = policy
                .plan_drain_shared(
                    &m,
                    node.clone(),
                    shared.clone(),
                    Default::default(),
                    Default::default(),
                )
                .expect("plan");
            std::hint::black_box(plan);
        });
        let (copy_med, _) = measure(budget, 15, || {
            std::hint::black_box(policy.plan_drain(&m, &node, &pods).expect("plan"));
        });
        let (native_med, native_p95) = measure(budget, 15, || {
            std::hint::black_box(native::default_plan(&pods));
        });
        // The same answer, or the comparison means nothing.
        assert_eq!(
            policy.plan_drain(&m, &node, &pods).expect("plan"),
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
            "{:>6} | {:>10} | {:>10} | {:>10} | {:>10} | {:>10} | {:>6.1}x | {}",
            count,
            ms(wasm_med),
            ms(wasm_p95),
            ms(copy_med),
            ms(native_med),
            ms(native_p95),
            ratio,
            verdict
        );
    }
    println!();
    println!(
        "times in ms, medians unless marked p95; wasm e2e = hand the k8s objects over + instantiate\n\
         + call (every accessor the policy asks) + validate; with copy = the same from borrowed\n\
         objects, copied first (what plan_drain does)"
    );
}
