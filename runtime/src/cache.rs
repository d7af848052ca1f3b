//! Compiled policies on disk, so a restart does not compile again.
//!
//! A compiled artifact is native code the operator will run: the cache
//! must never be more trusted than the policy directory itself. So:
//!
//! - the cache directory is private: created `0700`, and refused (the
//!   operator compiles every time and says why) when it is not owned by the
//!   operator's user or can be written by anyone else;
//! - only a policy that loaded and passed its self-check is written
//!   ([`PolicyCache::store`]);
//! - artifacts of policies no longer in the set are removed
//!   ([`PolicyCache::prune`]);
//! - an artifact is named `<engine compatibility hash>-<SHA-256 of the
//!   policy>.cwasm`, with its own SHA-256 written beside it last, so a
//!   write cut short by a crash is never loaded; a damaged artifact is
//!   compiled again, never trusted.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

use super::digest::hex_digest;
use super::error::{Error, Result};

/// A private directory of compiled policies.
#[derive(Debug, Clone)]
pub struct PolicyCache {
    dir: PathBuf,
}

const ARTIFACT: &str = ".cwasm";
const CHECKSUM: &str = ".cwasm.sha256";

impl PolicyCache {
    /// Opens (creating it `0700` if needed) the cache directory `dir`,
    /// refusing one that others could write.
    pub fn open(dir: &Path) -> Result<Self> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        let refuse = |why: String| {
            Error::Cache(format!(
                "policy cache directory {}: {why}; compiled policies are not cached",
                dir.display()
            ))
        };
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| refuse(format!("cannot create it: {e}")))?;
        }
        let meta = std::fs::symlink_metadata(dir).map_err(|e| refuse(e.to_string()))?;
        if !meta.is_dir() {
            return Err(refuse(
                "not a directory (a symbolic link is not followed)".into(),
            ));
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return Err(refuse(format!(
                "owned by uid {}, not by this process's uid {me}",
                meta.uid()
            )));
        }
        let mode = meta.permissions().mode();
        if mode & 0o022 != 0 {
            return Err(refuse(format!(
                "mode {:o} lets others write it (use a directory only this user can write, \
                 e.g. mode 700)",
                mode & 0o7777
            )));
        }
        Ok(PolicyCache {
            dir: dir.to_owned(),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn paths(&self, compat: &str, digest: &str) -> (PathBuf, PathBuf) {
        let base = key(compat, digest);
        (
            self.dir.join(format!("{base}{ARTIFACT}")),
            self.dir.join(format!("{base}{CHECKSUM}")),
        )
    }

    /// The cached artifact for a policy, if there is a sound one.
    pub(crate) fn read(&self, engine: &Engine, compat: &str, digest: &str) -> Option<Component> {
        let (artifact, checksum) = self.paths(compat, digest);
        let want = std::fs::read_to_string(&checksum).ok()?;
        let bytes = std::fs::read(&artifact).ok()?;
        if hex_digest(&bytes) != want.trim() {
            tracing::warn!(artifact = %artifact.display(), "cached policy artifact is damaged; compiling again");
            return None;
        }
        // SAFETY: the bytes are an artifact this program serialised, in a
        // directory only this user can write (checked by `open`), for a
        // policy that passed its self-check, with an engine of the same
        // compatibility hash (part of the name), unchanged since (checked
        // against the checksum written after it). wasmtime also checks the
        // artifact's version and settings.
        match unsafe { Component::deserialize(engine, &bytes) } {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(artifact = %artifact.display(), error = %e, "cached policy artifact unusable; compiling again");
                None
            }
        }
    }

    /// Writes the artifact of the policy `name` (`artifact`: its
    /// serialised compiled form) under its compatibility hash and digest.
    /// Call it only for a policy that passed its self-check (see
    /// [`Policy::cache_in`](crate::engine::Policy::cache_in)). Best effort: a cache
    /// that cannot be written costs a compile at the next start, nothing
    /// else.
    pub(crate) fn store(
        &self,
        name: &str,
        compat: &str,
        digest: &str,
        artifact: crate::error::Result<Vec<u8>>,
    ) {
        let (path, checksum) = self.paths(compat, digest);
        let result = artifact.map_err(std::io::Error::other).and_then(|bytes| {
            write_atomic(&path, &bytes)?;
            write_atomic(&checksum, hex_digest(&bytes).as_bytes())
        });
        if let Err(e) = result {
            tracing::warn!(policy = name, artifact = %path.display(), error = %e, "cannot cache the compiled policy");
        }
    }

    /// Removes every artifact whose key (see [`key`]) is not one of `keep`
    /// (policies in use), and leftovers of interrupted writes. Returns how
    /// many files went.
    pub fn prune(&self, keep: impl IntoIterator<Item = String>) -> usize {
        let keep: BTreeSet<String> = keep.into_iter().collect();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((base, _)) = name.split_once(ARTIFACT) else {
                continue;
            };
            let finished = name.ends_with(ARTIFACT) || name.ends_with(CHECKSUM);
            if keep.contains(base) && finished {
                continue;
            }
            if std::fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!(dir = %self.dir.display(), removed, "pruned compiled policies no longer in use");
        }
        removed
    }
}

/// A cached artifact's key: the engine's compatibility hash and the
/// module's digest.
pub(crate) fn key(compat: &str, digest: &str) -> String {
    format!("{compat}-{digest}")
}

/// Writes a file through a temporary name and a rename, private to this
/// user.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = PathBuf::from(format!("{}.tmp{}", path.display(), std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(bytes)?;
    drop(file);
    std::fs::rename(&tmp, path)
}
