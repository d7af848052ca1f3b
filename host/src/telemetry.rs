//! JSON logs through `tracing`, in the Go operator's zap shape:
//! `{"level":"info","ts":"…","logger":"controller","msg":"…",…fields}`.

use std::str::FromStr;

use tracing_subscriber::EnvFilter;

/// `--zap-level`: the Go operator's log levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZapLevel {
    Debug,
    #[default]
    Info,
    Error,
}

impl FromStr for ZapLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "debug" => Ok(ZapLevel::Debug),
            "info" => Ok(ZapLevel::Info),
            "error" => Ok(ZapLevel::Error),
            other => Err(format!(
                "unknown log level {other:?}: use debug, info or error"
            )),
        }
    }
}

impl ZapLevel {
    /// The filter: our crate at the chosen level, wasmtime and cranelift
    /// only when they have something serious to say.
    pub fn filter(self) -> EnvFilter {
        let ours = match self {
            ZapLevel::Debug => "debug",
            ZapLevel::Info => "info",
            ZapLevel::Error => "error",
        };
        EnvFilter::new(format!(
            "{ours},wasmtime=warn,wasmtime_wasi=warn,cranelift_codegen=warn,cranelift=warn"
        ))
    }
}

/// Installs the JSON log subscriber on standard error. Calling it twice is
/// harmless (the second call does nothing).
pub fn init(level: ZapLevel) {
    let _ = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_env_filter(level.filter())
        .with_writer(std::io::stderr)
        .try_init();
}
