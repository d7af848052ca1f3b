//! An OCI registry on loopback: CNCF Distribution's `registry serve`, its
//! storage a folder, built with the control plane, for the tests of
//! policies pulled from registries.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::process::{Process, tail};
use crate::{Binaries, ControlPlaneError, free_port};

/// A running registry.
pub struct OciRegistry {
    process: Process,
    port: u16,
}

impl OciRegistry {
    /// Starts one on a free port of 127.0.0.1, its log in `dir`, and waits
    /// (20 s at most) until it answers.
    pub fn start(binaries: &Binaries, dir: &Path) -> Result<Self, ControlPlaneError> {
        let port = free_port()?;
        Self::start_on(binaries, dir, port)
    }

    /// Starts one on `port`, its storage `<dir>/registry-<port>`: started
    /// again where an earlier one was, it serves what that one held.
    pub fn start_on(binaries: &Binaries, dir: &Path, port: u16) -> Result<Self, ControlPlaneError> {
        let storage = dir.join(format!("registry-{port}"));
        let config = dir.join(format!("registry-{port}.yaml"));
        let yaml = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
             delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            storage.display()
        );
        std::fs::write(&config, yaml).map_err(|e| ControlPlaneError::io(&config, e))?;
        let mut process = Process::spawn(
            &format!("registry-{port}"),
            &binaries.path("registry"),
            &["serve".to_owned(), config.display().to_string()],
            dir,
        )?;
        let started = Instant::now();
        let deadline = Duration::from_secs(20);
        loop {
            process.check_running()?;
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(OciRegistry { process, port });
            }
            if started.elapsed() > deadline {
                return Err(ControlPlaneError::NotReady {
                    what: format!("the registry on port {port}"),
                    after: deadline,
                    log: tail(&process.log, 20),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `127.0.0.1:<port>`, the registry part of a reference.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops it (its storage stays for a registry started again on its
    /// port).
    pub fn stop(mut self) {
        self.process.stop(Duration::from_secs(5));
    }
}
