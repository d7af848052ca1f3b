//! The processes a control plane starts: each in its own process group,
//! its output in a log file, killed with its group when the control plane
//! stops (or when the test process that started it dies).

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ControlPlaneError;

/// One started component.
pub(crate) struct Process {
    pub(crate) name: String,
    child: Child,
    pub(crate) log: PathBuf,
}

impl Process {
    /// Starts `program` with `args`, its stdout and stderr in
    /// `<dir>/<name>.log`.
    pub(crate) fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        dir: &Path,
    ) -> Result<Process, ControlPlaneError> {
        Self::spawn_with_env(name, program, args, &[], dir)
    }

    /// [`spawn`](Self::spawn) with `env` added to the environment (for a
    /// component that takes its kubeconfig from `KUBECONFIG` only).
    pub(crate) fn spawn_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &Path)],
        dir: &Path,
    ) -> Result<Process, ControlPlaneError> {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).map_err(|e| ControlPlaneError::io(&log, e))?;
        let err = out
            .try_clone()
            .map_err(|e| ControlPlaneError::io(&log, e))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().copied())
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; the closure allocates nothing.
        unsafe {
            cmd.pre_exec(|| {
                // The component dies with the thread that started it, so a
                // test process killed outright leaves nothing running.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| ControlPlaneError::io(program, e))?;
        Ok(Process {
            name: name.to_owned(),
            child,
            log,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails if the process has exited (it should run until stopped).
    pub(crate) fn check_running(&mut self) -> Result<(), ControlPlaneError> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(ControlPlaneError::Exited {
                component: self.name.clone(),
                status: status.to_string(),
                log: tail(&self.log, 40),
            }),
            Err(e) => Err(ControlPlaneError::io(&self.log, e)),
        }
    }

    /// Waits until this process listens on loopback `port` (its own
    /// socket, not another program's that holds the port), for `limit`
    /// at most; fails if the process exits first.
    pub(crate) async fn wait_listening(
        &mut self,
        port: u16,
        limit: Duration,
    ) -> Result<(), ControlPlaneError> {
        let begun = Instant::now();
        loop {
            self.check_running()?;
            if listens_on(self.pid(), port) {
                return Ok(());
            }
            if begun.elapsed() > limit {
                return Err(ControlPlaneError::NotReady {
                    what: format!("{} listening on port {port}", self.name),
                    after: limit,
                    log: tail(&self.log, 20),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether its log says a port it was to listen on was taken.
    pub(crate) fn found_port_taken(&self) -> bool {
        std::fs::read_to_string(&self.log).is_ok_and(|t| t.contains("address already in use"))
    }

    /// SIGTERM to the group, then SIGKILL after `grace`; reaps the child.
    pub(crate) fn stop(&mut self, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let group = -(self.child.id() as i32);
        // SAFETY: kill(2) on the group this process leads.
        unsafe { libc::kill(group, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: as above.
        unsafe { libc::kill(group, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// Whether process `pid` holds a socket listening on TCP `port`: the
/// listening sockets' inodes from `/proc/net/tcp` and `tcp6`, against the
/// sockets among its open files.
fn listens_on(pid: u32, port: u16) -> bool {
    let wanted = format!(":{port:04X}");
    let listening: Vec<String> = [
        format!("/proc/{pid}/net/tcp"),
        format!("/proc/{pid}/net/tcp6"),
    ]
    .iter()
    .filter_map(|f| std::fs::read_to_string(f).ok())
    .flat_map(|t| {
        t.lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                // local_address, state 0A (LISTEN), inode.
                (f.len() > 9 && f[1].ends_with(&wanted) && f[3] == "0A")
                    .then(|| format!("socket:[{}]", f[9]))
            })
            .collect::<Vec<_>>()
    })
    .collect();
    if listening.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|link| listening.iter().any(|s| link.as_os_str() == s.as_str()))
}

/// The last `lines` lines of a log file (for an error message).
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let from = all.len().saturating_sub(lines);
    format!("--- {} ---\n{}", path.display(), all[from..].join("\n"))
}
