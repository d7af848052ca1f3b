//! A real Prometheus for the tests (Debian's `prometheus` package, with
//! `promtool`; `.ci/run` installs it): finding the tools, starting a server
//! on a loopback port, asking its HTTP API, and running promtool.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The tool's path; `None` (skip) when it is missing outside CI. In CI
/// (`CI` set) a missing tool fails the test.
pub fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is missing: install Debian's prometheus package (.ci/run does)"
        );
        eprintln!("skipped: {name} is not installed (apt-get install prometheus)");
    }
    found
}

/// Runs `cmd` in `dir`; whether it succeeded, and its output.
pub fn run(cmd: &Path, args: &[&str], dir: &Path) -> (bool, String) {
    let out = std::process::Command::new(cmd)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (out.status.success(), super::printed(&out))
}

/// The rule `alert` of a PrometheusRule.
pub fn rule_of(rule: &Value, alert: &str) -> Value {
    rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .find(|r| r["alert"] == alert)
        .unwrap_or_else(|| panic!("no rule {alert}"))
        .clone()
}

/// An alert as `promtool test rules` should show it: `labels` (the
/// alert's own, `__name__` left out) with the rule's labels, and the
/// rule's annotations with each `{{ $labels.x }}` filled in from `labels`.
pub fn expected_alert(rule: &Value, labels: &Value) -> Value {
    let mut exp = labels.as_object().unwrap().clone();
    exp.remove("__name__");
    for (k, v) in rule["labels"].as_object().into_iter().flatten() {
        exp.insert(k.clone(), v.clone());
    }
    let fill = |text: &str| {
        exp.iter().fold(text.to_owned(), |t, (k, v)| {
            t.replace(
                &format!("{{{{ $labels.{k} }}}}"),
                v.as_str().unwrap_or_default(),
            )
        })
    };
    let annotations: serde_json::Map<String, Value> = rule["annotations"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(fill(v.as_str().unwrap()))))
        .collect();
    serde_json::json!({"exp_labels": exp, "exp_annotations": annotations})
}

/// Runs `promtool test rules` on `tests` (written to `dir/tests.yaml`,
/// the rule files it names in `dir`); fails the test with promtool's
/// output unless every case passes. Returns that output.
pub fn promtool_test(promtool: &Path, dir: &Path, tests: &Value) -> String {
    std::fs::write(dir.join("tests.yaml"), nmo::yaml::to_string(tests).unwrap()).unwrap();
    let (ok, out) = run(promtool, &["test", "rules", "tests.yaml"], dir);
    assert!(ok, "promtool test rules: {out}");
    out
}

/// A PrometheusRule's groups, written to `dir/name` as a rules file.
pub fn rules_file(rule: &Value, dir: &Path, name: &str) -> PathBuf {
    let groups = serde_json::json!({"groups": rule["spec"]["groups"]});
    let path = dir.join(name);
    std::fs::write(&path, nmo::yaml::to_string(&groups).unwrap()).unwrap();
    path
}

/// A Prometheus server on a free loopback port, its data in `dir`,
/// scraping and evaluating every second; stopped when dropped.
pub struct Server {
    /// `http://host:port`.
    base: String,
    _process: Option<tokio::process::Child>,
}

impl Server {
    /// Starts `prometheus` with `scrape_configs` (YAML, a list) and the
    /// rule files `rules` (relative to `dir`).
    pub fn start(prometheus: &Path, dir: &Path, scrape_configs: &str, rules: &[&str]) -> Server {
        let port = super::free_port();
        let rule_files = serde_json::to_string(rules).unwrap();
        std::fs::write(
            dir.join("prometheus.yml"),
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: {rule_files}\nscrape_configs:\n{scrape_configs}"
            ),
        )
        .unwrap();
        let process = tokio::process::Command::new(prometheus)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Server {
            base: format!("http://127.0.0.1:{port}"),
            _process: Some(process),
        }
    }

    /// A Prometheus running elsewhere (a pod), at `base` (`http://host:port`).
    pub fn at(base: String) -> Server {
        Server {
            base,
            _process: None,
        }
    }

    /// Asks the HTTP API (`/api/v1/<path>`) with `params`; `Null` when it
    /// does not answer.
    pub async fn api(&self, path: &str, params: &[(&str, &str)]) -> Value {
        let mut cmd = tokio::process::Command::new("curl");
        cmd.args(["-s", "--max-time", "10", "--get"]);
        for (k, v) in params {
            cmd.arg("--data-urlencode").arg(format!("{k}={v}"));
        }
        let out = cmd
            .arg(format!("{}/api/v1/{path}", self.base))
            .output()
            .await
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// An instant query.
    pub async fn query(&self, expr: &str) -> Value {
        self.api("query", &[("query", expr)]).await
    }

    /// An instant query's result vector (empty when it failed).
    pub async fn vector(&self, expr: &str) -> Vec<Value> {
        self.query(expr).await["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}
