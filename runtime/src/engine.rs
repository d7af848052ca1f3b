//! The wasmtime sandbox: one engine, policies compiled once, a fresh store
//! per decision.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1 as k8s;
use wasmtime::component::{Component, HasSelf, Linker, Resource};
use wasmtime::{Engine, PoolingAllocationConfig, Store, Trap};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtxBuilder};

use super::bindings::DrainPolicy;
use super::cache::PolicyCache;
use super::compile::{self, CompileLimits, wasm_config};
use super::digest::hex_digest;
use super::error::{Error, Result};
use super::exports::{Bound, Exports};
use super::inputs::{Fleet, History, HostState, Inputs, Settings};
use super::output::{CappedOutput, MAX_LOG_LINE_BYTES, RateWindow, Records};
use super::validate::{self, Admission, Plan, Verdict};
use super::workloads::Workloads;
use crate::bindings::types::{self, Failure, KeyValue, Maintenance};
use crate::contract::{
    CONTRACT_VERSION, DEFAULT_POLICY_NAME, DEFAULT_POLICY_WASM, SERVED_CONTRACTS, WORLD,
};
use crate::decision::Decision;
use crate::observe::Observer;

/// Sandbox limits, the same for every policy of an engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Wall-clock time one decision (instantiate + call) may take, whatever
    /// the guest does: compute, sleep, or wait on a host call.
    pub deadline: Duration,
    /// Linear memory one decision may use, all of its memories together,
    /// in bytes.
    pub memory_limit_bytes: usize,
    /// Bytes the host copies out of the sandbox for one answer (and for
    /// each host call the guest makes), however the answer is built.
    pub output_limit_bytes: usize,
    /// How often the epoch ticker advances while a decision runs: the
    /// deadline's resolution. The ticker sleeps while no decision runs.
    pub epoch_tick: Duration,
    /// Decisions run at once; more callers wait for a slot. Each slot is a
    /// pre-allocated, reused sandbox (wasmtime's pooling allocator), which
    /// keeps a fresh store per decision cheap. The memory all decisions
    /// can hold together is `max_concurrent_calls * (memory_limit_bytes +
    /// output_limit_bytes)`.
    pub max_concurrent_calls: u32,
    /// Limits on loading a policy: file size, compile time and memory.
    pub compile: CompileLimits,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            deadline: Duration::from_millis(500),
            memory_limit_bytes: 32 << 20,
            output_limit_bytes: 4 << 20,
            epoch_tick: Duration::from_millis(1),
            max_concurrent_calls: 4,
            compile: CompileLimits::default(),
        }
    }
}

impl EngineConfig {
    fn deadline_ticks(&self) -> u64 {
        let tick = self.epoch_tick.as_nanos().max(1);
        (self.deadline.as_nanos().div_ceil(tick) as u64).max(1)
    }
}

/// Memory a pool slot keeps mapped between decisions: enough for a typical
/// decision's working set, small enough that idle slots cost little.
const KEEP_RESIDENT_BYTES: usize = 1 << 20;

/// The engine every policy runs on. Cheap to clone.
#[derive(Clone)]
pub struct PolicyEngine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    engine: Engine,
    linker: Linker<HostState>,
    config: EngineConfig,
    ticker: Arc<Ticker>,
    ticker_thread: std::thread::Thread,
    slots: Slots,
    /// Runs the decisions' futures (WASI's host calls are async; a
    /// decision is bounded by a timer of this runtime). Taken on drop.
    runtime: Option<tokio::runtime::Runtime>,
    observer: Option<Arc<dyn Observer>>,
}

/// The epoch ticker's state: it advances the epoch only while a decision
/// runs, and sleeps otherwise.
#[derive(Default)]
struct Ticker {
    stop: AtomicBool,
    active: AtomicUsize,
}

/// Marks a decision as running for the ticker while alive.
struct Ticking<'a>(&'a EngineInner);

impl<'a> Ticking<'a> {
    fn start(engine: &'a EngineInner) -> Self {
        if engine.ticker.active.fetch_add(1, Ordering::SeqCst) == 0 {
            engine.ticker_thread.unpark();
        }
        Ticking(engine)
    }
}

impl Drop for Ticking<'_> {
    fn drop(&mut self) {
        self.0.ticker.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A counting semaphore over the pooling allocator's instance slots.
struct Slots {
    free: Mutex<u32>,
    freed: Condvar,
}

impl Slots {
    fn acquire(&self) -> SlotGuard<'_> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        *free -= 1;
        SlotGuard(self)
    }
}

struct SlotGuard<'a>(&'a Slots);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        self.ticker.stop.store(true, Ordering::SeqCst);
        self.ticker_thread.unpark();
        // Dropping a runtime may not block inside another runtime.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl std::fmt::Debug for PolicyEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyEngine")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl PolicyEngine {
    /// Sets up the engine, the linker and the epoch ticker; its decisions
    /// are not told to anyone (see [`PolicyEngine::observed`]).
    pub fn new(config: EngineConfig) -> Result<Self> {
        Self::build(config, None)
    }

    /// [`PolicyEngine::new`], telling `observer` of every decision's
    /// latency and error category.
    pub fn observed(config: EngineConfig, observer: Arc<dyn Observer>) -> Result<Self> {
        Self::build(config, Some(observer))
    }

    fn build(config: EngineConfig, observer: Option<Arc<dyn Observer>>) -> Result<Self> {
        if config.deadline.is_zero() || config.epoch_tick.is_zero() {
            return Err(Error::Engine(
                "the policy deadline and epoch tick must be above zero".into(),
            ));
        }
        if config.max_concurrent_calls == 0 {
            return Err(Error::Engine(
                "max_concurrent_calls must be at least 1".into(),
            ));
        }
        let slots = config.max_concurrent_calls;
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(slots)
            .total_core_instances(slots * 4)
            .max_core_instances_per_component(4)
            .total_memories(slots * 2)
            .max_memories_per_component(2)
            .total_tables(slots * 4)
            .max_tables_per_component(4)
            .total_stacks(slots)
            .max_memory_size(config.memory_limit_bytes)
            // Reused slots are reset by zeroing this much instead of giving
            // the pages back to the kernel; the rest goes back, so memory a
            // hostile decision touched does not stay resident.
            .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
            .table_keep_resident(64 << 10)
            .async_stack_keep_resident(64 << 10);
        let wasm_config = wasm_config(Some(pool));
        let engine = Engine::new(&wasm_config).map_err(|e| Error::Engine(format!("{e:#}")))?;

        let mut linker = Linker::<HostState>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| Error::Engine(format!("linking WASI: {e:#}")))?;
        DrainPolicy::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| Error::Engine(format!("linking the host imports: {e:#}")))?;
        super::compat::add_to_linker(&mut linker)
            .map_err(|e| Error::Engine(format!("linking contract 0.3: {e:#}")))?;

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("nmo-policy-timer")
            .enable_all()
            .build()
            .map_err(|e| Error::Engine(format!("starting the policy runtime: {e}")))?;

        let ticker = Arc::new(Ticker::default());
        let ticker_thread = {
            let engine = engine.clone();
            let ticker = ticker.clone();
            let tick = config.epoch_tick;
            std::thread::Builder::new()
                .name("nmo-policy-epoch".into())
                .spawn(move || {
                    while !ticker.stop.load(Ordering::SeqCst) {
                        if ticker.active.load(Ordering::SeqCst) == 0 {
                            // Woken by the next decision (or the drop).
                            std::thread::park();
                            continue;
                        }
                        std::thread::sleep(tick);
                        engine.increment_epoch();
                    }
                })
                .map_err(|e| Error::Engine(format!("starting the epoch ticker: {e}")))?
                .thread()
                .clone()
        };

        Ok(PolicyEngine {
            inner: Arc::new(EngineInner {
                engine,
                linker,
                slots: Slots {
                    free: Mutex::new(config.max_concurrent_calls),
                    freed: Condvar::new(),
                },
                config,
                ticker,
                ticker_thread,
                runtime: Some(runtime),
                observer,
            }),
        })
    }

    /// The limits this engine runs policies with.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Who is told of this engine's decisions, if anyone.
    pub fn observer(&self) -> Option<&Arc<dyn Observer>> {
        self.inner.observer.as_ref()
    }

    /// Compiles and links a policy. `name` is what logs, metrics and errors
    /// call it (usually the file name).
    pub fn load(&self, name: &str, wasm: &[u8]) -> Result<Policy> {
        self.load_cached(name, wasm, None)
    }

    /// [`PolicyEngine::load`], taking the compiled artifact from `cache`
    /// when it has one (see [`PolicyCache`]). Nothing is written to the
    /// cache here: only a policy that then passes its self-check is, by
    /// [`PolicyCache::store`].
    pub fn load_cached(
        &self,
        name: &str,
        wasm: &[u8],
        cache: Option<&PolicyCache>,
    ) -> Result<Policy> {
        let limits = &self.inner.config.compile;
        compile::check_size(name, wasm, limits)?;
        check_header(name, wasm)?;
        let digest = hex_digest(wasm);
        let cached = cache.and_then(|c| c.read(&self.inner.engine, &self.compat_hash(), &digest));
        let from_cache = cached.is_some();
        let component = match cached {
            Some(component) => component,
            None => self.compile(name, wasm)?,
        };
        check_contract(name, &self.inner.engine, &component)?;
        let wrong_world = |e: wasmtime::Error| Error::WrongWorld {
            policy: name.to_owned(),
            reason: format!("{e:#}"),
        };
        let instance_pre = self
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(wrong_world)?;
        let contract = contract_of(&self.inner.engine, &component);
        let pre = Bound::new(instance_pre, contract.as_deref()).map_err(wrong_world)?;
        let reads_workloads = reads_workloads(&self.inner.engine, &component);
        Ok(Policy {
            inner: Arc::new(PolicyInner {
                name: name.to_owned(),
                digest,
                pre,
                reads_workloads,
                engine: self.clone(),
                from_cache,
                log_window: Arc::default(),
            }),
            now: None,
            settings: Settings::default(),
        })
    }

    /// Compiles a policy: in the compile worker when one is configured (a
    /// child process under time and memory limits), else here. The
    /// embedded default policy is ours and always compiled here.
    fn compile(&self, name: &str, wasm: &[u8]) -> Result<Component> {
        let limits = &self.inner.config.compile;
        let load = |e: wasmtime::Error| Error::Load {
            policy: name.to_owned(),
            reason: format!("{e:#}"),
        };
        match &limits.worker {
            Some(worker) if wasm != DEFAULT_POLICY_WASM => {
                let artifact = compile::in_worker(name, wasm, limits, worker)?;
                // SAFETY: the artifact was just produced by our own binary's
                // compile worker from these bytes, with this engine's
                // configuration; wasmtime checks its version and settings.
                unsafe { Component::deserialize(&self.inner.engine, &artifact) }.map_err(load)
            }
            _ => Component::new(&self.inner.engine, wasm).map_err(load),
        }
    }

    /// A stable hex digest of everything that makes a compiled artifact
    /// usable by this engine (wasmtime version, target, settings).
    pub fn compat_hash(&self) -> String {
        use std::hash::{Hash, Hasher};
        // SipHash with fixed keys: the same engine gives the same value in
        // every process of the same binary.
        let mut h = std::hash::DefaultHasher::new();
        self.inner
            .engine
            .precompile_compatibility_hash()
            .hash(&mut h);
        format!("{:016x}", h.finish())
    }

    /// Reads and loads a policy file (refusing one over the size limit
    /// without reading it all).
    pub fn load_file(&self, path: &Path) -> Result<Policy> {
        use std::io::Read;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        let max = self.inner.config.compile.max_policy_bytes as u64;
        let mut wasm = Vec::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(max + 1).read_to_end(&mut wasm))
            .map_err(|e| Error::Load {
                policy: name.clone(),
                reason: format!("cannot read {}: {e}", path.display()),
            })?;
        self.load(&name, &wasm)
    }

    /// The embedded default policy.
    pub fn default_policy(&self) -> Result<Policy> {
        self.load(DEFAULT_POLICY_NAME, DEFAULT_POLICY_WASM)
    }
}

/// Tells a non-WebAssembly file and a core module apart from a component
/// before handing the bytes to the compiler, for a clearer message.
fn check_header(name: &str, wasm: &[u8]) -> Result<()> {
    const MAGIC: &[u8] = b"\0asm";
    if wasm.len() < 8 || &wasm[..4] != MAGIC {
        return Err(Error::Load {
            policy: name.to_owned(),
            reason: format!(
                "not a WebAssembly file ({} bytes, no \\0asm header); build the policy with \
                 `cargo build --target wasm32-wasip2`",
                wasm.len()
            ),
        });
    }
    // Bytes 6..8 are the layer: 0 for a core module, 1 for a component.
    if wasm[6..8] == [0, 0] {
        return Err(Error::WrongWorld {
            policy: name.to_owned(),
            reason: format!(
                "this is a core WebAssembly module, not a component of {WORLD}; build the policy \
                 for the wasm32-wasip2 target"
            ),
        });
    }
    Ok(())
}

/// Refuses a component built against another minor version of the
/// contract, naming both versions. The version is read from the names of
/// the contract's interfaces the component imports or exports
/// (`medik8s:node-maintenance/types@0.1.0`).
fn check_contract(name: &str, engine: &Engine, component: &Component) -> Result<()> {
    const PACKAGE: &str = "medik8s:node-maintenance/";
    let ty = component.component_type();
    let names = ty
        .imports(engine)
        .map(|(n, _)| n.to_owned())
        .chain(ty.exports(engine).map(|(n, _)| n.to_owned()));
    for item in names {
        let Some(rest) = item.strip_prefix(PACKAGE) else {
            continue;
        };
        let found = rest.split_once('@').map(|(_, v)| v).unwrap_or("");
        let served = std::iter::once(CONTRACT_VERSION).chain(SERVED_CONTRACTS.iter().copied());
        if !served.into_iter().any(|v| same_minor(found, v)) {
            return Err(Error::ContractVersion {
                policy: name.to_owned(),
                found: if found.is_empty() {
                    "(unversioned)".to_owned()
                } else {
                    crate::text::clean(found, 64)
                },
                expected: CONTRACT_VERSION,
            });
        }
    }
    Ok(())
}

/// The contract version a component was built against, from the names
/// of the contract's interfaces it imports or exports.
fn contract_of(engine: &Engine, component: &Component) -> Option<String> {
    let ty = component.component_type();
    let names: Vec<String> = ty
        .imports(engine)
        .map(|(n, _)| n.to_owned())
        .chain(ty.exports(engine).map(|(n, _)| n.to_owned()))
        .collect();
    Interface {
        imports: names,
        exports: Vec::new(),
    }
    .contract()
    .map(str::to_owned)
}

/// Whether the component imports a pod's `workload` accessor (a
/// component imports only the functions it calls).
fn reads_workloads(engine: &Engine, component: &Component) -> bool {
    use wasmtime::component::types::ComponentItem;
    component
        .component_type()
        .imports(engine)
        .filter(|(n, _)| n.starts_with("medik8s:node-maintenance/types@"))
        .any(|(_, item)| match item.ty {
            ComponentItem::ComponentInstance(i) => {
                i.exports(engine).any(|(n, _)| n == "[method]pod.workload")
            }
            _ => false,
        })
}

/// Semver compatibility as the component model uses it for 0.x versions:
/// the same major and minor.
pub(crate) fn same_minor(a: &str, b: &str) -> bool {
    let mm = |v: &str| -> Option<(u64, u64)> {
        let mut parts = v.split(['.', '-', '+']);
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    };
    matches!((mm(a), mm(b)), (Some(x), Some(y)) if x == y)
}

/// A loaded policy. Cheap to clone; safe to call from many threads at once
/// (each call gets its own store).
///
/// A decision blocks its thread for up to the deadline: from async code,
/// call it through [`decide`](crate::decision::decide), never directly on an
/// async worker thread.
#[derive(Clone)]
pub struct Policy {
    inner: Arc<PolicyInner>,
    /// The time the policy's clocks show; `None`: the time each decision
    /// starts.
    now: Option<SystemTime>,
    /// What the `settings` import answers (checked by the policy's
    /// `validate-settings` when they were set).
    settings: Settings,
}

struct PolicyInner {
    name: String,
    digest: String,
    pre: Bound,
    /// The policy calls a pod's `workload` (0.4): its plans need the
    /// workloads read.
    reads_workloads: bool,
    engine: PolicyEngine,
    from_cache: bool,
    /// The policy's per-minute allowance of log records.
    log_window: Arc<RateWindow>,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.inner.name)
            .field("digest", &self.inner.digest)
            .finish_non_exhaustive()
    }
}

/// What a policy's component imports and exports, by name: the contract's
/// interfaces with their version (`medik8s:node-maintenance/types@0.3.0`),
/// WASI's, and its functions (`plan-drain`, `admit`...).
#[derive(Debug, Clone, Default)]
pub struct Interface {
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

impl Interface {
    /// The contract version the policy was built against (from the
    /// names of the contract's interfaces it uses).
    pub fn contract(&self) -> Option<&str> {
        self.imports
            .iter()
            .chain(&self.exports)
            .filter_map(|n| n.strip_prefix("medik8s:node-maintenance/"))
            .find_map(|rest| rest.split_once('@').map(|(_, v)| v))
    }
}

impl Policy {
    /// The policy's name (file name, or `default`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// What the policy's component imports and exports.
    pub fn interface(&self) -> Interface {
        let engine = &self.inner.engine.inner.engine;
        let ty = self.bound().instance_pre().component().component_type();
        Interface {
            imports: ty.imports(engine).map(|(n, _)| n.to_owned()).collect(),
            exports: ty.exports(engine).map(|(n, _)| n.to_owned()).collect(),
        }
    }

    /// The policy's exports, bound by its contract version.
    pub(crate) fn bound(&self) -> &Bound {
        &self.inner.pre
    }

    /// Whether the policy reads pods' workloads: a plan for it needs them
    /// read first (the operator reads them only for such policies).
    pub fn reads_workloads(&self) -> bool {
        self.inner.reads_workloads
    }

    /// The SHA-256 of the policy's bytes, in hex.
    pub fn digest(&self) -> &str {
        &self.inner.digest
    }

    /// Who is told of this policy's decisions (its engine's observer), if
    /// anyone.
    pub fn observer(&self) -> Option<&Arc<dyn Observer>> {
        self.inner.engine.observer()
    }

    /// Whether the compiled artifact came from the cache.
    pub fn from_cache(&self) -> bool {
        self.inner.from_cache
    }

    /// The compiled artifact, for the cache.
    pub(crate) fn serialize(&self) -> Result<Vec<u8>> {
        self.inner
            .pre
            .instance_pre()
            .component()
            .serialize()
            .map_err(|e| Error::Engine(format!("serialising policy {}: {e:#}", self.inner.name)))
    }

    /// The engine's compatibility hash, for the cache.
    pub(crate) fn compat_hash(&self) -> String {
        self.inner.engine.compat_hash()
    }

    /// This policy with its clocks frozen at `now` for every decision (the
    /// scenario harness's `now:`). By default a decision's clocks are
    /// frozen at the moment it starts.
    pub fn at(&self, now: SystemTime) -> Policy {
        Policy {
            inner: self.inner.clone(),
            now: Some(now),
            settings: self.settings.clone(),
        }
    }

    /// This policy with `settings` for every decision, once the policy's
    /// `validate-settings` accepts them ([`Error::Settings`] when it does
    /// not, with the policy's own message).
    pub fn with_settings(&self, settings: Settings) -> Result<Policy> {
        self.validate_settings(settings.pairs())?;
        Ok(Policy {
            inner: self.inner.clone(),
            now: self.now,
            settings,
        })
    }

    /// A decision's inputs with no pods or nodes: its settings only.
    fn inputs_without_objects(&self) -> Inputs {
        Inputs::new(Arc::from([]), Arc::from([]), self.settings.clone())
    }

    /// This policy with no settings, as a policy file given alone
    /// (`--policy FILE.wasm`) runs: one that needs settings refuses here,
    /// with its own message and where settings go.
    pub fn alone(&self) -> Result<Policy> {
        self.with_settings(Settings::default())
            .map_err(|e| match e {
                Error::Settings { policy, reason } => Error::Settings {
                    policy,
                    reason: format!(
                        "{reason} (a policy file given alone gets no settings: put it in a policy \
                     directory whose policies.yaml gives them)"
                    ),
                },
                other => other,
            })
    }

    /// Keeps the compiled policy in `cache` for the next start, unless it
    /// came from there. Call it only for a policy that passed its
    /// self-check.
    pub fn cache_in(&self, cache: &PolicyCache) {
        if !self.from_cache() {
            cache.store(
                self.name(),
                &self.compat_hash(),
                self.digest(),
                self.serialize(),
            );
        }
    }

    /// The policy's key in a [`PolicyCache`].
    pub fn cache_key(&self) -> String {
        super::cache::key(&self.compat_hash(), self.digest())
    }

    /// The settings the decisions get.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Asks the policy whether it accepts `settings`.
    pub fn validate_settings(&self, settings: &[KeyValue]) -> Result<()> {
        self.decide(
            Decision::ValidateSettings,
            Inputs::default(),
            async |policy, store| {
                // The `settings` import answers what is being checked.
                store.data_mut().inputs.settings = Settings::from_pairs(settings);
                policy.validate_settings(&mut *store, settings).await
            },
            |raw| validate::settings(&self.inner.name, raw),
        )
    }

    /// Asks the policy whether the maintenance of `fleet.nodes[node]` may
    /// start, and validates the answer.
    pub fn admit(
        &self,
        maintenance: &Maintenance,
        node: usize,
        fleet: &Fleet,
    ) -> Result<Admission> {
        let mut inputs = Inputs::new(Arc::from([]), fleet.nodes.clone(), self.settings.clone());
        inputs.lease_holders = fleet.lease_holders.clone();
        inputs.tool_claims = fleet.tool_claims.clone();
        self.decide(
            Decision::Admit,
            inputs,
            async |policy, store| {
                let record = types::Fleet {
                    nodes: (0..fleet.nodes.len())
                        .map(|i| Resource::new_own(i as u32))
                        .collect(),
                    maintenances: fleet.maintenances.clone(),
                    etcd: fleet.etcd,
                    history: fleet.history.clone(),
                };
                let node = Resource::new_own(node as u32);
                policy.admit(&mut *store, maintenance, node, record).await
            },
            |raw| validate::admission(&self.inner.name, raw),
        )
    }

    /// Asks the policy how to drain `node`, and validates the answer against
    /// `pods` (see [`validate::plan`]). Copies the objects; see
    /// [`Policy::plan_drain_shared`] to hand them over instead.
    pub fn plan_drain(
        &self,
        maintenance: &Maintenance,
        node: &k8s::Node,
        pods: &[k8s::Pod],
    ) -> Result<Plan> {
        self.plan_drain_shared(
            maintenance,
            node.clone(),
            Arc::from(pods),
            History::default(),
            Workloads::default(),
        )
    }

    /// [`Policy::plan_drain`] on objects the caller hands over (no copy),
    /// with what the drain has done to each pod so far.
    pub fn plan_drain_shared(
        &self,
        maintenance: &Maintenance,
        node: k8s::Node,
        pods: Arc<[k8s::Pod]>,
        history: History,
        workloads: Workloads,
    ) -> Result<Plan> {
        let count = pods.len();
        let mut inputs = Inputs::new(
            pods.clone(),
            Arc::from([Arc::new(node)]),
            self.settings.clone(),
        );
        inputs.history = history;
        inputs.workloads = workloads;
        self.decide(
            Decision::PlanDrain,
            inputs,
            async |policy, store| {
                let handles: Vec<Resource<types::Pod>> =
                    (0..count).map(|i| Resource::new_own(i as u32)).collect();
                policy
                    .plan_drain(&mut *store, maintenance, Resource::new_own(0), &handles)
                    .await
            },
            |raw| validate::plan(&self.inner.name, &pods, raw),
        )
    }

    /// Asks the policy what to do after `failure`, and validates the answer.
    pub fn on_failure(&self, maintenance: &Maintenance, failure: &Failure) -> Result<Verdict> {
        self.decide(
            Decision::OnFailure,
            self.inputs_without_objects(),
            async |policy, store| policy.on_failure(&mut *store, maintenance, failure).await,
            |raw| validate::verdict(&self.inner.name, raw),
        )
    }

    /// One decision: the call (see [`Policy::call`]), the answer checked by
    /// `check`, the latency and any error counted under the decision's
    /// name.
    fn decide<R, T>(
        &self,
        decision: Decision,
        inputs: Inputs,
        f: impl AsyncFnOnce(&Exports, &mut Store<HostState>) -> wasmtime::Result<R>,
        check: impl FnOnce(R) -> Result<T>,
    ) -> Result<T> {
        let started = std::time::Instant::now();
        let result = self.call(decision, inputs, f).and_then(check);
        if let Some(o) = self.inner.engine.observer() {
            let category = result.as_ref().err().map(Error::category);
            o.decided(decision, started.elapsed().as_secs_f64(), category);
        }
        result
    }

    /// Instantiates the policy into a fresh store and runs `f` under the
    /// engine's limits, turning every way a guest can fail into a typed
    /// error. The whole of it (instantiation, with the guest's
    /// initialisers, and the call) ends by the deadline in wall-clock time:
    /// the epoch deadline stops guest code that computes, the timer stops
    /// a guest waiting in a host call (a sleep, a poll).
    fn call<R>(
        &self,
        decision: Decision,
        inputs: Inputs,
        f: impl AsyncFnOnce(&Exports, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R> {
        let function = decision.name();
        let engine = &self.inner.engine.inner;
        let config = &engine.config;
        let _slot = engine.slots.acquire();
        let _ticking = Ticking::start(engine);
        let stdout = CappedOutput::default();
        let stderr = CappedOutput::default();
        let now = self.now.unwrap_or_else(SystemTime::now);
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .wall_clock(FrozenWallClock(now))
            .monotonic_clock(FrozenMonotonicClock)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let state = HostState::new(
            wasi,
            config.memory_limit_bytes,
            self.inner.name.clone(),
            Records::new(self.inner.log_window.clone()),
            inputs,
        );
        let mut store = Store::new(&engine.engine, state);
        store.limiter(HostState::limiter);
        store.set_epoch_deadline(config.deadline_ticks());
        store.epoch_deadline_trap();
        store.set_hostcall_fuel(config.output_limit_bytes);

        let work = async {
            let policy = self.inner.pre.instantiate(&mut store).await?;
            f(&policy, &mut store).await
        };
        let timed = async { tokio::time::timeout(config.deadline, work).await };
        let outcome = match &engine.runtime {
            // The engine's runtime drives the timers (the deadline, WASI's
            // sleeps); this thread runs the decision and waits for it. Not
            // the runtime's own `block_on`: a caller on another runtime's
            // thread (a test, the reloader called in place) must not panic.
            Some(rt) => {
                let _timers = rt.enter();
                futures::executor::block_on(timed)
            }
            None => return Err(Error::Engine("the policy runtime has shut down".into())),
        };

        let mut records = store
            .data_mut()
            .take_records(Records::new(self.inner.log_window.clone()));
        let out_dropped = forward_output(&self.inner.name, "stdout", &stdout, &mut records).1;
        let (err_lines, err_dropped) =
            forward_output(&self.inner.name, "stderr", &stderr, &mut records);
        records.finish(&self.inner.name, out_dropped + err_dropped);

        let deadline = || Error::Deadline {
            policy: self.inner.name.clone(),
            function,
            deadline: config.deadline,
        };
        let result = match outcome {
            Err(_elapsed) => return Err(deadline()),
            Ok(r) => r,
        };
        result.map_err(|e| {
            let policy = self.inner.name.clone();
            if store.data().memory_limit_hit() {
                Error::MemoryLimit {
                    policy,
                    function,
                    limit_bytes: config.memory_limit_bytes,
                }
            } else if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
                deadline()
            } else if format!("{e:#}").contains("fuel allocated for hostcalls has been exhausted") {
                Error::OutputLimit {
                    policy,
                    function,
                    limit_bytes: config.output_limit_bytes,
                }
            } else {
                // A Rust guest's panic message goes to stderr: it says more
                // than "wasm trap: unreachable" alone.
                let mut reason = root_message(&e);
                if let Some(at) = err_lines.iter().rposition(|l| l.contains("panicked")) {
                    let panic = err_lines[at..].iter().take(3).map(String::as_str);
                    let panic = panic.collect::<Vec<_>>().join(" ");
                    reason = format!("{reason} ({panic})");
                }
                Error::Trap {
                    policy,
                    function,
                    reason: crate::text::clean(&reason, MAX_LOG_LINE_BYTES),
                }
            }
        })
    }
}

/// The wall clock a policy sees: frozen at the decision's time.
struct FrozenWallClock(SystemTime);

impl HostWallClock for FrozenWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        self.0
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
    }
}

/// The monotonic clock a policy sees: it does not move during a decision
/// (so a busy wait on it ends at the deadline, and decisions are
/// reproducible). A sleep still waits in real time, up to the deadline.
struct FrozenMonotonicClock;

impl HostMonotonicClock for FrozenMonotonicClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        0
    }
}

/// Records a decision's latency, and its error category if it failed.
/// The innermost message of a wasmtime error (the trap itself, without the
/// backtrace context).
fn root_message(e: &wasmtime::Error) -> String {
    if let Some(trap) = e.downcast_ref::<Trap>() {
        return trap.to_string();
    }
    e.root_cause().to_string()
}

/// Writes what a policy printed to the host's log, within the decision's
/// and the policy's allowance of records; returns the lines and the bytes
/// dropped over the stream's cap.
fn forward_output(
    policy: &str,
    stream: &'static str,
    out: &CappedOutput,
    records: &mut Records,
) -> (Vec<String>, usize) {
    let (lines, dropped) = out.take();
    for line in &lines {
        if records.admit(policy) {
            let line = crate::text::clean(line, MAX_LOG_LINE_BYTES);
            tracing::info!(policy, stream, "{line}");
        }
    }
    (lines, dropped)
}
