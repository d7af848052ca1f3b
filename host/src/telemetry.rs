//! JSON logs through `tracing`, in the Go operator's zap shape:
//! `{"level":"info","ts":"2024-01-15T10:00:00.123456789Z","logger":"controller","msg":"Begin a node maintenance","nodeName":"node02"}`.
//!
//! `logger` names the part of the operator a line comes from, as the Go
//! operator's named zap loggers do: the event's own `logger` field when it
//! has one, else the innermost span's (a server's: `webhook`, `metrics`),
//! else its module's name in [`LOGGERS`] (`controller`, `drain`, `leader`,
//! `policy`, `setup`...), else its target. Every other field follows under its own name, after the fields of the
//! spans the event is in (a reconcile's `nodeMaintenance` and `nodeName`,
//! as controller-runtime's `WithValues` logger carries them), the event's
//! own winning where both name one. The encoder, the time
//! encoding and the level are controller-runtime's zap flags
//! (`--zap-encoder`, `--zap-time-encoding`, `--zap-log-level`, `--zap-devel`),
//! as the Go operator v0.21.0 takes them.

use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::{Context as LayerContext, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// `--zap-log-level`: the Go operator's log levels. controller-runtime
/// also takes a verbosity (an integer above 0: debug and more; nmo has
/// no level below debug) and `panic` (nmo never panics on purpose, so it
/// logs nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZapLevel {
    Debug,
    #[default]
    Info,
    Error,
    Panic,
}

impl FromStr for ZapLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "debug" => Ok(ZapLevel::Debug),
            "info" => Ok(ZapLevel::Info),
            "error" => Ok(ZapLevel::Error),
            "panic" => Ok(ZapLevel::Panic),
            n => match n.parse::<u32>() {
                Ok(v) if v > 0 => Ok(ZapLevel::Debug),
                _ => Err(format!(
                    "unknown log level {n:?}: use debug, info, error, panic or an integer above 0"
                )),
            },
        }
    }
}

impl ZapLevel {
    /// The filter: the operator's own crates at the chosen level, every
    /// library (the HTTP stack, tower, the Kubernetes client, wasmtime)
    /// only when it has something serious to say; `RUST_LOG`, when set,
    /// is added on top (`RUST_LOG=tower=debug` brings a library's lines
    /// back).
    pub fn filter(self) -> EnvFilter {
        self.filter_with(std::env::var("RUST_LOG").ok().as_deref())
    }

    /// [`filter`](Self::filter) with `extra` directives (`RUST_LOG`'s)
    /// added on top.
    pub(crate) fn filter_with(self, extra: Option<&str>) -> EnvFilter {
        self.directives("warn", extra)
    }

    /// The filter of a command a person reads (`nmo plan`, `kubectl nm`):
    /// as [`filter`](Self::filter), but the client library's own lines
    /// only at `debug`. The command says what failed, once, as kubectl
    /// does; the client's log line of the same failure would come first.
    pub(crate) fn command_filter(self) -> EnvFilter {
        match self {
            ZapLevel::Debug => self.filter(),
            _ => self.directives("off", None),
        }
    }

    fn directives(self, kube_client: &str, extra: Option<&str>) -> EnvFilter {
        let ours = match self {
            ZapLevel::Debug => "debug",
            ZapLevel::Info => "info",
            ZapLevel::Error => "error",
            ZapLevel::Panic => "off",
        };
        let kube_client = if self == ZapLevel::Panic {
            "off"
        } else {
            kube_client
        };
        let libraries = if self == ZapLevel::Panic {
            "off"
        } else {
            "warn"
        };
        let mut directives = format!(
            "{libraries},nmo={ours},nmo_policy_runtime={ours},nmo_sim={ours},kube_client={kube_client}"
        );
        if let Some(extra) = extra.filter(|e| !e.trim().is_empty()) {
            directives.push(',');
            directives.push_str(extra);
        }
        EnvFilter::new(directives)
    }
}

/// `--zap-encoder`: one JSON object a line, or zap's console line (time,
/// level, logger, message, then the other fields as JSON, tab-separated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoder {
    #[default]
    Json,
    Console,
}

impl FromStr for Encoder {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "json" => Ok(Encoder::Json),
            "console" => Ok(Encoder::Console),
            other => Err(format!("unknown encoder {other:?}: use json or console")),
        }
    }
}

/// `--zap-time-encoding`: how `ts` is written, as zap's encoders write it.
/// The Go operator v0.21.0's default is `rfc3339nano`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeEncoding {
    /// Seconds since the epoch, as a float.
    Epoch,
    /// Milliseconds since the epoch, as a float.
    Millis,
    /// Nanoseconds since the epoch, as an integer.
    Nano,
    /// `2024-01-15T10:00:00.080Z`: always three digits of milliseconds.
    Iso8601,
    /// `2024-01-15T10:00:00Z`.
    Rfc3339,
    /// `2024-01-15T10:00:00.08Z`: nanoseconds, trailing zeros trimmed.
    #[default]
    Rfc3339Nano,
}

impl FromStr for TimeEncoding {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "epoch" => Ok(TimeEncoding::Epoch),
            "millis" => Ok(TimeEncoding::Millis),
            "nano" => Ok(TimeEncoding::Nano),
            "iso8601" => Ok(TimeEncoding::Iso8601),
            "rfc3339" => Ok(TimeEncoding::Rfc3339),
            "rfc3339nano" => Ok(TimeEncoding::Rfc3339Nano),
            other => Err(format!(
                "unknown time encoding {other:?}: use epoch, millis, nano, iso8601, rfc3339 or rfc3339nano"
            )),
        }
    }
}

impl TimeEncoding {
    /// `ts` as a JSON value.
    pub fn encode(self, ts: jiff::Timestamp) -> Value {
        let nanos = ts.as_nanosecond();
        match self {
            TimeEncoding::Epoch => Value::from(nanos as f64 / 1e9),
            TimeEncoding::Millis => Value::from(nanos as f64 / 1e6),
            TimeEncoding::Nano => Value::from(i64::try_from(nanos).unwrap_or(i64::MAX)),
            TimeEncoding::Iso8601 => Value::String(zap_time(ts)),
            TimeEncoding::Rfc3339 => Value::String(ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
            TimeEncoding::Rfc3339Nano => {
                let frac = ts.subsec_nanosecond();
                let base = ts.strftime("%Y-%m-%dT%H:%M:%S").to_string();
                Value::String(if frac == 0 {
                    format!("{base}Z")
                } else {
                    let digits = format!("{frac:09}");
                    format!("{base}.{}Z", digits.trim_end_matches('0'))
                })
            }
        }
    }
}

/// How lines are written: the encoder and the time encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogFormat {
    pub encoder: Encoder,
    pub time: TimeEncoding,
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

/// A span's fields, kept in its extensions by [`SpanFields`].
struct Recorded(Map<String, Value>);

/// Keeps each span's fields as JSON values, for [`ZapJson`] to copy into
/// the lines of the events inside it.
pub(crate) struct SpanFields;

impl<S> Layer<S> for SpanFields
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: LayerContext<'_, S>,
    ) {
        let mut fields = Fields(Map::new());
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Recorded(fields.0));
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: LayerContext<'_, S>,
    ) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some(Recorded(map)) = extensions.get_mut::<Recorded>() {
            let mut fields = Fields(std::mem::take(map));
            values.record(&mut fields);
            *map = fields.0;
        }
    }
}

/// The zap-shaped line, in the chosen [`LogFormat`].
pub(crate) struct ZapJson(pub LogFormat);

/// A time as zap's ISO 8601 encoder writes it: UTC, always three digits of
/// milliseconds (`2024-01-15T10:00:00.080Z`, never `…00.08Z`), so the
/// lines line up and sort as text.
pub(crate) fn zap_time(ts: jiff::Timestamp) -> String {
    let ts = ts.round(jiff::Unit::Millisecond).unwrap_or(ts);
    format!(
        "{}.{:03}Z",
        ts.strftime("%Y-%m-%dT%H:%M:%S"),
        ts.subsec_millisecond()
    )
}

/// The logger a module's lines go by, by module path (the longest that
/// the event's target is in wins): one table instead of a `logger` field on
/// every line.
pub(crate) const LOGGERS: &[(&str, &str)] = &[
    ("nmo", "setup"),
    ("nmo::cmd", "setup"),
    ("nmo::controller", "controller"),
    ("nmo::controller::drain", "drain"),
    ("nmo::controller::leader", "leader"),
    ("nmo::admission", "controller"),
    ("nmo::crd", "controller"),
    ("nmo::policy", "policy"),
    ("nmo_policy_runtime", "policy"),
    ("nmo::webhook", "webhook"),
    ("nmo::secure_metrics", "metrics"),
    ("nmo::server", "server"),
    ("nmo::tls", "tls"),
];

/// The logger of an event of `target` that names none (see [`LOGGERS`]);
/// a target outside them goes by itself.
pub(crate) fn logger_of(target: &str) -> &str {
    LOGGERS
        .iter()
        .filter(|(module, _)| {
            target
                .strip_prefix(module)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
        })
        .max_by_key(|(module, _)| module.len())
        .map_or(target, |(_, logger)| logger)
}

/// Formats one event as a zap-shaped line: `level`, `ts`, `logger`, `msg`
/// first, in that order, then the other fields. `logger` is the fields'
/// (the event's or a span's), else the target's ([`logger_of`]).
pub(crate) fn zap_line(
    format: LogFormat,
    level: &tracing::Level,
    target: &str,
    fields: Map<String, Value>,
) -> String {
    let mut fields = fields;
    let msg = fields
        .remove("message")
        .unwrap_or(Value::String(String::new()));
    let logger = fields
        .remove("logger")
        .unwrap_or_else(|| Value::String(logger_of(target).to_owned()));
    let ts = format.time.encode(jiff::Timestamp::now());
    let level = level.as_str().to_lowercase();
    match format.encoder {
        Encoder::Json => {
            let mut line = format!(
                "{{\"level\":{},\"ts\":{},\"logger\":{},\"msg\":{}",
                Value::String(level),
                ts,
                logger,
                msg
            );
            for (k, v) in fields {
                line.push_str(&format!(",{}:{}", Value::String(k), v));
            }
            line.push('}');
            line
        }
        Encoder::Console => {
            let text = |v: &Value| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let mut line = format!(
                "{}\t{}\t{}\t{}",
                text(&ts),
                level.to_uppercase(),
                text(&logger),
                text(&msg)
            );
            if !fields.is_empty() {
                line.push('\t');
                line.push_str(&Value::Object(fields).to_string());
            }
            line
        }
    }
}

impl<S, N> FormatEvent<S, N> for ZapJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields(Map::new());
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                if let Some(Recorded(map)) = span.extensions().get::<Recorded>() {
                    fields.0.extend(map.clone());
                }
            }
        }
        event.record(&mut fields);
        let meta = event.metadata();
        let line = zap_line(self.0, meta.level(), meta.target(), fields.0);
        writeln!(writer, "{line}")
    }
}

/// Installs the log subscriber on standard error. Calling it twice is
/// harmless (the second call does nothing).
pub fn init(level: ZapLevel, format: LogFormat) {
    init_with(level.filter(), format);
}

/// [`init`] for a command a person reads (see [`ZapLevel::command_filter`]).
pub fn init_command(level: ZapLevel) {
    init_with(level.command_filter(), LogFormat::default());
}

fn init_with(filter: EnvFilter, format: LogFormat) {
    let _ = subscriber(filter, format, std::io::stderr).try_init();
}

/// The log subscriber: the level filter, the spans' fields, and the
/// zap-shaped lines written to `writer`.
fn subscriber<W>(filter: EnvFilter, format: LogFormat, writer: W) -> impl Subscriber + Send + Sync
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::registry()
        .with(filter)
        .with(SpanFields)
        .with(
            tracing_subscriber::fmt::layer()
                .event_format(ZapJson(format))
                .with_writer(writer),
        )
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

    /// What a subscriber filtered at `level` writes while `log` runs.
    /// Debug logs are the operator's: a library's debug line (tower's
    /// "processing request", 77 of 94 lines in 10 s before) is not shown
    /// unless `RUST_LOG` asks for it; its warnings are.
    #[test]
    fn debug_logs_are_the_operators_unless_a_library_is_asked_for() {
        let log = || {
            tracing::debug!(target: "tower::buffer::worker", "processing request");
            tracing::debug!(target: "hyper_util::client", "connecting");
            tracing::warn!(target: "kube_client::client", "a library's warning");
            tracing::debug!(target: "nmo::controller", "the operator's own");
        };
        let msgs = |lines: Vec<Value>| -> Vec<String> {
            lines
                .iter()
                .map(|l| l["msg"].as_str().unwrap_or_default().to_owned())
                .collect()
        };
        let quiet = msgs(lines_filtered(ZapLevel::Debug.filter_with(None), log));
        assert_eq!(quiet, ["a library's warning", "the operator's own"]);
        let asked = msgs(lines_filtered(
            ZapLevel::Debug.filter_with(Some("tower=debug")),
            log,
        ));
        assert!(
            asked.contains(&"processing request".to_owned()),
            "{asked:?}"
        );
        assert!(!asked.contains(&"connecting".to_owned()), "{asked:?}");
    }

    fn lines_of(level: ZapLevel, log: impl FnOnce()) -> Vec<Value> {
        lines_filtered(level.filter_with(None), log)
    }

    fn lines_filtered(filter: tracing_subscriber::EnvFilter, log: impl FnOnce()) -> Vec<Value> {
        let buffer = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let sink = buffer.clone();
        let writer = move || Sink(sink.clone());
        tracing::subscriber::with_default(subscriber(filter, LogFormat::default(), writer), log);
        let text = String::from_utf8(buffer.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_carry_the_fields_of_their_spans_at_every_level() {
        let log = || {
            let span =
                tracing::error_span!("reconcile", nodeMaintenance = "nm-1", nodeName = "worker-1");
            let _in = span.enter();
            let drain = tracing::info_span!("drain", attempt = 2);
            let _in_drain = drain.enter();
            tracing::error!(target: "nmo::controller", logger = "controller", nodeName = "worker-9", "the event's own field wins");
            tracing::info!(target: "nmo::controller", logger = "drain", "inside both");
        };
        let lines = lines_of(ZapLevel::Info, log);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0]["nodeMaintenance"], "nm-1");
        assert_eq!(lines[0]["nodeName"], "worker-9");
        assert_eq!(lines[1]["nodeMaintenance"], "nm-1");
        assert_eq!(lines[1]["nodeName"], "worker-1");
        assert_eq!(lines[1]["attempt"], 2);
        assert_eq!(lines[1]["logger"], "drain");
        // Filtered at error, the reconcile's span is still there.
        let lines = lines_of(ZapLevel::Error, log);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0]["nodeMaintenance"], "nm-1");
        assert_eq!(lines[0]["msg"], "the event's own field wins");
    }

    #[test]
    fn lines_have_the_zap_shape() {
        let mut f = Map::new();
        f.insert("message".into(), Value::from("Begin a node maintenance"));
        f.insert("logger".into(), Value::from("controller"));
        f.insert("nodeName".into(), Value::from("node02"));
        let text = zap_line(
            LogFormat::default(),
            &tracing::Level::INFO,
            "nmo::controller",
            f,
        );
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
        let no_logger = |target: &str| -> Value {
            serde_json::from_str(&zap_line(
                LogFormat::default(),
                &tracing::Level::ERROR,
                target,
                Map::new(),
            ))
            .unwrap()
        };
        assert_eq!(no_logger("nmo::policy::store")["logger"], "policy");
        assert_eq!(
            no_logger("nmo::controller::drain::surge")["logger"],
            "drain"
        );
        assert_eq!(no_logger("nmo::controller::pass")["logger"], "controller");
        assert_eq!(no_logger("nmo::controllers")["logger"], "setup");
        assert_eq!(
            no_logger("kube_runtime::watcher")["logger"],
            "kube_runtime::watcher"
        );
        assert_eq!(no_logger("nmo::policy")["level"], "error");
    }

    /// A line that names no logger goes by its innermost span's, else by
    /// its module's.
    #[test]
    fn a_line_without_a_logger_goes_by_its_span_or_its_module() {
        let log = || {
            tracing::info!(target: "nmo::admission::history", "by the module");
            let server = tracing::error_span!("server", server = "webhook", logger = "webhook");
            let _in = server.enter();
            tracing::info!(target: "nmo::admission::history", "by the span");
            tracing::info!(target: "nmo::admission::history", logger = "controller", "by the line");
        };
        let lines = lines_of(ZapLevel::Info, log);
        let loggers: Vec<&str> = lines
            .iter()
            .map(|l| l["logger"].as_str().unwrap())
            .collect();
        assert_eq!(
            loggers,
            ["controller", "webhook", "controller"],
            "{lines:?}"
        );
    }

    #[test]
    fn time_encodings_are_zaps() {
        let ts: jiff::Timestamp = "2026-12-03T19:23:44.08Z".parse().unwrap();
        assert_eq!(
            TimeEncoding::Rfc3339Nano.encode(ts),
            Value::from("2026-12-03T19:23:44.08Z")
        );
        assert_eq!(
            TimeEncoding::Rfc3339.encode(ts),
            Value::from("2026-12-03T19:23:44Z")
        );
        assert_eq!(
            TimeEncoding::Iso8601.encode(ts),
            Value::from("2026-12-03T19:23:44.080Z")
        );
        assert_eq!(
            TimeEncoding::Nano.encode(ts),
            Value::from(1_796_325_824_080_000_000i64)
        );
        assert_eq!(
            TimeEncoding::Epoch.encode(ts).as_f64(),
            Some(1_796_325_824.08)
        );
        let whole: jiff::Timestamp = "2026-12-03T19:23:44Z".parse().unwrap();
        assert_eq!(
            TimeEncoding::Rfc3339Nano.encode(whole),
            Value::from("2026-12-03T19:23:44Z")
        );
    }

    #[test]
    fn console_lines_are_tab_separated_with_fields_as_json() {
        let mut f = Map::new();
        f.insert("message".into(), Value::from("Begin a node maintenance"));
        f.insert("logger".into(), Value::from("controller"));
        f.insert("nodeName".into(), Value::from("node02"));
        let format = LogFormat {
            encoder: Encoder::Console,
            time: TimeEncoding::Iso8601,
        };
        let line = zap_line(format, &tracing::Level::INFO, "t", f);
        let parts: Vec<&str> = line.split('\t').collect();
        assert_eq!(parts.len(), 5, "{line}");
        assert_eq!(
            &parts[1..],
            &[
                "INFO",
                "controller",
                "Begin a node maintenance",
                "{\"nodeName\":\"node02\"}"
            ]
        );
    }

    #[test]
    fn levels_are_controller_runtimes() {
        assert_eq!("debug".parse(), Ok(ZapLevel::Debug));
        assert_eq!("3".parse(), Ok(ZapLevel::Debug));
        assert_eq!("panic".parse(), Ok(ZapLevel::Panic));
        assert!("0".parse::<ZapLevel>().is_err());
        assert!(
            "loud"
                .parse::<ZapLevel>()
                .unwrap_err()
                .contains("use debug")
        );
    }
}
