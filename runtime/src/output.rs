//! A policy's stdout and stderr: kept in memory up to a cap, then written to
//! the host's log after the call. Writes past the cap are accepted and
//! dropped, so a chatty policy loses lines, never its decision.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// Bytes kept of one `log` line (or one line of output).
pub(crate) const MAX_LOG_LINE_BYTES: usize = 1024;

/// Bytes kept of one stream in one call.
pub(crate) const OUTPUT_CAP: usize = 16 * 1024;

#[derive(Clone, Default)]
pub(crate) struct CappedOutput {
    inner: Arc<Mutex<Captured>>,
}

#[derive(Default)]
struct Captured {
    bytes: Vec<u8>,
    dropped: usize,
}

impl CappedOutput {
    fn push(&self, data: &[u8]) {
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let room = OUTPUT_CAP.saturating_sub(c.bytes.len());
        let keep = room.min(data.len());
        c.bytes.extend_from_slice(&data[..keep]);
        c.dropped += data.len() - keep;
    }

    /// What was written, as lines, and how many bytes were dropped.
    pub(crate) fn take(&self) -> (Vec<String>, usize) {
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let text = String::from_utf8_lossy(&c.bytes).into_owned();
        let dropped = c.dropped;
        c.bytes.clear();
        c.dropped = 0;
        let lines = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect();
        (lines, dropped)
    }
}

impl IsTerminal for CappedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for CappedOutput {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }
    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 * 1024)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CappedOutput {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for CappedOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Records of a policy's output (its `log` import, stdout and stderr lines
/// together) written to the host's log in one decision.
pub(crate) const RECORDS_PER_DECISION: u32 = 64;
/// Records of one policy's output written per minute, all its decisions
/// together: a policy called every second cannot rotate the operator's own
/// lines out of its log.
pub(crate) const RECORDS_PER_MINUTE: u32 = 600;

/// One policy's per-minute allowance of log records.
#[derive(Debug)]
pub(crate) struct RateWindow {
    state: Mutex<Window>,
    per_minute: u32,
}

#[derive(Debug)]
struct Window {
    started: std::time::Instant,
    used: u32,
    /// Records refused in this window (reported when the next one opens).
    dropped: u64,
}

impl Default for RateWindow {
    fn default() -> Self {
        RateWindow::new(RECORDS_PER_MINUTE)
    }
}

impl RateWindow {
    pub(crate) fn new(per_minute: u32) -> Self {
        RateWindow {
            state: Mutex::new(Window {
                started: std::time::Instant::now(),
                used: 0,
                dropped: 0,
            }),
            per_minute,
        }
    }

    /// Whether one more record may be written now; the first record of a
    /// new window reports what the last one dropped.
    fn admit(&self, policy: &str) -> bool {
        let mut w = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if w.started.elapsed() >= std::time::Duration::from_secs(60) {
            if w.dropped > 0 {
                tracing::warn!(
                    policy,
                    dropped = w.dropped,
                    "policy output over {} records a minute: {} records dropped in the last minute",
                    self.per_minute,
                    w.dropped
                );
            }
            *w = Window {
                started: std::time::Instant::now(),
                used: 0,
                dropped: 0,
            };
        }
        if w.used >= self.per_minute {
            w.dropped += 1;
            return false;
        }
        w.used += 1;
        true
    }
}

/// The records one decision has written and dropped.
pub(crate) struct Records {
    window: Arc<RateWindow>,
    written: u32,
    dropped_lines: u64,
}

impl Records {
    pub(crate) fn new(window: Arc<RateWindow>) -> Self {
        Records {
            window,
            written: 0,
            dropped_lines: 0,
        }
    }

    /// Whether one more record of `policy`'s output may be written.
    pub(crate) fn admit(&mut self, policy: &str) -> bool {
        if self.written >= RECORDS_PER_DECISION || !self.window.admit(policy) {
            self.dropped_lines += 1;
            return false;
        }
        self.written += 1;
        true
    }

    /// At the end of the decision: one line saying what was dropped (itself
    /// within the per-minute allowance).
    pub(crate) fn finish(&mut self, policy: &str, dropped_bytes: usize) {
        if (self.dropped_lines > 0 || dropped_bytes > 0) && self.window.admit(policy) {
            tracing::warn!(
                policy,
                dropped_lines = self.dropped_lines,
                dropped_bytes,
                "policy output over the limits ({RECORDS_PER_DECISION} records a decision, {RECORDS_PER_MINUTE} a minute, {OUTPUT_CAP} bytes a stream): {} lines and {dropped_bytes} bytes dropped",
                self.dropped_lines
            );
        }
        self.dropped_lines = 0;
    }
}
