//! The `nmo` binary: parse the command line, set up logging, run.

mod cmd;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cmd::Cli::parse();
    nmo::telemetry::init(cli.zap_level);
    match cmd::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
