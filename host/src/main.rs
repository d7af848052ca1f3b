//! The `nmo` binary: parse the command line, set up logging, run.

mod cmd;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let mut logged = false;
    let result = if cmd::invoked_as_plugin() {
        // `kubectl nm …`: a command a person reads; only errors are logged.
        nmo::telemetry::init_command(nmo::telemetry::ZapLevel::Error);
        cmd::run_plugin(cmd::Plugin::parse())
    } else {
        let cli = cmd::Cli::parse_from(cmd::go_style_args(std::env::args_os()));
        if cli.command.is_none() || cli.is_demo() {
            // The operator, and the demo (which runs it): their logs.
            nmo::telemetry::init(cli.log_level(), cli.log_format());
            logged = cli.command.is_none();
        } else {
            nmo::telemetry::init_command(cli.log_level());
        }
        cmd::run(cli)
    };
    match result {
        Ok(code) => code,
        // The operator's last word is a line of its log, as the others
        // are (a log pipeline reads JSON); a command's is for a person.
        Err(e) if logged => {
            tracing::error!(error = %cmd::error_text(&e), "the operator stopped");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("{}", cmd::error_text(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
