//! Text for people: durations as the Go operator writes them, and what a
//! Kubernetes client error says. Making text from outside safe to show
//! ([`clean`], [`is_clean`]) and a duration as a person writes it
//! ([`duration`]) are the policy runtime's, used here as they are.

pub use nmo_policy_runtime::text::{clean, duration, is_clean};

/// A duration as Go's `time.Duration.String` writes it (`30s`, `1m0s`,
/// `1h0m0s`, `1.5s`, `500ms`): the Go operator's texts carry it.
pub fn go_duration(d: std::time::Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    let fraction = |value: u128, unit: u128| -> String {
        let whole = value / unit;
        let rest = value % unit;
        if rest == 0 {
            whole.to_string()
        } else {
            let digits = unit.ilog10() as usize;
            let text = format!("{rest:0digits$}");
            format!("{whole}.{}", text.trim_end_matches('0'))
        }
    };
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}\u{b5}s", fraction(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", fraction(nanos, 1_000_000));
    }
    let secs = nanos / 1_000_000_000;
    let (h, m) = (secs / 3600, secs / 60 % 60);
    let s = fraction(nanos % 60_000_000_000, 1_000_000_000);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// What a Kubernetes client error says to a user: the API server's own
/// message (`pods "web-1" not found`), not the client's debug dump of the
/// whole Status; other errors as they display.
/// An optimistic-concurrency conflict (`Operation cannot be fulfilled on
/// deployments.apps "web": the object has been modified; please apply
/// your changes...`) is said in words: `deployments.apps "web" was changed
/// by another writer at the same moment`.
pub fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) if !status.message.is_empty() => {
            conflict_in_words(&status.message).unwrap_or_else(|| status.message.clone())
        }
        other => other.to_string(),
    }
}

/// The API server's conflict message, said in words (`None`: not one).
fn conflict_in_words(message: &str) -> Option<String> {
    let (what, _) = message
        .strip_prefix("Operation cannot be fulfilled on ")?
        .split_once(": the object has been modified")?;
    Some(format!(
        "{what} was changed by another writer at the same moment"
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_conflict_is_said_in_words() {
        assert_eq!(
            super::conflict_in_words(
                "Operation cannot be fulfilled on deployments.apps \"web\": the object has been modified; please apply your changes to the latest version and try again"
            )
            .as_deref(),
            Some("deployments.apps \"web\" was changed by another writer at the same moment")
        );
        assert_eq!(super::conflict_in_words("pods \"web-1\" not found"), None);
    }

    #[test]
    fn durations_read_as_gos() {
        use std::time::Duration;
        assert_eq!(super::go_duration(Duration::from_secs(30)), "30s");
        assert_eq!(super::go_duration(Duration::from_secs(60)), "1m0s");
        assert_eq!(super::go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(super::go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(super::go_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(
            super::go_duration(Duration::from_millis(90_250)),
            "1m30.25s"
        );
        assert_eq!(super::go_duration(Duration::ZERO), "0s");
    }
}
