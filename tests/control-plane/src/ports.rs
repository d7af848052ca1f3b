//! Loopback ports for the servers a test starts.
//!
//! A port the kernel hands out for `bind(127.0.0.1:0)` comes from the
//! ephemeral range, the same range every outgoing connection takes its
//! local port from. Between the moment such a port is found free and the
//! moment the server binds it, any connection on the machine (another
//! test's API server dialling its etcd, say) may take it: CI saw etcd fail
//! with "address already in use" that way. So ports here come from below
//! the ephemeral range, where no outgoing connection lands, each one
//! checked free by binding it, and no port is handed out twice by one
//! process (the tests of one binary run side by side). A server that still
//! finds its port taken (another program listening there) is started
//! again on another: see [`crate::process::Process::wait_listening`].

use std::sync::atomic::{AtomicU32, Ordering};

use crate::ControlPlaneError;

/// Where the range starts: above the well-known and most registered
/// ports servers on a developer's machine use.
const LOWEST: u32 = 20_000;

/// Ports this process has handed out, counted (the one counter the
/// harness keeps: tests of one binary share it so none gets another's
/// port).
static HANDED_OUT: AtomicU32 = AtomicU32::new(0);

/// A port on 127.0.0.1 that is free now and that no outgoing connection
/// will take before the server binds it.
pub fn free_port() -> Result<u16, ControlPlaneError> {
    let top = ephemeral_start().unwrap_or(32_768);
    if top <= LOWEST + 1_000 {
        // An unusual ephemeral range: the kernel's own choice is all there is.
        return kernel_port();
    }
    // Processes started one after the other begin at different places.
    let start = std::process::id().wrapping_mul(2_654_435_761);
    match pick(&HANDED_OUT, LOWEST..top, start) {
        Some(port) => Ok(port),
        None => kernel_port(),
    }
}

/// The next port of `range` after what `counter` has handed out (from
/// `start`), that nothing listens on; `None` if the first 4,096 tried
/// were all taken.
fn pick(counter: &AtomicU32, range: std::ops::Range<u32>, start: u32) -> Option<u16> {
    let span = range.end - range.start;
    (0..span.min(4_096)).find_map(|_| {
        let n = counter.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(range.start + start.wrapping_add(n) % span).ok()?;
        std::net::TcpListener::bind(("127.0.0.1", port))
            .is_ok()
            .then_some(port)
    })
}

/// The first port of the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`).
fn ephemeral_start() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A port the kernel finds free.
fn kernel_port() -> Result<u16, ControlPlaneError> {
    let addr = std::path::Path::new("127.0.0.1:0");
    let l =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| ControlPlaneError::io(addr, e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| ControlPlaneError::io(addr, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_never_handed_out_twice() {
        let top = ephemeral_start().unwrap_or(32_768);
        let ports: Vec<u16> = (0..200).map(|_| free_port().unwrap()).collect();
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "a port was handed out twice");
        if top > LOWEST + 1_000 {
            assert!(
                ports
                    .iter()
                    .all(|&p| u32::from(p) >= LOWEST && u32::from(p) < top)
            );
        }
    }

    #[test]
    fn a_port_someone_listens_on_is_skipped() {
        let taken = free_port().unwrap();
        let _holder = std::net::TcpListener::bind(("127.0.0.1", taken)).unwrap();
        let counter = AtomicU32::new(0);
        let from = u32::from(taken);
        let next = pick(&counter, from..from + 10, 0).unwrap();
        assert_ne!(next, taken, "the taken port is skipped");
    }
}
