//! Container logs, as a kubelet keeps them, for `pods/log` (`kubectl logs`).
//!
//! The simulated kubelet writes what its simulated processes would print
//! (start, SIGTERM, exit). A test can write lines itself
//! ([`crate::SimCluster::append_log`]) or attach a real process's output
//! ([`crate::SimCluster::attach_log`]), so an operator run as a process
//! shows as the pod of its Deployment with its real log.

use std::collections::BTreeMap;
use std::sync::Mutex;

use jiff::Timestamp;
use tokio::sync::Notify;

/// Lines kept per container; older ones are dropped (as log rotation).
pub const MAX_LINES: usize = 10_000;

/// One line a container wrote.
#[derive(Debug, Clone)]
pub struct Line {
    pub at: Timestamp,
    pub text: String,
}

/// Every container's lines, by pod uid and container name.
#[derive(Debug, Default)]
pub struct Logs {
    lines: Mutex<BTreeMap<(String, String), Vec<Line>>>,
    /// Woken on every new line (followers re-read).
    pub written: Notify,
}

impl Logs {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), Vec<Line>>> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends a line to a container's log.
    pub fn append(&self, uid: &str, container: &str, text: &str) {
        {
            let mut lines = self.lock();
            let log = lines
                .entry((uid.to_owned(), container.to_owned()))
                .or_default();
            log.push(Line {
                at: Timestamp::now(),
                text: text.trim_end_matches(['\r', '\n']).to_owned(),
            });
            if log.len() > MAX_LINES {
                let extra = log.len() - MAX_LINES;
                log.drain(..extra);
            }
        }
        self.written.notify_waiters();
    }

    /// The lines from index `from` on.
    pub fn read(&self, uid: &str, container: &str, from: usize) -> Vec<Line> {
        self.lock()
            .get(&(uid.to_owned(), container.to_owned()))
            .map(|l| l.iter().skip(from).cloned().collect())
            .unwrap_or_default()
    }

    /// How many lines a container has written (and still kept).
    pub fn len(&self, uid: &str, container: &str) -> usize {
        self.lock()
            .get(&(uid.to_owned(), container.to_owned()))
            .map_or(0, Vec::len)
    }

    /// Whether no container has written anything.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Forgets the logs of pods that are gone.
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        self.lock().retain(|(uid, _), _| live(uid));
    }

    /// Forgets the logs of the pod `uid` (every container's).
    pub fn forget(&self, uid: &str) {
        let mut lines = self.lock();
        let containers: Vec<(String, String)> = lines
            .range((uid.to_owned(), String::new())..)
            .take_while(|((u, _), _)| u == uid)
            .map(|(k, _)| k.clone())
            .collect();
        for k in containers {
            lines.remove(&k);
        }
    }
}

/// The `pods/log` query options.
#[derive(Debug, Clone, Default)]
pub struct LogOptions {
    pub container: Option<String>,
    pub follow: bool,
    pub tail_lines: Option<usize>,
    pub limit_bytes: Option<usize>,
    pub since_seconds: Option<u64>,
    pub timestamps: bool,
}

impl LogOptions {
    /// Selects the lines to send first (tail, since).
    pub fn select(&self, lines: Vec<Line>) -> Vec<Line> {
        let lines: Vec<Line> = match self.since_seconds {
            Some(s) => {
                // A client's number: any size, never a panic.
                let back = jiff::SignedDuration::from_secs(i64::try_from(s).unwrap_or(i64::MAX));
                let cutoff = Timestamp::now().checked_sub(back).unwrap_or(Timestamp::MIN);
                lines.into_iter().filter(|l| l.at >= cutoff).collect()
            }
            None => lines,
        };
        match self.tail_lines {
            Some(n) if n < lines.len() => lines[lines.len() - n..].to_vec(),
            _ => lines,
        }
    }

    /// A line as the response carries it.
    pub fn render(&self, line: &Line) -> String {
        if self.timestamps {
            format!(
                "{} {}\n",
                line.at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                line.text
            )
        } else {
            format!("{}\n", line.text)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_and_rotation() {
        let logs = Logs::default();
        for i in 0..MAX_LINES + 5 {
            logs.append("u", "c", &format!("line {i}\n"));
        }
        assert_eq!(logs.len("u", "c"), MAX_LINES);
        let all = logs.read("u", "c", 0);
        assert_eq!(all[0].text, "line 5");
        let opts = LogOptions {
            tail_lines: Some(2),
            ..Default::default()
        };
        let tail: Vec<String> = opts.select(all).iter().map(|l| opts.render(l)).collect();
        assert_eq!(
            tail,
            [
                format!("line {}\n", MAX_LINES + 3),
                format!("line {}\n", MAX_LINES + 4)
            ]
        );
        logs.retain(|_| false);
        assert!(logs.is_empty());
        // Any sinceSeconds a client sends: everything, no panic.
        logs.append("u", "c", "kept");
        let opts = LogOptions {
            since_seconds: Some(u64::MAX),
            ..Default::default()
        };
        assert_eq!(opts.select(logs.read("u", "c", 0)).len(), 1);
    }
}
