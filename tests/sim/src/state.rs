//! The simulation's shared state: the store, the resource types, the
//! simulated clock and the fault switches.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::Notify;

use crate::resources::{self, ResourceType};
use crate::store::Store;

/// Simulated time: real time since start times the scale, plus whatever a
/// test advanced it by. Object timestamps stay wall-clock (as a real
/// cluster's); only the cluster's own waits (grace periods, startup) run on
/// this clock.
pub struct SimClock {
    started: Instant,
    inner: Mutex<ClockInner>,
}

struct ClockInner {
    /// Simulated seconds accumulated before the last scale change.
    base: f64,
    /// Real instant of the last scale change.
    since: Instant,
    scale: f64,
}

impl SimClock {
    pub fn new(scale: f64) -> Self {
        let now = Instant::now();
        SimClock {
            started: now,
            inner: Mutex::new(ClockInner {
                base: 0.0,
                since: now,
                scale,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ClockInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Simulated seconds since the cluster started.
    pub fn now(&self) -> f64 {
        let c = self.lock();
        c.base + c.since.elapsed().as_secs_f64() * c.scale
    }

    /// Changes how many simulated seconds pass per real second.
    pub fn set_scale(&self, scale: f64) {
        let mut c = self.lock();
        c.base += c.since.elapsed().as_secs_f64() * c.scale;
        c.since = Instant::now();
        c.scale = scale;
    }

    pub fn scale(&self) -> f64 {
        self.lock().scale
    }

    /// Jumps simulated time forward.
    pub fn advance(&self, by: Duration) {
        self.lock().base += by.as_secs_f64();
    }

    /// Real time since the cluster started.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }
}

/// One error-injection rule.
#[derive(Debug, Clone)]
pub struct FaultRule {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, or
    /// `None` for every verb.
    pub verb: Option<String>,
    /// Resource plural (`pods`, `leases`, `pods/eviction`...), or `None`
    /// for every resource.
    pub resource: Option<String>,
    /// Share of matching requests that fail, 0.0 to 1.0.
    pub rate: f64,
    /// 500, 409, 429, 503 or 403 (RBAC refusing it).
    pub code: u16,
}

/// The fault switches.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    pub rules: Vec<FaultRule>,
    /// Added to every request.
    pub latency: Duration,
    /// Watch streams end after this long (clients must re-watch).
    pub drop_watches_after: Option<Duration>,
    /// The kubelet stops: pods neither start nor finish terminating.
    pub kubelet_paused: bool,
    /// One-shot rules: each lets `after` matching requests through, fails
    /// the next one (its `rate` ignored), then is gone. A test that must
    /// fail one given write (the second patch of a node, say) queues one.
    pub next: Vec<OneShot>,
    /// Answers held back after they were made, as a slow network or a
    /// busy client holds them: what the answer says is from when it was
    /// made, and watch events written meanwhile may overtake it.
    pub slow_answers: Vec<SlowAnswer>,
}

/// Answers to matching requests wait `delay` after they were made.
#[derive(Debug, Clone)]
pub struct SlowAnswer {
    /// As [`FaultRule::verb`].
    pub verb: Option<String>,
    /// As [`FaultRule::resource`].
    pub resource: Option<String>,
    pub delay: Duration,
}

/// A fault for one request: see [`Faults::next`].
#[derive(Debug, Clone)]
pub struct OneShot {
    pub after: u32,
    pub rule: FaultRule,
}

impl FaultRule {
    fn matches(&self, verb: &str, resource: &str) -> bool {
        self.verb.as_deref().is_none_or(|v| v == verb)
            && self.resource.as_deref().is_none_or(|x| x == resource)
    }
}

impl OneShot {
    /// `code` for the `(after + 1)`th `verb` on `resource` from now.
    pub fn new(verb: &str, resource: &str, after: u32, code: u16) -> OneShot {
        OneShot {
            after,
            rule: FaultRule {
                verb: Some(verb.into()),
                resource: Some(resource.into()),
                rate: 1.0,
                code,
            },
        }
    }
}

impl Faults {
    /// The status code to fail this request with, if a rule fires; a
    /// one-shot rule that fires is used up.
    pub fn take(&mut self, verb: &str, resource: &str) -> Option<u16> {
        let mut fired = None;
        for (i, shot) in self.next.iter_mut().enumerate() {
            if !shot.rule.matches(verb, resource) {
                continue;
            }
            if shot.after == 0 {
                fired = Some(i);
                break;
            }
            shot.after -= 1;
        }
        if let Some(i) = fired {
            return Some(self.next.remove(i).rule.code);
        }
        self.roll(verb, resource)
    }

    /// The status code to fail this request with, if a rule fires.
    pub fn roll(&self, verb: &str, resource: &str) -> Option<u16> {
        let mut rng = rand::rng();
        self.rules
            .iter()
            .filter(|r| r.matches(verb, resource))
            .find(|r| rng.random::<f64>() < r.rate)
            .map(|r| r.code)
    }
}

/// Everything the server and the cluster's controllers share.
pub struct Sim {
    pub store: Mutex<Store>,
    pub types: RwLock<Vec<ResourceType>>,
    pub clock: SimClock,
    pub faults: Mutex<Faults>,
    /// Terminating pods by uid.
    pub terminating: Mutex<HashMap<String, Termination>>,
    /// Wakes the controllers after a change.
    pub wake: Notify,
    /// Counts requests by verb and resource (for tests and RBAC checks).
    pub audit: Mutex<Vec<AuditRecord>>,
    pub record_audit: std::sync::atomic::AtomicBool,
    /// The protobuf layout of the built-in kinds.
    pub proto: crate::proto::Schema,
    /// Requests must carry a known bearer token and RBAC must allow them.
    pub authorization: std::sync::atomic::AtomicBool,
    /// Container logs.
    pub logs: crate::logs::Logs,
}

/// A pod's graceful deletion, in simulated seconds.
#[derive(Debug, Clone, Copy)]
pub struct Termination {
    /// When the first delete came (the kubelet sends SIGTERM).
    pub started: f64,
    /// When the grace period runs out (the kubelet kills it).
    pub deadline: f64,
    /// When the pod goes, as its annotations said at the delete (the
    /// kubelet looks again whenever the pod changes).
    pub ends: f64,
}

/// One request, as the audit log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    /// The object's name ("" for a list, a watch or a create without one
    /// in the path).
    pub name: String,
    pub user_agent: String,
    /// The request body's media type ("" without a body).
    pub content_type: String,
    /// The request's query string ("" without one): `limit=1`, say.
    pub query: String,
    /// Who made it ("" without a known bearer token).
    pub user: String,
    /// Refused by authentication or RBAC (401 or 403).
    pub denied: bool,
    /// The answer's HTTP status (0 until it is known).
    pub code: u16,
    /// When the request arrived.
    pub at: std::time::Instant,
    /// When it was answered (`None` until then; a watch, when it ends).
    pub answered: Option<std::time::Instant>,
}

impl Sim {
    pub fn new(time_scale: f64, watch_history: usize) -> Self {
        Sim {
            store: Mutex::new(Store::new(watch_history)),
            types: RwLock::new(resources::builtin()),
            clock: SimClock::new(time_scale),
            faults: Mutex::new(Faults::default()),
            terminating: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            audit: Mutex::new(Vec::new()),
            record_audit: std::sync::atomic::AtomicBool::new(false),
            proto: crate::proto::Schema::builtin(),
            authorization: std::sync::atomic::AtomicBool::new(false),
            logs: crate::logs::Logs::default(),
        }
    }

    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn faults(&self) -> Faults {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_faults(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut self.faults.lock().unwrap_or_else(|p| p.into_inner()));
        self.wake.notify_one();
    }

    /// The latency to add and the fault (if any) for one request, using up
    /// a one-shot rule that fires.
    pub fn fault_for(&self, verb: &str, resource: &str) -> (std::time::Duration, Option<u16>) {
        let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        (faults.latency, faults.take(verb, resource))
    }

    /// How long an answer to `verb` on `resource` is held back once made.
    pub fn answer_delay(&self, verb: &str, resource: &str) -> std::time::Duration {
        let faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        faults
            .slow_answers
            .iter()
            .filter(|s| {
                s.verb.as_deref().is_none_or(|v| v == verb)
                    && s.resource.as_deref().is_none_or(|x| x == resource)
            })
            .map(|s| s.delay)
            .max()
            .unwrap_or_default()
    }

    /// Finds a served resource type by group, version and plural.
    pub fn find_type(&self, group: &str, version: &str, plural: &str) -> Option<ResourceType> {
        self.types
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
            .cloned()
    }

    /// The preferred resource type for a storage (core events for events).
    pub fn type_for_storage(&self, storage: &str) -> Option<ResourceType> {
        self.types
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|r| r.storage == storage)
            .cloned()
    }

    /// Every served resource type.
    pub fn all_types(&self) -> Vec<ResourceType> {
        self.types.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
