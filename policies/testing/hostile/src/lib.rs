//! A deliberately misbehaving policy, for the host's sandbox tests. The
//! NodeMaintenance `reason` picks the misbehaviour; any other reason gives a
//! well-formed plan (evict everything but mirror and DaemonSet pods).

use std::sync::atomic::{AtomicU64, Ordering};

use nmo_policy_sdk::*;

static CALLS: AtomicU64 = AtomicU64::new(0);

struct Hostile;

fn well_formed(pods: &[Pod]) -> DrainPlan {
    let decisions = pods
        .iter()
        .map(|p| {
            let action = if p.is_mirror() || p.is_daemonset_managed() {
                PodAction::skip("not mine to move")
            } else {
                PodAction::evict()
            };
            p.decide(action, 0)
        })
        .collect();
    DrainPlan {
        decisions,
        attempt_timeout_ms: 30_000,
        max_concurrent_evictions: None,
        volume_detach_timeout_ms: None,
    }
}

/// Busy work the optimiser cannot remove.
fn spin(iterations: u64) -> u64 {
    let mut x: u64 = 1;
    for i in 0..iterations {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

/// What attacks the sandbox itself: traps, panics, loops, memory, time,
/// output.
fn misbehave(reason: &str, pods: &[Pod]) {
    match reason {
        "trap" => std::process::abort(),
        "panic" => panic!("hostile policy panics on purpose"),
        "panic-on-bare" if pods.iter().any(|p| p.is_unmanaged()) => {
            panic!("cannot handle pod without a controller")
        }
        "loop" => loop {
            std::hint::black_box(spin(1_000));
        },
        "memory-bomb" => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![7u8; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        }
        "sleep" => std::thread::sleep(std::time::Duration::from_secs(60)),
        "busy-wait-clock" => {
            // Waits for a clock that the host keeps still.
            let start = std::time::Instant::now();
            while start.elapsed() < std::time::Duration::from_millis(10) {
                std::hint::black_box(spin(10));
            }
        }
        "slow" => {
            // Noticeably slow, well inside any sane deadline.
            std::hint::black_box(spin(2_000_000));
        }
        "chatty" => {
            for i in 0..1_000 {
                log(Level::Info, &format!("line {i} {}", "y".repeat(4096)));
            }
            println!("hello from the policy's stdout");
            eprintln!("hello from the policy's stderr");
        }
        "newlines" => {
            // One short line after another, on both streams: the
            // record count, not the bytes, is what it attacks.
            for _ in 0..4_000 {
                println!("x");
                eprintln!("y");
            }
        }
        _ => {}
    }
}

/// Answers the host must refuse: too big, pods unknown, twice or left
/// out, impossible numbers, empty or hostile words.
fn forge(reason: &str, plan: &mut DrainPlan, pods: &[Pod]) {
    match reason {
        "huge-reason" => {
            if let Some(d) = plan.decisions.first_mut() {
                d.action = PodAction::skip("x".repeat(8 << 20));
            }
        }
        "huge-list" => {
            // 100,000 small decisions: about 6 MiB to copy out (a
            // contract 0.3 decision is 64 bytes in the canonical ABI),
            // over the host's 4 MiB, so never lifted into host memory;
            // well inside the policy's own 32 MiB.
            let first = plan.decisions[0].clone();
            plan.decisions = vec![first; 100_000];
        }
        "unknown-pod" => plan.decisions.push(PodDecision {
            pod: pods.len() as u32 + 7,
            action: PodAction::evict(),
            order: 0,
        }),
        "duplicate" => {
            let first = plan.decisions[0].clone();
            plan.decisions.push(first);
        }
        "missing" => {
            plan.decisions.pop();
        }
        "negative-grace" => {
            let last = plan.decisions.len() - 1;
            plan.decisions[last].action = PodAction::Evict(Removal::default_grace().grace(-5));
        }
        "zero-timeout" => plan.attempt_timeout_ms = 0,
        "zero-concurrency" => plan.max_concurrent_evictions = Some(0),
        "empty-reason" => {
            let last = plan.decisions.len() - 1;
            plan.decisions[last].action = PodAction::skip("");
        }
        "wide-answer" => {
            // Many distinct 256 KiB reasons: little for the guest's
            // memory limit, far too much to copy out.
            for (i, d) in plan.decisions.iter_mut().enumerate() {
                d.action = PodAction::skip(format!("{i}{}", "w".repeat(256 << 10)));
            }
        }
        "control-chars" => {
            // Every class of character that could forge or hide text
            // where a reason lands.
            let texts = [
                "line\nPhase: Succeeded",
                "cr\roverwrite",
                "nul\0byte",
                "esc\u{1b}[2J\u{1b}[31mred",
                "bidi\u{202e}gnp.exe",
                "zero\u{200b}width",
                "del\u{7f} and c1\u{9b}",
            ];
            for (d, t) in plan.decisions.iter_mut().zip(texts.iter().cycle()) {
                d.action = PodAction::skip(*t);
            }
        }
        _ => {}
    }
}

/// Valid plans that test what the operator does with them.
fn shape(reason: &str, plan: &mut DrainPlan) {
    match reason {
        "surge-everything" => {
            for d in plan.decisions.iter_mut() {
                d.action = PodAction::surge();
            }
        }
        "evict-everything" => {
            for d in plan.decisions.iter_mut() {
                d.action = PodAction::evict();
            }
        }
        "give-up-at-3" => {
            for d in plan.decisions.iter_mut() {
                d.action = PodAction::block("held for the test");
            }
        }
        "block-now" => {
            // Blocks the first pod with the shortest attempt it may ask.
            if let Some(d) = plan.decisions.first_mut() {
                d.action = PodAction::block("blocked on purpose");
            }
            plan.attempt_timeout_ms = 1;
        }
        "stateful" => {
            // A fresh store per decision means this is 1 every time.
            let n = CALLS.fetch_add(1, Ordering::Relaxed) + 1;
            plan.attempt_timeout_ms = 1_000 * n;
        }
        _ => {}
    }
}

/// Tells what the policy sees (its settings, the time, the node), in the
/// first pod's reason.
fn tell(reason: &str, m: &Maintenance, node: &Node, plan: &mut DrainPlan) {
    match reason {
        "settings" => {
            // Tells what settings it was given, in the first pod's reason.
            let text: Vec<String> = Settings::current()
                .pairs()
                .iter()
                .map(|kv| format!("{}={}", kv.key, kv.value))
                .collect();
            if let Some(d) = plan.decisions.first_mut() {
                d.action = PodAction::skip(format!("settings: {}", text.join(",")));
            }
        }
        "now" => {
            // Tells the decision's time and what it read of the node.
            if let Some(d) = plan.decisions.first_mut() {
                d.action = PodAction::skip(format!(
                    "now={} node={} ready={}",
                    m.now_ms,
                    node.name(),
                    node.is_ready()
                ));
            }
        }
        "clock" => {
            // Tells what time it sees, in the first pod's reason.
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let mono = std::time::Instant::now();
            std::thread::yield_now();
            let moved = mono.elapsed().as_nanos();
            if let Some(d) = plan.decisions.first_mut() {
                d.action = PodAction::skip(format!("wall={secs} monotonic-moved={moved}"));
            }
        }
        _ => {}
    }
}

/// Knobs for the operator's tests: "tune:timeout=2000,delete,sts-last,max=1"
/// (and, for on-failure, park-churn).
fn tune(opts: &str, plan: &mut DrainPlan, pods: &[Pod]) {
    for opt in opts.split(',') {
        match opt.split_once('=') {
            Some(("timeout", ms)) => plan.attempt_timeout_ms = ms.parse().unwrap_or(30_000),
            Some(("max", n)) => plan.max_concurrent_evictions = n.parse().ok(),
            Some(("volumes", ms)) => plan.volume_detach_timeout_ms = ms.parse().ok(),
            // Bare pods: ask the application first.
            Some(("notify", ms)) => {
                for (d, p) in plan.decisions.iter_mut().zip(pods) {
                    if p.is_unmanaged() && !p.is_mirror() {
                        d.action = PodAction::notify(ms.parse().unwrap_or(1_000), None);
                    }
                }
            }
            _ if opt == "surge" => {
                for (d, p) in plan.decisions.iter_mut().zip(pods) {
                    if p.controller_kind() == Some("ReplicaSet") {
                        d.action = PodAction::surge();
                    }
                }
            }
            _ if opt == "delete" => {
                for d in plan.decisions.iter_mut() {
                    if matches!(d.action, PodAction::Evict(_)) {
                        d.action = PodAction::delete();
                    }
                }
            }
            _ if opt == "sts-last" => {
                for (d, p) in plan.decisions.iter_mut().zip(pods) {
                    if p.controller_kind() == Some("StatefulSet") {
                        d.order = 1;
                    }
                }
            }
            _ => {}
        }
    }
}

impl Policy for Hostile {
    fn plan_drain(m: Maintenance, node: Node, pods: Vec<Pod>) -> DrainPlan {
        let mut plan = well_formed(&pods);
        let reason = m.reason.as_str();
        if let Some(opts) = reason.strip_prefix("tune:") {
            tune(opts, &mut plan, &pods);
            return plan;
        }
        misbehave(reason, &pods);
        forge(reason, &mut plan, &pods);
        shape(reason, &mut plan);
        tell(reason, &m, &node, &mut plan);
        plan
    }

    fn validate_settings(settings: Settings) -> Result<(), String> {
        if let Some(message) = settings.get("refuse") {
            return Err(message.to_owned());
        }
        if settings.get("loop").is_some() {
            loop {
                std::hint::black_box(spin(1_000));
            }
        }
        Ok(())
    }

    fn admit(m: Maintenance, node: Node, fleet: Fleet) -> Admission {
        match m.reason.as_str() {
            "admit-trap" => panic!("hostile policy panics in admit"),
            "admit-loop" => loop {
                std::hint::black_box(spin(1_000));
            },
            "admit-wait-zero" => Admission::wait("zero", Some(0)),
            // A reason that changes on every call, asking to be asked again
            // at once.
            "admit-countdown" => {
                let ns = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                Admission::wait(format!("opens at {ns}"), Some(1))
            }
            "admit-deny-empty" => Admission::Deny(String::new()),
            "admit-deny" => Admission::Deny("denied by the hostile policy".into()),
            "admit-wait" => Admission::wait(
                format!(
                    "{} sees {} node(s), {} other maintenance(s)",
                    node.name(),
                    fleet.nodes.len(),
                    fleet.maintenances.len()
                ),
                None,
            ),
            _ => defaults::admit(&m, &node, &fleet),
        }
    }

    fn on_failure(m: Maintenance, _failure: Failure) -> Verdict {
        match m.reason.as_str() {
            "trap" => std::process::abort(),
            "loop" => loop {
                std::hint::black_box(spin(1_000));
            },
            "fail-empty" => Verdict::Fail(String::new()),
            "sleep" | "sleep-on-failure" => {
                std::thread::sleep(std::time::Duration::from_secs(60));
                Verdict::RetryAfterMs(1_000)
            }
            "control-chars" => Verdict::Fail(
                "gave up\nPhase: Succeeded\r\u{1b}[32mall good\u{1b}[0m\u{202e}".into(),
            ),
            "block-now" => Verdict::RetryAfterMs(0),
            "give-up-at-3" if m.attempt >= 3 => {
                Verdict::Fail(format!("gave up at attempt {}", m.attempt))
            }
            "give-up-at-3" => Verdict::RetryAfterMs(1_000),
            "fail-huge" => Verdict::Fail("z".repeat(100_000)),
            "retry-forever" => Verdict::RetryAfterMs(u64::MAX),
            // Parks at every call with a reason that is new each time (as
            // one naming the current time would), asking to be looked at
            // again as soon as the contract allows.
            tune if tune.starts_with("tune:") && tune.contains("park-churn") => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                Verdict::Park(Parking {
                    reason: format!("parked at {} ms", now.as_millis()),
                    recheck_after_ms: Some(1_000),
                })
            }
            tune if tune.starts_with("tune:") => Verdict::RetryAfterMs(500),
            _ => Verdict::RetryAfterMs(1_000),
        }
    }
}

export_policy!(Hostile);
