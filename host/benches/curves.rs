//! Cost curves: how each cost grows with the size that drives it, printed
//! with what the curve should be and whether it is, and drawn into a PNG
//! (`docs/curves.png`, or `NMO_BENCH_PNG`):
//! - drain time against the pods on the node (10 to 1,000), nmo-sim, the
//!   controller with the default policy, median of 3;
//! - admission against the nodes (10 to 5,000), nmo-sim, the shipped
//!   `max-unavailable` policy, 10 maintenances at once: the decision's
//!   mean time and the operator's API requests per maintenance;
//! - the `nmo` binary's resident memory against NodeMaintenances present
//!   (10 to 1,000), nmo-sim, `max-unavailable` at 10 %;
//! - the default policy's `plan-drain` decision time against the pods
//!   (110 to 5,000), p50 and p95.
//!
//! Run with `cargo bench -p nmo --bench curves`. `NMO_BENCH_CURVES` picks
//! some of `drain,admission,memory,decision` (default all); the PNG is
//! drawn only when all four ran.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;

use common::{
    create_nms, measure, proc_status_kib, seed_kwok_pods, seed_pods, seen, start_binary,
    stop_binary, wait_nms, wait_running, wait_succeeded,
};
use kube::api::Api;
use nmo::controller::{self, Context, Settings};
use nmo::crd::NodeMaintenance;
use nmo::fixtures;
use nmo::policy::{Decision, EngineConfig, PolicyEngine, PolicyStore, selfcheck};
use nmo_control_plane::{ControlPlane, NodeSpec, Options};
use nmo_sim::{SimCluster, SimOptions};

/// One measured line of a curve.
struct Series {
    name: &'static str,
    points: Vec<(f64, f64)>,
}

/// A curve: its series, what it should be, and the verdict.
struct Curve {
    title: &'static str,
    /// The y axis in a log scale (else linear from 0).
    log_y: bool,
    /// "is" or "is NOT": what the picture's title says of the expectation.
    short: &'static str,
    /// The expectation in a few words, for the picture.
    brief: &'static str,
    /// Where the picture's legend goes (away from the lines).
    legend_low: bool,
    x: &'static str,
    y: &'static str,
    series: Vec<Series>,
    expected: &'static str,
    verdict: String,
}

/// How `points` grow from the first to the last: the ratio of the last
/// y to the first against the ratio of the x's. 1 is linear, 0 flat.
fn growth(points: &[(f64, f64)]) -> f64 {
    let (Some(a), Some(b)) = (points.first(), points.last()) else {
        return 0.0;
    };
    if a.1 <= 0.0 || b.0 <= a.0 {
        return 0.0;
    }
    (b.1 / a.1).ln() / (b.0 / a.0).ln()
}

fn env_list() -> Vec<String> {
    std::env::var("NMO_BENCH_CURVES")
        .unwrap_or_else(|_| "drain,admission,memory,decision".into())
        .split(',')
        .map(|s| s.trim().to_owned())
        .collect()
}

fn sim_options() -> SimOptions {
    SimOptions {
        time_scale: 1.0,
        ..SimOptions::default()
    }
}

/// A policy directory holding the shipped `max-unavailable` with `max`.
fn max_unavailable_dir(max: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        Path::new(env!("NMO_POLICY_WASM_DIR")).join("nmo_policy_max_unavailable.wasm"),
        dir.path().join("max-unavailable.wasm"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("policies.yaml"),
        format!("default: max-unavailable\nsettings:\n  max-unavailable:\n    max: \"{max}\"\n"),
    )
    .unwrap();
    dir
}

/// The controller in this process on `c`, with `policies`; waits for its
/// caches.
async fn run_controller(
    kubeconfig: &str,
    policies: std::sync::Arc<PolicyStore>,
) -> tokio::task::JoinHandle<nmo::Result<()>> {
    let metrics = nmo::registry::OperatorMetrics::register().unwrap();
    let operator = nmo::client::client_from_kubeconfig(kubeconfig)
        .await
        .unwrap();
    let ctx = Context::new(
        operator,
        policies,
        Settings {
            max_concurrent: 64,
            ..Settings::default()
        },
        metrics.controller.clone(),
    );
    let running = tokio::spawn(controller::run(ctx.clone()));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ctx.synced() {
        assert!(Instant::now() < deadline, "the controller never synced");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running
}

/// Drain time against the pods on the node: NodeMaintenance created to
/// Succeeded, median of 3 on nmo-sim, one run on the real control plane
/// (kwok's pods, gone as soon as they are evicted).
async fn drain_curve(real: bool) -> Curve {
    const SIZES: [usize; 5] = [10, 30, 100, 300, 1000];
    let c = SimCluster::start(sim_options()).await.unwrap();
    c.apply_yaml(&nmo::crd::crd_yaml()).unwrap();
    for size in SIZES {
        for run in 0..3 {
            let node = format!("d{size}-{run}");
            c.add_node(&node).unwrap();
            seed_pods(&c, &node, size);
        }
    }
    let points = drain_series(&c.kubeconfig(), 3, "nmo-sim").await;
    let mut series = vec![Series {
        name: "nmo-sim, median of 3",
        points,
    }];
    if real {
        let nodes = SIZES.iter().map(|s| NodeSpec::new(format!("d{s}-0")));
        let cp = ControlPlane::start(Options {
            nodes: nodes.collect(),
            audit: false,
            ..Options::default()
        })
        .await
        .expect("the real control plane starts");
        let admin = cp.client().await.unwrap();
        common::install_crd(&cp).await;
        for size in SIZES {
            let node = format!("d{size}-0");
            seed_kwok_pods(&admin, &node, size, "0s").await;
            wait_running(&admin, &node, size).await;
        }
        let points = drain_series(&cp.kubeconfig(), 1, "real control plane").await;
        series.push(Series {
            name: "real control plane (kwok), one run",
            points,
        });
        cp.stop();
    }
    let fixed = series[0].points[0].1;
    let per_pod: Vec<String> = series
        .iter()
        .map(|s| {
            let (a, b) = (s.points[2], s.points[4]);
            format!(
                "{}: {:.2} ms a pod",
                s.name,
                (b.1 - a.1) / (b.0 - a.0) * 1e3
            )
        })
        .collect();
    // No worse than linear: 10 times the pods from 100 to 1,000 cost at
    // most 10 times the time (and a fifth more for the noise).
    let linear = series
        .iter()
        .all(|s| s.points[4].1 <= s.points[2].1 * 10.0 * 1.2);
    Curve {
        title: "drain time against pods on the node",
        brief: "linear",
        legend_low: false,
        x: "pods on the node",
        y: "seconds",
        log_y: false,
        verdict: format!(
            "{}: a fixed start ({fixed:.2} s on nmo-sim: the admission, lease, cordon, pod list), then from 100 to 1,000 pods {}",
            if linear {
                "no worse than linear: yes"
            } else {
                "no worse than linear: NO"
            },
            per_pod.join(", ")
        ),
        short: if linear { "is" } else { "is NOT" },
        series,
        expected: "linear in the pods, after a fixed start",
    }
}

/// One drain per size on the cluster of `kubeconfig` (nodes `d<size>-<run>`
/// with as many pods): the controller with the default policy, the median
/// of `runs` per size.
async fn drain_series(kubeconfig: &str, runs: usize, what: &str) -> Vec<(f64, f64)> {
    const SIZES: [usize; 5] = [10, 30, 100, 300, 1000];
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let running = run_controller(
        kubeconfig,
        PolicyStore::single(engine.default_policy().unwrap()),
    )
    .await;
    let client = nmo::client::client_from_kubeconfig(kubeconfig)
        .await
        .unwrap();
    let nms: Api<NodeMaintenance> = Api::all(client);
    let mut points = Vec::new();
    for size in SIZES {
        let mut times = Vec::new();
        for run in 0..runs {
            let t = Instant::now();
            let names = create_nms(&nms, &[format!("d{size}-{run}")]).await;
            wait_succeeded(&nms, &names).await;
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        eprintln!("drain, {what}: {size} pods, {median:.3} s");
        points.push((size as f64, median));
    }
    running.abort();
    points
}

/// Admission against the nodes: for each size a fresh cluster, the
/// controller with `max-unavailable` (at most 10 at once), 10
/// maintenances created at once; nmo-sim up to 5,000 nodes, the real
/// control plane up to 1,000.
async fn admission_curve(real: bool) -> Curve {
    const AT_ONCE: usize = 10;
    let mut decision = Vec::new();
    let mut requests = Vec::new();
    for size in [10, 100, 1000, 3000, 5000] {
        let c = SimCluster::start(sim_options()).await.unwrap();
        c.apply_yaml(&nmo::crd::crd_yaml()).unwrap();
        for i in 1..=size {
            c.add_node(&format!("worker-{i}")).unwrap();
        }
        c.record_audit(true);
        let audit = || {
            c.audit()
                .iter()
                .filter(|r| r.user_agent == nmo::client::USER_AGENT)
                .map(|r| format!("{} {}", r.verb, r.resource))
                .collect::<Vec<_>>()
        };
        let (ms, per) = admission_point(&c.kubeconfig(), size, AT_ONCE, audit).await;
        decision.push((size as f64, ms));
        requests.push((size as f64, per));
    }
    let mut series = vec![
        Series {
            name: "nmo-sim: admit decision, mean ms",
            points: decision,
        },
        Series {
            name: "nmo-sim: API requests a maintenance",
            points: requests,
        },
    ];
    if real {
        let mut decision = Vec::new();
        let mut requests = Vec::new();
        for size in [10, 100, 1000] {
            let cp = ControlPlane::start(Options {
                audit: true,
                ..Options::workers(size)
            })
            .await
            .expect("the real control plane starts");
            common::install_crd(&cp).await;
            let audit = || {
                cp.audit()
                    .into_iter()
                    .filter(|r| r.user_agent == nmo::client::USER_AGENT)
                    .map(|r| common::verb_resource(&r.verb, &r.uri))
                    .collect::<Vec<_>>()
            };
            let (ms, per) = admission_point(&cp.kubeconfig(), size, AT_ONCE, audit).await;
            decision.push((size as f64, ms));
            requests.push((size as f64, per));
            cp.stop();
        }
        series.push(Series {
            name: "real control plane: admit decision, mean ms",
            points: decision,
        });
        series.push(Series {
            name: "real control plane: API requests a maintenance",
            points: requests,
        });
    }
    let flat = |s: &Series| {
        let first = s.points[0].1;
        let worst = s.points.iter().map(|p| p.1).fold(first, f64::max);
        worst / first
    };
    let requests_growth = flat(&series[1]).max(series.get(3).map_or(1.0, flat));
    let decisions = &series[0].points;
    let decision_growth = growth(&decisions[1..]);
    let flat_ok = requests_growth <= 1.10;
    let linear_ok = decision_growth <= 1.15;
    Curve {
        title: "admission against nodes",
        brief: "flat requests, linear time",
        legend_low: true,
        x: "nodes in the cluster",
        y: "ms a decision / requests a maintenance",
        log_y: true,
        verdict: format!(
            "requests a maintenance {} (the most {requests_growth:.2}x the fewest); decision time {}: growth exponent {decision_growth:.2} from 100 to 5,000 nodes, {:.2} ms at 5,000 on nmo-sim",
            if flat_ok { "flat: yes" } else { "flat: NO" },
            if linear_ok {
                "no worse than linear: yes"
            } else {
                "no worse than linear: NO"
            },
            decisions.last().map_or(0.0, |l| l.1),
        ),
        short: if flat_ok && linear_ok { "is" } else { "is NOT" },
        series,
        expected: "requests a maintenance flat; decision time linear in the nodes",
    }
}

/// One size of the admission curve: the controller with `max-unavailable`
/// (at most `at_once`), `at_once` maintenances created at once on the
/// cluster of `kubeconfig`; returns the mean decision time (ms) and the
/// operator's requests (`audit`: `verb what` of each so far) per
/// maintenance.
async fn admission_point(
    kubeconfig: &str,
    size: usize,
    at_once: usize,
    audit: impl Fn() -> Vec<String>,
) -> (f64, f64) {
    let dir = max_unavailable_dir(&at_once.to_string());
    let metrics = nmo::registry::OperatorMetrics::register().unwrap();
    let engine =
        PolicyEngine::observed(EngineConfig::default(), metrics.policy.observer()).unwrap();
    let running = run_controller(
        kubeconfig,
        PolicyStore::from_dir(engine, dir.path(), None).unwrap(),
    )
    .await;
    let before = audit().len();
    let client = nmo::client::client_from_kubeconfig(kubeconfig)
        .await
        .unwrap();
    let nms: Api<NodeMaintenance> = Api::all(client);
    let nodes: Vec<String> = (1..=at_once).map(|i| format!("worker-{i}")).collect();
    let names = create_nms(&nms, &nodes).await;
    wait_succeeded(&nms, &names).await;
    let made = audit().split_off(before);
    running.abort();
    let per_maintenance = made.len() as f64 / at_once as f64;
    let (admits, seconds) = metrics.policy.timed(Decision::Admit);
    let mean_ms = seconds / admits.max(1) as f64 * 1e3;
    let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
    for r in &made {
        *kinds.entry(r.as_str()).or_default() += 1;
    }
    eprintln!(
        "admission: {size} nodes, {admits} decisions at {mean_ms:.3} ms, {per_maintenance:.1} requests a maintenance: {kinds:?}"
    );
    (mean_ms, per_maintenance)
}

/// The binary's resident memory with `n` NodeMaintenances present, each
/// on its own node, a tenth admitted.
async fn memory_curve() -> Curve {
    const SIZES: [usize; 4] = [10, 100, 300, 1000];
    let mut rss = Vec::new();
    let mut peak = Vec::new();
    for size in SIZES {
        let c = SimCluster::start(sim_options()).await.unwrap();
        c.apply_yaml(&nmo::crd::crd_yaml()).unwrap();
        let nodes: Vec<String> = (1..=size).map(|i| format!("worker-{i}")).collect();
        for n in &nodes {
            c.add_node(n).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let policies = max_unavailable_dir("10%");
        let kc = dir.path().join("kc");
        c.write_kubeconfig(&kc).unwrap();
        let (child, _) = start_binary(
            &kc,
            &dir.path().join("cache"),
            &[format!("--policy-dir={}", policies.path().display())],
        )
        .await;
        let pid = child.id().unwrap();
        let client = nmo::client::client_from_kubeconfig(&c.kubeconfig())
            .await
            .unwrap();
        let nms: Api<NodeMaintenance> = Api::all(client);
        for chunk in nodes.chunks(100) {
            create_nms(&nms, chunk).await;
        }
        // Every maintenance seen: admitted, or waiting with the reason.
        wait_nms(&nms, size, Duration::from_secs(300), "seen", seen).await;
        let settle = Instant::now() + Duration::from_secs(3);
        tokio::time::sleep_until(settle.into()).await;
        let now_mib = proc_status_kib(pid, "VmRSS:") as f64 / 1024.0;
        let peak_mib = proc_status_kib(pid, "VmHWM:") as f64 / 1024.0;
        eprintln!("memory: {size} maintenances, {now_mib:.1} MiB now, {peak_mib:.1} MiB peak");
        stop_binary(child).await;
        rss.push((size as f64, now_mib));
        peak.push((size as f64, peak_mib));
    }
    let per_nm_kib = (rss[3].1 - rss[0].1) / (rss[3].0 - rss[0].0) * 1024.0;
    let last = peak.last().map_or(0.0, |p| p.1);
    Curve {
        title: "nmo binary memory against maintenances (nmo-sim)",
        brief: "a base plus a little each",
        legend_low: true,
        x: "NodeMaintenances present",
        y: "MiB resident",
        log_y: false,
        short: if last <= 150.0 { "is" } else { "is NOT" },
        verdict: format!(
            "{per_nm_kib:.0} KiB a maintenance on a fixed base; {last:.1} MiB peak at 1,000 (≤ 150 MiB: {})",
            if last <= 150.0 { "met" } else { "MISSED" }
        ),
        series: vec![
            Series {
                name: "VmRSS, settled",
                points: rss,
            },
            Series {
                name: "VmHWM, peak",
                points: peak,
            },
        ],
        expected: "a fixed base plus a small linear part",
    }
}

/// The default policy's `plan-drain` against the pods it is handed.
fn decision_curve() -> Curve {
    const SIZES: [usize; 6] = [110, 250, 500, 1000, 2000, 5000];
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let policy = engine.default_policy().unwrap();
    let node = fixtures::node("worker-1");
    let m = selfcheck::sample_maintenance();
    let mut p50 = Vec::new();
    let mut p95 = Vec::new();
    for size in SIZES {
        let pods: std::sync::Arc<[_]> = fixtures::node_pods("worker-1", size).into();
        let (med, high) = measure(Duration::from_secs(2), 30, || {
            let plan = policy
                .plan_drain_shared(
                    &m,
                    node.clone(),
                    pods.clone(),
                    Default::default(),
                    Default::default(),
                )
                .expect("plan");
            std::hint::black_box(plan);
        });
        eprintln!(
            "decision: {size} pods, p50 {:.3} ms, p95 {:.3} ms",
            med.as_secs_f64() * 1e3,
            high.as_secs_f64() * 1e3
        );
        p50.push((size as f64, med.as_secs_f64() * 1e3));
        p95.push((size as f64, high.as_secs_f64() * 1e3));
    }
    let growth = growth(&p50);
    let last = p95.last().map_or(0.0, |p| p.1);
    Curve {
        title: "plan-drain decision time against pods",
        brief: "linear",
        legend_low: false,
        x: "pods handed to the policy",
        y: "ms",
        log_y: true,
        short: if growth <= 1.15 && last <= 5.0 {
            "is"
        } else {
            "is NOT"
        },
        verdict: format!(
            "{}: growth exponent {growth:.2}; p95 at 5,000 pods {last:.2} ms (≤ 5 ms: {})",
            if growth <= 1.15 {
                "linear: yes"
            } else {
                "linear: NO"
            },
            if last <= 5.0 { "met" } else { "MISSED" }
        ),
        series: vec![
            Series {
                name: "p50",
                points: p50,
            },
            Series {
                name: "p95",
                points: p95,
            },
        ],
        expected: "linear in the pods",
    }
}

fn print(curve: &Curve) {
    println!();
    println!("{} — should be: {}", curve.title, curve.expected);
    print!("| {} |", curve.x);
    for s in &curve.series {
        print!(" {} |", s.name);
    }
    println!();
    println!("|---:|{}", "---:|".repeat(curve.series.len()));
    for (i, (x, _)) in curve.series[0].points.iter().enumerate() {
        print!("| {x} |");
        for s in &curve.series {
            match s.points.get(i) {
                Some(p) => print!(" {:.3} |", p.1),
                None => print!(" - |"),
            }
        }
        println!();
    }
    println!("is: {}", curve.verdict);
}

/// A curve's lines and points, and its legend, on `chart`.
fn draw_series<'a, DB, X, Y>(
    chart: &mut plotters::chart::ChartContext<
        'a,
        DB,
        plotters::coord::cartesian::Cartesian2d<X, Y>,
    >,
    curve: &Curve,
) -> Result<(), String>
where
    DB: plotters::prelude::DrawingBackend + 'a,
    X: plotters::coord::ranged1d::Ranged<ValueType = f64>,
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
{
    use plotters::prelude::*;
    for (i, s) in curve.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(s.points.clone(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(s.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(if curve.legend_low {
            SeriesLabelPosition::LowerRight
        } else {
            SeriesLabelPosition::UpperLeft
        })
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

/// The four curves, two by two, on a log x axis.
fn draw(curves: &[Curve], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let font = ["DejaVuSans.ttf", "dejavu/DejaVuSans.ttf"]
        .iter()
        .map(|f| Path::new("/usr/share/fonts/truetype").join(f))
        .find_map(|p| std::fs::read(p).ok())
        .ok_or("no DejaVu Sans font under /usr/share/fonts/truetype")?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(font.into()))
        .map_err(|_| "the font does not parse")?;
    let root = BitMapBackend::new(path, (1400, 1000)).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, curve) in root.split_evenly((2, 2)).iter().zip(curves) {
        let all = curve.series.iter().flat_map(|s| s.points.iter());
        let (x0, x1) = all
            .clone()
            .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
        let (y0, y1) = all.fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
        let title = format!(
            "{}: should be {}, {}",
            curve.title, curve.brief, curve.short
        );
        let mut builder = ChartBuilder::on(area);
        builder
            .caption(title, ("sans-serif", 15))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(60);
        let x = (x0 * 0.8..x1 * 1.25).log_scale();
        let number = |v: &f64| {
            if *v >= 10.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.2}")
            }
        };
        // The mesh is the same on either y scale; the scale's type differs.
        macro_rules! chart_on {
            ($y:expr) => {{
                let mut chart = builder.build_cartesian_2d(x, $y)?;
                chart
                    .configure_mesh()
                    .x_desc(curve.x)
                    .y_desc(curve.y)
                    .x_labels(6)
                    .y_labels(6)
                    .x_label_formatter(&number)
                    .y_label_formatter(&number)
                    .label_style(("sans-serif", 13))
                    .draw()?;
                draw_series(&mut chart, curve)?;
            }};
        }
        if curve.log_y {
            chart_on!((y0 * 0.5..y1 * 2.0).log_scale());
        } else {
            chart_on!(0.0..y1 * 1.2);
        }
    }
    root.present()?;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let which = env_list();
    let wanted = |name: &str| which.iter().any(|w| w == name);
    let mut curves = Vec::new();
    // NMO_BENCH_REAL=0: nmo-sim only (no Go-built control plane).
    let real = std::env::var("NMO_BENCH_REAL").as_deref() != Ok("0");
    if wanted("drain") {
        curves.push(drain_curve(real).await);
    }
    if wanted("admission") {
        curves.push(admission_curve(real).await);
    }
    if wanted("memory") {
        curves.push(memory_curve().await);
    }
    if wanted("decision") {
        curves.push(tokio::task::spawn_blocking(decision_curve).await.unwrap());
    }
    for curve in &curves {
        print(curve);
    }
    if curves.len() == 4 {
        let path = std::env::var_os("NMO_BENCH_PNG").map_or_else(
            || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/curves.png")),
            PathBuf::from,
        );
        match draw(&curves, &path) {
            Ok(()) => println!("\ndrawn: {}", path.display()),
            Err(e) => println!("\nnot drawn: {e}"),
        }
    }
}
