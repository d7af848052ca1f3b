//! Where the control plane's binaries are: built by `build.sh` into its
//! cache folder (or a folder `NMO_CONTROL_PLANE_BIN` names).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::ControlPlaneError;

/// The pinned versions (`versions.env`), as `NAME=value` pairs.
pub fn versions() -> Vec<(&'static str, &'static str)> {
    include_str!("../versions.env")
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .collect()
}

/// The folder of built binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// Builds what is missing (`build.sh` says so on stderr, with how long
    /// it takes) and returns the folder. Several test processes at once:
    /// one builds, the rest wait for it.
    pub fn ensure() -> Result<Binaries, ControlPlaneError> {
        if let Some(dir) = std::env::var_os("NMO_CONTROL_PLANE_BIN") {
            return Ok(Binaries { dir: dir.into() });
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("build.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| ControlPlaneError::Build(format!("running {}: {e}", script.display())))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(ControlPlaneError::Build(format!(
                "{} exited with {} (its output is above){}",
                script.display(),
                out.status,
                if stdout.trim().is_empty() {
                    String::new()
                } else {
                    format!(": {stdout}")
                }
            )));
        }
        let dir = stdout.lines().last().unwrap_or_default().trim();
        Ok(Binaries { dir: dir.into() })
    }

    /// A file of the folder.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
