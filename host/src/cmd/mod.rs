//! The command line.

/// `println!` for a command's output, through [`output::write_out`]: a reader that
/// goes ends the command quietly.
macro_rules! outln {
    () => {
        $crate::cmd::output::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cmd::output::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` for a command's output, through [`output::write_out`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cmd::output::write_out(format_args!($($arg)*))
    };
}

mod cluster;
#[cfg(feature = "demo")]
mod demo;
mod kubectl;
mod output;
mod policy;
mod policy_configmap;
#[cfg(feature = "demo")]
mod scene;
#[cfg(feature = "demo")]
mod workload;

pub use kubectl::{Plugin, invoked_as_plugin, run_plugin};
pub use output::error_text;
use policy::{load_policies, policy_check, policy_push, policy_test};

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use std::time::Duration;

use nmo::telemetry::{Encoder, LogFormat, TimeEncoding, ZapLevel};

/// controller-runtime's webhook certificate folder.
const DEFAULT_WEBHOOK_CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";

// A flag given twice takes its last value, as the Go operator's (pflag)
// do: the guide's `--zap-level=debug`, appended to a Deployment's args
// that already say `--zap-log-level=info`, is the level.
/// Node Maintenance Operator with WebAssembly drain policies.
#[derive(Debug, Parser)]
#[command(name = "nmo", version, about, args_override_self = true)]
pub struct Cli {
    /// Log level, as the Go operator's `--zap-log-level`: debug, info,
    /// error, panic, or a verbosity above 0 (debug). Default: info for the
    /// operator (debug with --zap-devel), error for the other commands.
    /// `--zap-level` is its older name.
    #[arg(long = "zap-log-level", alias = "zap-level", global = true)]
    pub zap_level: Option<ZapLevel>,

    /// Development logging, as controller-runtime's: the console encoder
    /// and debug level unless --zap-encoder or --zap-log-level say
    /// otherwise. (The Go operator v0.21.0 defaults to it; nmo defaults to
    /// JSON at info, see docs/drop-in.md.)
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub zap_devel: bool,

    /// Log encoding: json or console (default json, console with
    /// --zap-devel).
    #[arg(long, value_name = "ENCODER")]
    pub zap_encoder: Option<Encoder>,

    /// How log times are written: epoch, millis, nano, iso8601, rfc3339 or
    /// rfc3339nano (the Go operator v0.21.0's, the default).
    #[arg(long, value_name = "ENCODING")]
    pub zap_time_encoding: Option<TimeEncoding>,

    /// Accepted as the Go operator's (info, error or panic): nmo's log
    /// lines carry no stack traces, so it changes nothing (said once at
    /// start).
    #[arg(long, value_name = "LEVEL", value_parser = ["info", "error", "panic"])]
    pub zap_stacktrace_level: Option<String>,

    /// The kubeconfig file to run against, as controller-runtime's flag
    /// (default: KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// Accepted as the Go operator's (HTTP/2 for the metrics and webhook
    /// servers, off by default there as here): nmo serves HTTP/1.1 only,
    /// so `true` is said once at start and changes nothing.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub enable_http2: bool,

    /// Maintenance passes (admission, lease, cordon, plan, status writes)
    /// at once. A drain, removing pods or waiting (a budget, a Job, a
    /// handshake, a surge, volumes), holds none: its removals share
    /// --max-removals-in-flight, so no drain, however long it waits,
    /// delays another node's.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_maintenances: u16,

    /// Pod evictions and deletions in flight at once, every drain's
    /// together: many drains at once share the API server rather than
    /// flood it.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_removals_in_flight: u16,

    /// Elect a leader (a coordination Lease) so only one replica reconciles.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub leader_elect: bool,

    /// Namespace of the leader election lease (default: the pod's own, from
    /// POD_NAMESPACE or the service account, else
    /// node-maintenance-operator-system).
    #[arg(long)]
    pub leader_election_namespace: Option<String>,

    /// Where Prometheus metrics are served (`/metrics`); `0` turns them
    /// off. The Go operator v0.21.0's default, HTTPS on :8443.
    #[arg(long, default_value = ":8443")]
    pub metrics_bind_address: String,

    /// Serve metrics over HTTPS, only to clients the cluster authenticates
    /// (TokenReview) and authorizes for `get /metrics` (SubjectAccessReview),
    /// HTTP/2 off, as the Go operator v0.21.0 always does. `=false`: plain
    /// HTTP to anyone who reaches the port.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool)]
    pub metrics_secure: bool,

    /// Directory with the metrics server's tls.crt and tls.key (with
    /// --metrics-secure); without it, a self-signed certificate is made at
    /// start.
    #[arg(long)]
    pub metrics_cert_dir: Option<PathBuf>,

    /// Where the probes are served (`/healthz`, `/readyz`); `0` turns them off.
    #[arg(long, default_value = ":8081")]
    pub health_probe_bind_address: String,

    /// Where the validating webhook is served (TLS); `0` turns it off.
    #[arg(long, default_value = ":9443")]
    pub webhook_bind_address: String,

    /// Directory with the webhook's tls.crt and tls.key (re-read when they
    /// change). Without them, one warning, and the webhook starts when
    /// they appear (a Secret mounted after the pod started).
    #[arg(long, default_value = DEFAULT_WEBHOOK_CERT_DIR)]
    pub webhook_cert_dir: PathBuf,

    #[command(flatten)]
    pub policies: policy::PolicyFlags,

    /// Namespace of the node leases, as the Go operator's LEASE_NAMESPACE.
    #[arg(
        long,
        env = "LEASE_NAMESPACE",
        default_value = "medik8s-leases",
        hide_env_values = true
    )]
    pub lease_namespace: String,

    /// This instance's name, for events and the leader identity (the pod
    /// name in a cluster).
    #[arg(long, env = "HOSTNAME", default_value = "nmo", hide = true)]
    pub instance: String,

    /// The namespace this pod runs in (the leader lock's default
    /// namespace), from the downward API.
    #[arg(long, env = "POD_NAMESPACE", hide = true)]
    pub pod_namespace: Option<String>,

    /// With no subcommand, nmo runs the operator against the current
    /// kubeconfig (KUBECONFIG, ~/.kube/config, or in-cluster).
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the NodeMaintenance CRD as YAML.
    Crd {
        /// Apply it server-side instead (taking over the fields another
        /// manager set, as the Go operator's install leaves them), and
        /// wait until it is served: what the Helm chart's hook runs.
        #[arg(long)]
        apply: bool,
    },
    /// Remove what an uninstall leaves in the operator's namespace: once
    /// its pods are gone (at most 2 minutes), the leader lease no pod holds
    /// and the webhook's certificate Secret whose Certificate is gone.
    /// What the Helm chart's post-delete hook runs.
    Cleanup {
        /// The operator's namespace (default: this pod's).
        #[arg(long)]
        namespace: Option<String>,
    },
    /// Run the operator on an embedded simulated cluster: put a node into
    /// maintenance, show the drain live, then restore the node.
    #[cfg(feature = "demo")]
    Demo {
        /// A policy file (.wasm), or the name of a policy this build made
        /// (never-force, stateful-last, opt-out, give-up, ...), to use
        /// instead of the embedded default.
        #[arg(long)]
        policy: Option<PathBuf>,
        /// A policy directory (`.wasm` files and `policies.yaml`, where the
        /// policies' settings go), read as the operator reads --policy-dir.
        #[arg(long, conflicts_with = "policy")]
        policy_dir: Option<PathBuf>,
        /// Worker nodes in the simulated cluster (2 to 50: worker-1 is
        /// drained onto the others).
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(2..=50))]
        nodes: u16,
        /// Pods in the workload, roughly (10 to 2000).
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u16).range(10..=2000))]
        pods: u16,
        /// Leave the cluster up after the maintenance, with a kubeconfig for
        /// kubectl, until Ctrl-C.
        #[arg(long)]
        keep_running: bool,
        /// Your own workload instead of the demo's: a manifest file (the
        /// YAML you apply, or what `kubectl get deploy,sts,pdb,pods -o
        /// yaml` prints); pods a controller of the file makes are made
        /// again, a pod bound to a node the demo lacks is scheduled again.
        #[arg(long, value_name = "FILE", conflicts_with = "pods")]
        workload: Option<PathBuf>,
    },
    /// `plan`, `start`, `status`, `stop`: the same commands as `kubectl
    /// nm` (the binary, named kubectl-nm on PATH, is that plugin).
    #[command(flatten)]
    Maintenance(kubectl::PluginCommand),
    /// Work with drain policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
}

impl Cli {
    /// The log level: the flag's, else info for the operator (its logs
    /// are its output) and error for commands a person reads.
    /// Whether the command is `nmo demo` (which runs the operator).
    pub fn is_demo(&self) -> bool {
        #[cfg(feature = "demo")]
        return matches!(self.command, Some(Command::Demo { .. }));
        #[cfg(not(feature = "demo"))]
        return false;
    }

    pub fn log_level(&self) -> ZapLevel {
        self.zap_level.unwrap_or(match self.command {
            None if self.zap_devel => ZapLevel::Debug,
            None => ZapLevel::Info,
            Some(_) => ZapLevel::Error,
        })
    }

    /// The log lines' encoder and time encoding, as controller-runtime
    /// picks them from the zap flags.
    pub fn log_format(&self) -> LogFormat {
        LogFormat {
            encoder: self.zap_encoder.unwrap_or(if self.zap_devel {
                Encoder::Console
            } else {
                Encoder::Json
            }),
            time: self.zap_time_encoding.unwrap_or_default(),
        }
    }

    /// Says, once at start, which Go operator flags were given that
    /// change nothing in nmo.
    pub fn log_accepted_flags(&self) {
        if self.enable_http2 {
            tracing::info!(
                "--enable-http2: nmo serves HTTP/1.1 only (the webhook and metrics servers); the flag changes nothing"
            );
        }
        if let Some(level) = &self.zap_stacktrace_level {
            tracing::info!(
                level = %level,
                "--zap-stacktrace-level: nmo's log lines carry no stack traces; the flag changes nothing"
            );
        }
    }
}

/// A boolean flag's value as Go's `flag` package reads it (`--flag`,
/// `--flag=false`, `=0`, `=T`, ...): the Go operator's Deployment writes
/// `--enable-http2=false`.
fn go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        other => Err(format!("invalid boolean value {other:?}")),
    }
}

/// The command line with Go's single-dash long flags (`-leader-elect`,
/// `-kubeconfig=FILE`, as Go's `flag` package also takes them) written
/// with two dashes, for the operator's own flags.
pub fn go_style_args(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let longs: Vec<String> = cmd
        .get_arguments()
        .flat_map(|a| {
            a.get_long_and_visible_aliases()
                .unwrap_or_default()
                .into_iter()
                .chain(a.get_all_aliases().unwrap_or_default())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    args.into_iter()
        .map(|arg| {
            let Some(text) = arg.to_str() else {
                return arg;
            };
            let Some(rest) = text.strip_prefix('-') else {
                return arg;
            };
            if rest.starts_with('-') {
                return arg;
            }
            let name = rest.split('=').next().unwrap_or(rest);
            if name.len() > 1 && longs.iter().any(|l| l == name) {
                format!("-{text}").into()
            } else {
                arg
            }
        })
        .collect()
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Check that each file is a policy of the drain-policy world that
    /// answers a sample drain and every kind of failure validly; a
    /// directory is checked as the operator loads a policy directory
    /// (every policy, and policies.yaml).
    Check {
        /// Policy files (.wasm) or policy directories. `default` names the
        /// embedded default policy.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Add one policy to the operator's policies ConfigMap in the cluster
    /// (or replace the one of that name), keeping every other key: the
    /// policy is checked first, as `nmo policy check` does, and the
    /// ConfigMap must stay within the 1 MiB the API server allows.
    Add(policy_configmap::AddArgs),
    /// The policies the operator loads (its ConfigMap, or a policy
    /// directory): name, sha256 (as `status.policy` shows it), which is the
    /// default, where each came from (a pulled one: its OCI reference).
    /// Each is loaded as the operator loads it.
    List(policy_configmap::ListArgs),
    /// Remove one policy from the operator's policies ConfigMap, keeping
    /// every other key; refused when the set left would be one the
    /// operator refuses (policies.yaml still names it), or while
    /// maintenances that have not finished drain with it (unless --force).
    Rm(policy_configmap::RmArgs),
    /// What a policy is (a file, `default`, or a name in the policies
    /// ConfigMap): its sha256 as status.policy records it, its size, the
    /// contract version it was built against, its imports and exports,
    /// and whether it passes the operator's self-check (exit 1 if not).
    Inspect(policy_configmap::InspectArgs),
    /// Push a policy to an OCI registry as a Wasm artifact (checked first,
    /// as `nmo policy check` does) and print the reference pinned by
    /// digest that policies.yaml's `pull:` takes. Credentials: `docker
    /// login`'s (~/.docker/config.json).
    Push {
        /// The policy (.wasm).
        file: PathBuf,
        /// Where to push it: REGISTRY/REPOSITORY[:TAG].
        reference: String,
        /// Its name (the artifact's title NAME.wasm, and the key the
        /// printed policies.yaml line gives it; default: the file's name,
        /// without .wasm, `_` as `-`).
        #[arg(long)]
        name: Option<String>,
        /// A registry to push to over plain HTTP (loopback ones always
        /// are).
        #[arg(long = "insecure-registry", value_name = "HOST")]
        insecure_registries: Vec<String>,
    },
    /// Run a policy on scenarios (YAML: a maintenance, a node, pods as
    /// `kubectl get -o yaml` prints them, and the expected decisions).
    /// Exit code 0: all passed; 1: some failed; 2: the policy or a scenario
    /// could not be read.
    Test {
        /// The policy (.wasm); `default` names the embedded default policy.
        policy: PathBuf,
        /// Scenario files, or directories of them.
        #[arg(required = true)]
        scenarios: Vec<PathBuf>,
    },
    /// Write a new policy crate NAME (in the current directory, or --dir):
    /// a policy to start from (the Go operator's rules), a scenario file, a
    /// README with the commands, and the SDK and WIT package this nmo
    /// loads, so it builds without this repository.
    New {
        /// The policy's name: lowercase letters, digits and '-'. It names
        /// the crate and, as the ConfigMap key `NAME.wasm`, the policy.
        name: String,
        /// Where to create the crate's directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Internal: compiles one policy read from stdin under an address-space
    /// limit and writes the compiled artifact to stdout. The operator runs
    /// it as a child process so that a policy which is costly to compile
    /// cannot stall or exhaust the operator.
    #[command(hide = true)]
    CompileWorker {
        #[arg(long)]
        max_memory_bytes: u64,
    },
}

/// `nmo crd --apply`: this build's CRD applied server-side, then served.
fn apply_crd(cli: &Cli) -> anyhow::Result<()> {
    tokio::runtime::Runtime::new()?.block_on(async {
        let client = nmo::client::operator_client(
            cluster::kube_config(cli.kubeconfig.as_deref(), None).await?,
        )?;
        nmo::crd::apply(&client, std::time::Duration::from_secs(60)).await?;
        out!(
            "customresourcedefinition.apiextensions.k8s.io/{} serverside-applied",
            nmo::crd::CRD_NAME
        );
        Ok(())
    })
}

fn clean_up(cli: &Cli, namespace: Option<String>) -> anyhow::Result<()> {
    let namespace = namespace.or_else(|| own_namespace(cli)).ok_or_else(|| {
        anyhow::anyhow!("which namespace? --namespace (or run in the operator's pod)")
    })?;
    tokio::runtime::Runtime::new()?.block_on(async {
        let client = nmo::client::operator_client(
            cluster::kube_config(cli.kubeconfig.as_deref(), None).await?,
        )?;
        let cleaned =
            nmo::uninstall::clean_up(&client, &namespace, std::time::Duration::from_secs(120))
                .await?;
        for (removed, what) in [
            (
                cleaned.lease,
                format!(
                    "lease.coordination.k8s.io/{}",
                    nmo::controller::leader::LOCK_NAME
                ),
            ),
            (
                cleaned.secret,
                format!("secret/{}", nmo::uninstall::WEBHOOK_SECRET),
            ),
        ] {
            if removed {
                out!("{what} deleted");
            }
        }
        Ok(())
    })
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        None => operator(&cli).map(|()| ExitCode::SUCCESS),
        Some(Command::Crd { apply: false }) => {
            out!("{}", nmo::crd::crd_yaml());
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Crd { apply: true }) => apply_crd(&cli).map(|()| ExitCode::SUCCESS),
        Some(Command::Cleanup { ref namespace }) => {
            clean_up(&cli, namespace.clone()).map(|()| ExitCode::SUCCESS)
        }
        #[cfg(feature = "demo")]
        Some(Command::Demo {
            policy,
            policy_dir,
            nodes,
            pods,
            keep_running,
            workload,
        }) => {
            let nodes = usize::from(nodes);
            let workload = workload
                .map(|file| {
                    let names = (1..=nodes).map(|i| format!("worker-{i}")).collect();
                    workload::read(&file, &names)
                })
                .transpose()?;
            let opts = demo::DemoOptions {
                policy: policy.as_deref().map(demo::policy_path).transpose()?,
                policy_dir,
                nodes,
                pods: usize::from(pods),
                keep_running,
                workload,
            };
            let outcome = tokio::runtime::Runtime::new()?.block_on(demo::run(opts))?;
            Ok(outcome.exit_code())
        }
        Some(Command::Maintenance(command)) => kubectl::run_plugin(kubectl::Plugin { command }),
        Some(Command::Policy(PolicyCommand::Check { files })) => policy_check(&files),
        Some(Command::Policy(PolicyCommand::Add(args))) => policy_configmap::run_policy_add(&args),
        Some(Command::Policy(PolicyCommand::List(args))) => {
            policy_configmap::run_policy_list(&args)
        }
        Some(Command::Policy(PolicyCommand::Rm(args))) => policy_configmap::run_policy_rm(&args),
        Some(Command::Policy(PolicyCommand::Inspect(args))) => {
            policy_configmap::run_policy_inspect(&args)
        }
        Some(Command::Policy(PolicyCommand::Push {
            file,
            reference,
            name,
            insecure_registries,
        })) => policy_push(&file, &reference, name, insecure_registries),
        Some(Command::Policy(PolicyCommand::Test { policy, scenarios })) => {
            Ok(policy_test(&policy, &scenarios))
        }
        Some(Command::Policy(PolicyCommand::New { name, dir })) => {
            let made = nmo::policy::scaffold::create(&dir, &name)?;
            let stem = name.replace('-', "_");
            outln!(
                "created {}\n\n  cd {}\n  cargo build --release --target wasm32-wasip2\n  nmo policy test target/wasm32-wasip2/release/{stem}.wasm scenarios/\n\n(once per machine: rustup target add wasm32-wasip2)",
                made.display(),
                made.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Policy(PolicyCommand::CompileWorker { max_memory_bytes })) => {
            let code = nmo::policy::compile_worker_main(max_memory_bytes);
            Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
        }
    }
}

/// The namespace this pod runs in, when it runs in a cluster: POD_NAMESPACE,
/// else the service account's.
fn own_namespace(cli: &Cli) -> Option<String> {
    cli.pod_namespace
        .clone()
        .filter(|s| !s.is_empty())
        // The Go operator's Deployment names it OPERATOR_NAMESPACE.
        .or_else(|| {
            std::env::var("OPERATOR_NAMESPACE")
                .ok()
                .filter(|s| !s.is_empty())
        })
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace").ok()
        })
        .map(|s| s.trim().to_owned())
}

/// Runs the operator until interrupted.
fn operator(cli: &Cli) -> anyhow::Result<()> {
    cli.log_accepted_flags();
    let max_concurrent = cli.max_concurrent_maintenances;
    let runtime = tokio::runtime::Runtime::new()?;
    // The probes answer while the policies are compiled: liveness says the
    // process is alive, readiness what it waits for.
    let startup = std::sync::Arc::new(nmo::server::Startup::default());
    startup.waiting_for("compiling and self-checking the policies");
    // The servers and the policy directory's watch, for as long as the
    // operator runs.
    let mut background = nmo::task::Background::default();
    if let Some(addr) = nmo::server::parse_bind(&cli.health_probe_bind_address)? {
        let listener = runtime.block_on(tokio::net::TcpListener::bind(addr))?;
        let probes = nmo::server::probes(startup.checks());
        let _in = runtime.enter();
        background.spawn("probes", nmo::server::serve(listener, probes));
        tracing::info!(address = %addr, "serving probes");
    }
    let metrics = nmo::registry::OperatorMetrics::register()?;
    let policies = load_policies(&cli.policies, metrics.policy.clone())?;
    runtime.block_on(async {
        let client = nmo::client::operator_client_counted(
            cluster::kube_config(cli.kubeconfig.as_deref(), None).await?,
            Some(metrics.client.clone()),
        )?;
        let settings = nmo::controller::Settings {
            max_concurrent,
            removals_in_flight: cli.max_removals_in_flight,
            lease_namespace: if cli.lease_namespace.is_empty() {
                nmo::node_lease::DEFAULT_NAMESPACE.to_owned()
            } else {
                cli.lease_namespace.clone()
            },
            instance: cli.instance.clone(),
            openshift: nmo::admission::is_openshift(&client).await,
            ..Default::default()
        };
        let ctx = nmo::controller::Context::new(
            client.clone(),
            policies.clone(),
            settings,
            metrics.controller.clone(),
        );
        background.spawn(
            "policies",
            policies.watch(Duration::from_millis(250), Duration::from_secs(30)),
        );
        startup.started(nmo::probes::readiness_checks(ctx.clone(), cli.leader_elect));
        start_servers(cli, &ctx, &client, &metrics, &mut background).await?;
        if cli.leader_elect {
            let ns = cli
                .leader_election_namespace
                .clone()
                .or_else(|| own_namespace(cli))
                .unwrap_or_else(|| "node-maintenance-operator-system".to_owned());
            let identity = format!("{}_{}", cli.instance, std::process::id());
            let mut elector =
                nmo::controller::leader::Elector::new(client, &ns, identity, Default::default())
                    .with_metrics(ctx.metrics().clone());
            // In a pod whose namespace holds the lock: a holder whose pod
            // is gone is not waited out.
            if own_namespace(cli).as_deref() == Some(ns.as_str()) {
                elector = elector.in_pod(cli.instance.clone());
            }
            tracing::info!(namespace = %ns, "waiting for leadership");
            // Leadership lost (an API outage past the renew deadline):
            // the controller stops acting and the replica stands again,
            // without exiting.
            elector
                .lead(
                    || nmo::controller::run(ctx.clone()),
                    nmo::controller::stop_signal(),
                )
                .await?;
        } else {
            tracing::info!("starting the NodeMaintenance controller");
            nmo::controller::run(ctx).await?;
        }
        anyhow::Ok(())
    })
}

/// Starts the metrics and webhook servers (the probes run from the start)
/// in `background`.
async fn start_servers(
    cli: &Cli,
    ctx: &std::sync::Arc<nmo::controller::Context>,
    client: &kube::Client,
    metrics: &nmo::registry::OperatorMetrics,
    background: &mut nmo::task::Background,
) -> anyhow::Result<()> {
    use nmo::server;
    if let Some(addr) = server::parse_bind(&cli.metrics_bind_address)? {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let ctx = ctx.clone();
        let handler = server::metrics(
            metrics.registry.clone(),
            std::sync::Arc::new(move || ctx.refresh_gauges()),
        );
        if cli.metrics_secure {
            let client = client.clone();
            let cert_dir = cli.metrics_cert_dir.clone();
            background.spawn("metrics", async move {
                let served = nmo::secure_metrics::serve(
                    listener,
                    handler,
                    client,
                    cert_dir.as_deref(),
                    Default::default(),
                )
                .await;
                if let Err(e) = served {
                    tracing::error!(error = %e, "metrics server stopped");
                }
            });
            tracing::info!(address = %addr, "serving metrics over HTTPS to authorized clients");
        } else {
            background.spawn("metrics", server::serve(listener, handler));
            tracing::info!(address = %addr, "serving metrics");
        }
    }
    if let Some(addr) = server::parse_bind(&cli.webhook_bind_address)? {
        let cert_dir = webhook_cert_dir(cli);
        // Both replicas answer the webhook: each follows what it reads
        // (the controller's run shares these watches while it leads), so
        // a create costs the API server no list.
        let watched = ctx.watched();
        let following = [
            watched.follow_fleet(
                client,
                &ctx.settings().lease_namespace,
                ctx.settings().tool_api_recheck,
            ),
            watched.follow_maintenances(client),
        ];
        background.spawn("watches", async move {
            let _following = following;
            std::future::pending::<()>().await
        });
        let validator = nmo::webhook::Validator::new(client.clone())
            .await
            .with_policies(ctx.policies().clone())
            .with_lease_namespace(&ctx.settings().lease_namespace)
            .with_metrics(metrics.webhook.clone())
            .with_watched(watched);
        if has_webhook_cert(&cert_dir) {
            background.spawn("webhook", bind_webhook(addr, cert_dir, validator).await?);
        } else {
            // As a pod, the certificate's Secret is often issued after the
            // pod started (cert-manager): the kubelet fills the mounted
            // folder later, and the webhook starts then.
            tracing::warn!(
                cert_dir = %cert_dir.display(),
                "no webhook certificate yet: the validating webhook starts when it appears"
            );
            background.spawn("webhook", async move {
                while !has_webhook_cert(&cert_dir) {
                    tokio::time::sleep(WEBHOOK_CERT_POLL).await;
                }
                match bind_webhook(addr, cert_dir, validator).await {
                    Ok(serving) => serving.await,
                    Err(e) => {
                        tracing::error!(error = %e, "the validating webhook could not start");
                    }
                }
            });
        }
    }
    Ok(())
}

/// How often a missing webhook certificate is looked for.
const WEBHOOK_CERT_POLL: Duration = Duration::from_secs(1);

fn has_webhook_cert(cert_dir: &std::path::Path) -> bool {
    cert_dir.join(nmo::tls::cert_files(cert_dir)[0]).exists()
}

/// Binds the webhook's address; the returned future serves it.
async fn bind_webhook(
    addr: std::net::SocketAddr,
    cert_dir: PathBuf,
    validator: nmo::webhook::Validator,
) -> anyhow::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(address = %addr, cert_dir = %cert_dir.display(), "serving the validating webhook");
    Ok(async move {
        if let Err(e) = nmo::webhook::serve(listener, &cert_dir, validator).await {
            tracing::error!(error = %e, "webhook server stopped");
        }
    })
}

/// Where the webhook's certificate is: `--webhook-cert-dir`, or, when
/// that is the default and holds none, where OLM mounts one for the Go
/// operator's bundle (so its Deployment with only the image changed serves
/// the webhook).
fn webhook_cert_dir(cli: &Cli) -> PathBuf {
    let given = &cli.webhook_cert_dir;
    let olm = std::path::Path::new(nmo::tls::OLM_CERT_DIR);
    let default = std::path::Path::new(DEFAULT_WEBHOOK_CERT_DIR);
    if given == default && !given.join("tls.crt").exists() && olm.join("apiserver.crt").exists() {
        olm.to_owned()
    } else {
        given.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_given_twice_takes_its_last_value_as_go_flags_do() {
        let cli = Cli::try_parse_from(["nmo", "--zap-log-level=info", "--zap-level=debug"])
            .expect("a repeated flag is accepted");
        assert_eq!(cli.zap_level, Some(ZapLevel::Debug));
        let cli = Cli::try_parse_from([
            "nmo",
            "--metrics-bind-address=:8443",
            "--metrics-bind-address=:8080",
        ])
        .unwrap();
        assert_eq!(cli.metrics_bind_address, ":8080");
    }
}
