//! What a command prints: its output (a reader that goes ends the command
//! quietly) and its error, as kubectl prints an API server's.

/// How a command's error reads, once: an error the API server sent as
/// kubectl prints it (`Error from server (NotFound): nodes "worker-9" not
/// found`), anything else as `error: ` and its chain of causes, each once.
pub fn error_text(e: &anyhow::Error) -> String {
    let status = e.chain().find_map(|cause| {
        cause
            .downcast_ref::<nmo::Error>()
            .and_then(nmo::Error::api_status)
            .or(match cause.downcast_ref::<kube::Error>() {
                Some(kube::Error::Api(s)) => Some(s),
                _ => None,
            })
    });
    match status {
        Some(s) if !s.reason.is_empty() => {
            format!("Error from server ({}): {}", s.reason, s.message)
        }
        Some(s) => format!("Error from server: {}", s.message),
        None => {
            // Each cause once: some libraries' messages already hold their
            // sources' text.
            let mut text = String::new();
            for cause in e.chain().map(ToString::to_string) {
                if !text.contains(&cause) {
                    if !text.is_empty() {
                        text.push_str(": ");
                    }
                    text.push_str(&cause);
                }
            }
            format!("error: {text}")
        }
    }
}

/// Writes a command's output (what [`outln!`] and [`out!`] print). When
/// the reader has gone (`nmo demo | head -3`), the command ends at once,
/// as Unix tools do: by SIGPIPE, never with a panic on the broken pipe.
///
/// The process itself keeps ignoring SIGPIPE (Rust's default): a socket
/// written with `writev` (hyper's vectored writes, which carry no
/// `MSG_NOSIGNAL`) whose peer went would otherwise kill it, and the demo
/// serves an API server whose clients come and go (a `kubectl get -w`
/// ended with Ctrl-C, the operator's own watches when it stops).
pub fn write_out(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        output_failed(&e);
    }
}

/// Ends the process after a failed write of its output: by SIGPIPE when
/// the reader went, with exit code 74 (EX_IOERR) for any other failure.
fn output_failed(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        // SAFETY: restoring SIGPIPE's default disposition and raising it
        // have no preconditions; the process ends there.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::raise(libc::SIGPIPE);
        }
    }
    eprintln!("nmo: writing the output: {e}");
    std::process::exit(74)
}
