//! JSON logs through `tracing`, in the Go operator's zap shape:
//! `{"level":"info","ts":"2024-01-15T10:00:00.000Z","logger":"controller","msg":"Begin a node maintenance","nodeName":"node02"}`.
//!
//! `logger` is the event's `logger` field when it has one, else its target;
//! every other field follows under its own name.

use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

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
        self.directives("warn")
    }

    /// The filter of a command a person reads (`nmo plan`, `kubectl nm`):
    /// as [`filter`](Self::filter), but the client library's own lines
    /// only at `debug`. The command says what failed, once, as kubectl
    /// does; the client's log line of the same failure would come first.
    pub fn command_filter(self) -> EnvFilter {
        match self {
            ZapLevel::Debug => self.filter(),
            _ => self.directives("off"),
        }
    }

    fn directives(self, kube_client: &str) -> EnvFilter {
        let ours = match self {
            ZapLevel::Debug => "debug",
            ZapLevel::Info => "info",
            ZapLevel::Error => "error",
        };
        EnvFilter::new(format!(
            "{ours},wasmtime=warn,wasmtime_wasi=warn,cranelift_codegen=warn,cranelift=warn,kube_runtime=warn,kube_client={kube_client},hyper=warn,rustls=warn"
        ))
    }
}

/// Collects an event's fields into a JSON object.
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().to_owned(), Value::String(value.to_owned()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), Value::Bool(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), Value::String(format!("{value:?}")));
    }
}

/// The zap-shaped line.
pub struct ZapJson;

/// A time as zap's ISO 8601 encoder writes it: UTC, always three digits of
/// milliseconds (`2024-01-15T10:00:00.080Z`, never `…00.08Z`), so the
/// lines line up and sort as text.
pub fn zap_time(ts: jiff::Timestamp) -> String {
    let ts = ts.round(jiff::Unit::Millisecond).unwrap_or(ts);
    format!(
        "{}.{:03}Z",
        ts.strftime("%Y-%m-%dT%H:%M:%S"),
        ts.subsec_millisecond()
    )
}

/// Formats one event as a zap-shaped JSON line: `level`, `ts`, `logger`,
/// `msg` first, in that order, then the other fields.
pub fn zap_line(level: &tracing::Level, target: &str, fields: Map<String, Value>) -> String {
    let mut fields = fields;
    let msg = fields
        .remove("message")
        .unwrap_or(Value::String(String::new()));
    let logger = fields
        .remove("logger")
        .unwrap_or_else(|| Value::String(target.to_owned()));
    let ts = zap_time(jiff::Timestamp::now());
    let mut line = format!(
        "{{\"level\":{},\"ts\":{},\"logger\":{},\"msg\":{}",
        Value::String(level.as_str().to_lowercase()),
        Value::String(ts),
        logger,
        msg
    );
    for (k, v) in fields {
        line.push_str(&format!(",{}:{}", Value::String(k), v));
    }
    line.push('}');
    line
}

impl<S, N> FormatEvent<S, N> for ZapJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        let meta = event.metadata();
        let line = zap_line(meta.level(), meta.target(), fields.0);
        writeln!(writer, "{line}")
    }
}

/// Installs the JSON log subscriber on standard error. Calling it twice is
/// harmless (the second call does nothing).
pub fn init(level: ZapLevel) {
    init_with(level.filter());
}

/// [`init`] for a command a person reads (see [`ZapLevel::command_filter`]).
pub fn init_command(level: ZapLevel) {
    init_with(level.command_filter());
}

fn init_with(filter: EnvFilter) {
    let _ = tracing_subscriber::fmt()
        .event_format(ZapJson)
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {

    #[test]
    fn times_have_three_digits_of_milliseconds() {
        let at = |s: &str| zap_time(s.parse::<jiff::Timestamp>().unwrap());
        assert_eq!(at("2026-12-03T19:23:44.08Z"), "2026-12-03T19:23:44.080Z");
        assert_eq!(at("2026-12-03T19:23:44Z"), "2026-12-03T19:23:44.000Z");
        assert_eq!(at("2026-12-03T19:23:44.1234Z"), "2026-12-03T19:23:44.123Z");
        // Rounding carries into the second.
        assert_eq!(at("2026-12-03T19:23:44.9996Z"), "2026-12-03T19:23:45.000Z");
        assert_eq!(
            at("2026-12-03T20:23:44.5+01:00"),
            "2026-12-03T19:23:44.500Z"
        );
    }

    use super::*;

    #[test]
    fn lines_have_the_zap_shape() {
        let mut f = Map::new();
        f.insert("message".into(), Value::from("Begin a node maintenance"));
        f.insert("logger".into(), Value::from("controller"));
        f.insert("nodeName".into(), Value::from("node02"));
        let text = zap_line(&tracing::Level::INFO, "nmo::controller", f);
        assert!(text.starts_with("{\"level\":\"info\",\"ts\":\""), "{text}");
        assert!(
            text.ends_with("\"logger\":\"controller\",\"msg\":\"Begin a node maintenance\",\"nodeName\":\"node02\"}"),
            "{text}"
        );
        let line: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(line["level"], "info");
        assert_eq!(line["logger"], "controller");
        assert_eq!(line["msg"], "Begin a node maintenance");
        assert!(line["ts"].as_str().unwrap().ends_with('Z'));
        let no_logger: Value =
            serde_json::from_str(&zap_line(&tracing::Level::ERROR, "nmo::policy", Map::new()))
                .unwrap();
        assert_eq!(no_logger["logger"], "nmo::policy");
        assert_eq!(no_logger["level"], "error");
    }
}
