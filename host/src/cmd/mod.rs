//! The command line.

mod demo;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use nmo::policy::{EngineConfig, PolicyEngine, selfcheck};
use nmo::telemetry::ZapLevel;

/// Node Maintenance Operator with WebAssembly drain policies.
#[derive(Debug, Parser)]
#[command(name = "nmo", version, about)]
pub struct Cli {
    /// Log level, as the Go operator's flag: debug, info or error.
    #[arg(long, global = true, default_value = "info")]
    pub zap_level: ZapLevel,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show what a policy decides for a busy worker node.
    Demo {
        /// A policy file (.wasm) to use instead of the embedded default.
        #[arg(long)]
        policy: Option<PathBuf>,
        /// How many pods the node carries.
        #[arg(long, default_value_t = 110)]
        pods: usize,
    },
    /// Work with drain policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Check that each file is a policy of the drain-policy world that
    /// answers a sample drain and every kind of failure validly.
    Check {
        /// Policy files (.wasm). `default` names the embedded default policy.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Demo { policy, pods } => demo::run(policy, pods).map(|()| ExitCode::SUCCESS),
        Command::Policy(PolicyCommand::Check { files }) => policy_check(&files),
    }
}

fn policy_check(files: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let engine = PolicyEngine::new(EngineConfig::default())?;
    let mut failed = 0;
    for file in files {
        let loaded = if file.as_os_str() == "default" {
            engine.default_policy()
        } else {
            engine.load_file(file)
        };
        match loaded.and_then(|p| selfcheck::run(&p).map(|()| p)) {
            Ok(p) => println!("ok    {} (sha256 {})", file.display(), &p.digest()[..12]),
            Err(e) => {
                failed += 1;
                println!("FAIL  {}: {e}", file.display());
            }
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
