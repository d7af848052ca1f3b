//! The policy set in use, and its hot reload.
//!
//! [`PolicyStore`] holds the current [`PolicySet`]. When it was loaded from
//! a directory, [`PolicyStore::watch`] reloads it when the directory
//! changes (inotify events, debounced, plus a slow poll as a safety net).
//! A new set is used only if every policy in it compiles and passes its
//! self-check and `policies.yaml` is valid; otherwise the last good set
//! keeps running and the rejection is logged, counted
//! (`nmo_policy_reloads_total{result="failure"}`,
//! `nmo_policy_last_reload_successful 0`) and shown in `/readyz?verbose`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use super::error::Result;
use super::metrics::{PolicyMetrics, ReloadResult};
use super::oci::Registry;
use super::set::{PolicySet, Snapshot};
use nmo_policy_runtime::PolicyCache;
use nmo_policy_runtime::{Policy, PolicyEngine};

use crate::sync::{Locked, ReadWrite};

/// The fingerprint of a policy directory that does not exist.
const ABSENT: &str = "absent";

/// What a reload did.
#[derive(Debug, Clone, PartialEq)]
pub enum Reload {
    /// The directory has not changed since the last attempt.
    Unchanged,
    /// A new set is in use.
    Reloaded,
    /// The new content was rejected; the last good set stays in use.
    Rejected(String),
}

#[derive(Debug, Default)]
struct Status {
    /// Fingerprint of the last snapshot tried, good or bad.
    last_tried: String,
    /// Why the last reload was rejected, while the directory still holds
    /// that content.
    rejected: Option<String>,
}

/// The policy set in use. Shared by the controller, the probes and the
/// reloader.
#[derive(Debug)]
pub struct PolicyStore {
    current: RwLock<Arc<PolicySet>>,
    status: Mutex<Status>,
    source: Option<Source>,
    /// Where reloads and decisions are counted: the policies' engine's.
    metrics: Option<PolicyMetrics>,
}

#[derive(Debug)]
struct Source {
    dir: PathBuf,
    engine: PolicyEngine,
    cache: Option<PolicyCache>,
    /// Where `policies.yaml`'s `pull:` references are pulled from.
    registry: Registry,
}

impl PolicyStore {
    /// A store that never changes.
    pub fn fixed(set: PolicySet) -> Arc<Self> {
        let metrics = set
            .select(None, None)
            .ok()
            .and_then(|s| PolicyMetrics::of(s.policy.observer()));
        Arc::new(PolicyStore {
            metrics,
            status: Mutex::new(Status {
                last_tried: set.fingerprint().to_owned(),
                rejected: None,
            }),
            current: RwLock::new(Arc::new(set)),
            source: None,
        })
    }

    /// A store of one policy, for everything.
    pub fn single(policy: Policy) -> Arc<Self> {
        Self::fixed(PolicySet::single(policy))
    }

    /// Loads the policy directory `dir`; a directory that does not exist
    /// gives the embedded default policy (and is picked up if it appears).
    /// A directory that exists but does not load is an error: at start
    /// there is no last good set to fall back on.
    pub fn from_dir(
        engine: PolicyEngine,
        dir: &Path,
        cache: Option<PolicyCache>,
    ) -> Result<Arc<Self>> {
        Self::from_dir_pulling(engine, dir, cache, Registry::default())
    }

    /// [`PolicyStore::from_dir`], pulling the policies `policies.yaml`
    /// names by OCI reference through `registry`.
    pub fn from_dir_pulling(
        engine: PolicyEngine,
        dir: &Path,
        cache: Option<PolicyCache>,
        registry: Registry,
    ) -> Result<Arc<Self>> {
        let (set, tried) = if dir.exists() {
            let snap = Snapshot::read(dir)?;
            let fingerprint = snap.fingerprint.clone();
            let snap = snap.with_pulled(&registry)?;
            let set = PolicySet::load(&engine, &snap, cache.as_ref())?;
            (set, fingerprint)
        } else {
            tracing::info!(dir = %dir.display(), "no policy directory; using the embedded default policy");
            (
                PolicySet::builtin(&engine, cache.as_ref())?,
                ABSENT.to_owned(),
            )
        };
        tracing::info!(dir = %dir.display(), set = %set.summary(), "policies loaded");
        Ok(Arc::new(PolicyStore {
            metrics: PolicyMetrics::of(engine.observer()),
            current: RwLock::new(Arc::new(set)),
            status: Mutex::new(Status {
                last_tried: tried,
                rejected: None,
            }),
            source: Some(Source {
                dir: dir.to_owned(),
                engine,
                cache,
                registry,
            }),
        }))
    }

    /// Where the policies' decisions and the store's reloads are counted
    /// (the engine's), if anywhere.
    pub fn metrics(&self) -> Option<&PolicyMetrics> {
        self.metrics.as_ref()
    }

    fn count_reload(&self, result: ReloadResult) {
        if let Some(m) = &self.metrics {
            m.reloaded(result);
        }
    }

    /// The set in use now.
    pub fn current(&self) -> Arc<PolicySet> {
        self.current.reading().clone()
    }

    /// Why the directory's current content was rejected, if it was.
    pub fn rejected(&self) -> Option<String> {
        self.status.locked().rejected.clone()
    }

    /// The readiness detail: what is in use, and any rejected reload. The
    /// operator stays ready after a rejected reload (it keeps working with
    /// the last good set), so this never fails once a set is loaded.
    pub fn readiness(&self) -> String {
        let set = self.current();
        match self.rejected() {
            None => set.summary(),
            Some(why) => format!(
                "{}; the policy directory's new content was rejected, the last good set stays \
                 in use: {why}",
                set.summary()
            ),
        }
    }

    /// Reads the directory and, if it changed, loads and swaps in the new
    /// set. Blocking (compiles); call it off the async runtime.
    pub fn reload(&self) -> Reload {
        let Some(src) = &self.source else {
            return Reload::Unchanged;
        };
        let snap = if src.dir.exists() {
            Snapshot::read(&src.dir)
        } else if self.status.locked().last_tried == ABSENT {
            // There was none at start and there is none now: the embedded
            // default stays, nothing was rejected.
            return Reload::Unchanged;
        } else {
            Err(super::error::Error::Set(format!(
                "policy directory {} is gone",
                src.dir.display()
            )))
        };
        let fingerprint = match &snap {
            Ok(s) => s.fingerprint.clone(),
            Err(e) => format!("error: {e}"),
        };
        {
            let status = self.status.locked();
            if status.last_tried == fingerprint {
                return Reload::Unchanged;
            }
        }
        let pulls = snap.as_ref().is_ok_and(Snapshot::pulls);
        let result = snap
            .and_then(|s| s.with_pulled(&src.registry))
            .and_then(|s| PolicySet::load(&src.engine, &s, src.cache.as_ref()));
        let mut status = self.status.locked();
        // A set rejected because a pull failed is tried again at the next
        // poll (the registry may be back); any other rejection waits for
        // the directory to change.
        let pull_failed = matches!(&result, Err(super::error::Error::Pull { .. })) && pulls;
        status.last_tried = if pull_failed {
            String::new()
        } else {
            fingerprint
        };
        match result {
            Ok(set) => {
                tracing::info!(dir = %src.dir.display(), set = %set.summary(), "policies reloaded");
                *self.current.writing() = Arc::new(set);
                status.rejected = None;
                self.count_reload(ReloadResult::Success);
                Reload::Reloaded
            }
            Err(e) => {
                let why = e.to_string();
                tracing::error!(dir = %src.dir.display(), error = %why, category = e.category(), "policy reload rejected; the last good set stays in use");
                status.rejected = Some(why.clone());
                self.count_reload(ReloadResult::Failure);
                Reload::Rejected(why)
            }
        }
    }

    /// Reloads whenever the directory changes, until the task is dropped:
    /// on inotify events (debounced by `debounce`) and every `poll` in
    /// case an event was missed (or the directory did not exist yet).
    pub async fn watch(self: Arc<Self>, debounce: Duration, poll: Duration) {
        let Some(src) = &self.source else { return };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let _watcher = {
            use notify::Watcher;
            let tx = tx.clone();
            let watcher = notify::recommended_watcher(move |_event| {
                let _ = tx.send(());
            })
            .and_then(|mut w| {
                w.watch(&src.dir, notify::RecursiveMode::NonRecursive)
                    .map(|()| w)
            });
            match watcher {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::info!(dir = %src.dir.display(), error = %e, poll = %crate::text::duration(poll), "not watching the policy directory for events; polling it");
                    None
                }
            }
        };
        loop {
            tokio::select! {
                Some(()) = rx.recv() => {
                    tokio::time::sleep(debounce).await;
                    while rx.try_recv().is_ok() {}
                }
                () = tokio::time::sleep(poll) => {}
            }
            let store = self.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || store.reload()).await {
                tracing::error!(error = %e, "policy reload task failed");
            }
        }
    }
}
