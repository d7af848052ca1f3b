//! The wasmtime sandbox: one engine, policies compiled once, a fresh store
//! per decision.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Instance, Linker, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter, Store,
    Trap,
};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::bindings::{DrainPolicy, DrainPolicyImports, DrainPolicyPre};
use super::output::CappedOutput;
use super::types::{self, DrainPlan, Failure, Level, Maintenance, Node, Pod};
use super::validate::{self, Plan, Verdict};
use super::view::{NodeView, PodView};
use super::{DEFAULT_POLICY_NAME, DEFAULT_POLICY_WASM, WORLD};
use crate::error::{Error, Result};

/// Lines a policy may log through the `log` import in one call.
pub const MAX_LOG_LINES: u32 = 64;
/// Bytes kept of one `log` line.
pub const MAX_LOG_LINE_BYTES: usize = 1024;

/// Sandbox limits, the same for every policy of an engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Wall-clock time one decision (instantiate + call) may take.
    pub deadline: Duration,
    /// Linear memory one decision may use, in bytes.
    pub memory_limit_bytes: usize,
    /// How often the epoch ticker advances: the deadline's resolution.
    pub epoch_tick: Duration,
    /// Decisions run at once; more callers wait for a slot. Each slot is a
    /// pre-allocated, reused sandbox (wasmtime's pooling allocator), which
    /// keeps a fresh store per decision cheap.
    pub max_concurrent_calls: u32,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            deadline: Duration::from_millis(500),
            memory_limit_bytes: 64 << 20,
            epoch_tick: Duration::from_millis(1),
            max_concurrent_calls: 16,
        }
    }
}

impl EngineConfig {
    fn deadline_ticks(&self) -> u64 {
        let tick = self.epoch_tick.as_nanos().max(1);
        (self.deadline.as_nanos().div_ceil(tick) as u64).max(1)
    }
}

/// The engine every policy runs on. Cheap to clone.
#[derive(Clone)]
pub struct PolicyEngine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    engine: Engine,
    linker: Linker<HostState>,
    config: EngineConfig,
    ticker_stop: Arc<AtomicBool>,
    slots: Slots,
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
        self.ticker_stop.store(true, Ordering::Relaxed);
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
    /// Sets up the engine, the linker and the epoch ticker.
    pub fn new(config: EngineConfig) -> Result<Self> {
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
            .max_memory_size(config.memory_limit_bytes)
            // Reused slots are reset by zeroing this much instead of giving
            // the pages back to the kernel and faulting them in again.
            .linear_memory_keep_resident(32 << 20)
            .table_keep_resident(64 << 10);
        let mut wasm_config = Config::new();
        wasm_config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .cranelift_opt_level(wasmtime::OptLevel::Speed)
            // A policy has no business recursing deeply; a small stack makes
            // runaway recursion a quick trap.
            .max_wasm_stack(1 << 20)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&wasm_config).map_err(|e| Error::Engine(format!("{e:#}")))?;

        let mut linker = Linker::<HostState>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| Error::Engine(format!("linking WASI: {e:#}")))?;
        DrainPolicy::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| Error::Engine(format!("linking the host imports: {e:#}")))?;

        let ticker_stop = Arc::new(AtomicBool::new(false));
        {
            let engine = engine.clone();
            let stop = ticker_stop.clone();
            let tick = config.epoch_tick;
            std::thread::Builder::new()
                .name("nmo-policy-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(tick);
                        engine.increment_epoch();
                    }
                })
                .map_err(|e| Error::Engine(format!("starting the epoch ticker: {e}")))?;
        }

        Ok(PolicyEngine {
            inner: Arc::new(EngineInner {
                engine,
                linker,
                slots: Slots {
                    free: Mutex::new(config.max_concurrent_calls),
                    freed: Condvar::new(),
                },
                config,
                ticker_stop,
            }),
        })
    }

    /// The limits this engine runs policies with.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Compiles and links a policy. `name` is what logs, metrics and errors
    /// call it (usually the file name).
    pub fn load(&self, name: &str, wasm: &[u8]) -> Result<Policy> {
        self.load_cached(name, wasm, None)
    }

    /// [`PolicyEngine::load`], keeping the compiled artifact in `cache_dir`
    /// (when given) so the next start does not compile again. Artifacts are
    /// keyed by the engine's compatibility hash and the module's SHA-256,
    /// and checked against a checksum before use; a missing, stale or
    /// damaged artifact is compiled again and rewritten, never trusted.
    pub fn load_cached(&self, name: &str, wasm: &[u8], cache_dir: Option<&Path>) -> Result<Policy> {
        check_header(name, wasm)?;
        let digest = hex_digest(wasm);
        let cache = cache_dir.map(|dir| ArtifactCache::new(dir, self.compat_hash(), &digest));
        let component = match cache.as_ref().and_then(|c| c.read(&self.inner.engine)) {
            Some(component) => component,
            None => {
                let component =
                    Component::new(&self.inner.engine, wasm).map_err(|e| Error::PolicyLoad {
                        policy: name.to_owned(),
                        reason: format!("{e:#}"),
                    })?;
                if let Some(cache) = &cache {
                    cache.write(name, &component);
                }
                component
            }
        };
        let wrong_world = |e: wasmtime::Error| Error::PolicyWrongWorld {
            policy: name.to_owned(),
            reason: format!("{e:#}"),
        };
        let instance_pre = self
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(wrong_world)?;
        let pre = DrainPolicyPre::new(instance_pre).map_err(wrong_world)?;
        Ok(Policy {
            inner: Arc::new(PolicyInner {
                name: name.to_owned(),
                digest,
                pre,
                engine: self.clone(),
            }),
        })
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

    /// Reads and loads a policy file.
    pub fn load_file(&self, path: &Path) -> Result<Policy> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        let wasm = std::fs::read(path).map_err(|e| Error::PolicyLoad {
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

/// Compiled policies on disk: `<compat>-<sha256>.cwasm` and, beside it, the
/// artifact's own SHA-256 in `.cwasm.sha256`, written last, so a write cut
/// short by a crash is never loaded.
struct ArtifactCache {
    artifact: PathBuf,
    checksum: PathBuf,
}

impl ArtifactCache {
    fn new(dir: &Path, compat: String, digest: &str) -> Self {
        let base = format!("{compat}-{digest}.cwasm");
        ArtifactCache {
            artifact: dir.join(&base),
            checksum: dir.join(format!("{base}.sha256")),
        }
    }

    fn read(&self, engine: &Engine) -> Option<Component> {
        let want = std::fs::read_to_string(&self.checksum).ok()?;
        let bytes = std::fs::read(&self.artifact).ok()?;
        if hex_digest(&bytes) != want.trim() {
            tracing::warn!(artifact = %self.artifact.display(), "cached policy artifact is damaged; compiling again");
            return None;
        }
        // SAFETY: the bytes are an artifact this program serialised with an
        // engine of the same compatibility hash (part of the file name),
        // unchanged since (checked against the checksum written after it).
        // wasmtime also checks the artifact's version and settings.
        match unsafe { Component::deserialize(engine, &bytes) } {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(artifact = %self.artifact.display(), error = %e, "cached policy artifact unusable; compiling again");
                None
            }
        }
    }

    /// Best effort: a cache that cannot be written costs a compile, nothing
    /// else.
    fn write(&self, name: &str, component: &Component) {
        let result = (|| -> std::io::Result<()> {
            let bytes = component
                .serialize()
                .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
            if let Some(dir) = self.artifact.parent() {
                std::fs::create_dir_all(dir)?;
            }
            write_atomic(&self.artifact, &bytes)?;
            write_atomic(&self.checksum, hex_digest(&bytes).as_bytes())
        })();
        if let Err(e) = result {
            tracing::warn!(policy = name, artifact = %self.artifact.display(), error = %e, "cannot cache the compiled policy");
        }
    }
}

/// Writes a file through a temporary name and a rename.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Tells a non-WebAssembly file and a core module apart from a component
/// before handing the bytes to the compiler, for a clearer message.
fn check_header(name: &str, wasm: &[u8]) -> Result<()> {
    const MAGIC: &[u8] = b"\0asm";
    if wasm.len() < 8 || &wasm[..4] != MAGIC {
        return Err(Error::PolicyLoad {
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
        return Err(Error::PolicyWrongWorld {
            policy: name.to_owned(),
            reason: format!(
                "this is a core WebAssembly module, not a component of {WORLD}; build the policy \
                 for the wasm32-wasip2 target"
            ),
        });
    }
    Ok(())
}

fn hex_digest(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Bytes as lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A loaded policy. Cheap to clone; safe to call from many threads at once
/// (each call gets its own store).
///
/// A decision is blocking CPU work (up to the deadline): from async code,
/// call it on the blocking pool (`tokio::task::spawn_blocking`), never
/// directly on an async worker thread, where WASI's synchronous output
/// streams (a policy's `println!`, a panic message) cannot run.
#[derive(Clone)]
pub struct Policy {
    inner: Arc<PolicyInner>,
}

struct PolicyInner {
    name: String,
    digest: String,
    pre: DrainPolicyPre<HostState>,
    engine: PolicyEngine,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.inner.name)
            .field("digest", &self.inner.digest)
            .finish_non_exhaustive()
    }
}

impl Policy {
    /// The policy's name (file name, or `default`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The SHA-256 of the policy's bytes, in hex.
    pub fn digest(&self) -> &str {
        &self.inner.digest
    }

    /// Asks the policy how to drain `node`, and validates the answer against
    /// `pods` (see [`validate::plan`]).
    pub fn plan_drain(&self, maintenance: &Maintenance, node: &Node, pods: &[Pod]) -> Result<Plan> {
        let views: Vec<PodView<'_>> = pods.iter().map(PodView::from).collect();
        self.plan_drain_views(maintenance, &NodeView::from(node), &views)
    }

    /// [`Policy::plan_drain`] on Kubernetes objects, without building owned
    /// records first.
    pub fn plan_drain_k8s(
        &self,
        maintenance: &Maintenance,
        node: &k8s_openapi::api::core::v1::Node,
        pods: &[k8s_openapi::api::core::v1::Pod],
    ) -> Result<Plan> {
        let views: Vec<PodView<'_>> = pods.iter().map(PodView::from).collect();
        self.plan_drain_views(maintenance, &NodeView::from(node), &views)
    }

    /// [`Policy::plan_drain`] on borrowed views.
    pub fn plan_drain_views(
        &self,
        maintenance: &Maintenance,
        node: &NodeView<'_>,
        pods: &[PodView<'_>],
    ) -> Result<Plan> {
        const FUNCTION: &str = "plan-drain";
        let started = std::time::Instant::now();
        let result = self
            .call(FUNCTION, |instance, store| {
                let f = instance
                    .get_typed_func::<(&Maintenance, &NodeView<'_>, &[PodView<'_>]), (DrainPlan,)>(
                        &mut *store,
                        FUNCTION,
                    )?;
                Ok(f.call(&mut *store, (maintenance, node, pods))?.0)
            })
            .and_then(|raw| validate::plan(&self.inner.name, pods, raw));
        observe(FUNCTION, started, &result);
        result
    }

    /// Asks the policy what to do after `failure`, and validates the answer.
    pub fn on_failure(&self, maintenance: &Maintenance, failure: &Failure) -> Result<Verdict> {
        const FUNCTION: &str = "on-failure";
        let started = std::time::Instant::now();
        let result = self
            .call(FUNCTION, |instance, store| {
                let f = instance.get_typed_func::<(&Maintenance, &Failure), (types::Verdict,)>(
                    &mut *store,
                    FUNCTION,
                )?;
                Ok(f.call(&mut *store, (maintenance, failure))?.0)
            })
            .and_then(|raw| validate::verdict(&self.inner.name, raw));
        observe(FUNCTION, started, &result);
        result
    }

    /// Instantiates the policy into a fresh store and runs `f` under the
    /// engine's limits, turning every way a guest can fail into a typed
    /// error.
    fn call<R>(
        &self,
        function: &'static str,
        f: impl FnOnce(&Instance, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R> {
        let engine = &self.inner.engine.inner;
        let _slot = engine.slots.acquire();
        let stdout = CappedOutput::default();
        let stderr = CappedOutput::default();
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let state = HostState {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryLimiter {
                limit: engine.config.memory_limit_bytes,
                hit: false,
            },
            policy: self.inner.name.clone(),
            log_lines: 0,
        };
        let mut store = Store::new(&engine.engine, state);
        store.limiter(|s| &mut s.limiter);
        store.set_epoch_deadline(engine.config.deadline_ticks());
        store.epoch_deadline_trap();

        let result = self
            .inner
            .pre
            .instance_pre()
            .instantiate(&mut store)
            .and_then(|instance| f(&instance, &mut store));

        forward_output(&self.inner.name, "stdout", &stdout);
        let err_lines = forward_output(&self.inner.name, "stderr", &stderr);

        result.map_err(|e| {
            let policy = self.inner.name.clone();
            if store.data().limiter.hit {
                Error::PolicyMemoryLimit {
                    policy,
                    function,
                    limit_bytes: engine.config.memory_limit_bytes,
                }
            } else if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
                Error::PolicyDeadline {
                    policy,
                    function,
                    deadline: engine.config.deadline,
                }
            } else {
                // A Rust guest's panic message goes to stderr: it says more
                // than "wasm trap: unreachable" alone.
                let mut reason = root_message(&e);
                if let Some(at) = err_lines.iter().rposition(|l| l.contains("panicked")) {
                    let panic = err_lines[at..].iter().take(3).map(String::as_str);
                    let panic = panic.collect::<Vec<_>>().join(" ");
                    reason = format!("{reason} ({})", truncate(&panic, MAX_LOG_LINE_BYTES));
                }
                Error::PolicyTrap {
                    policy,
                    function,
                    reason,
                }
            }
        })
    }
}

/// Records a decision's latency, and its error category if it failed.
fn observe<T>(function: &'static str, started: std::time::Instant, result: &Result<T>) {
    let m = &crate::metrics::METRICS;
    m.policy_latency
        .with_label_values(&[function])
        .observe(started.elapsed().as_secs_f64());
    if let Err(e) = result {
        m.policy_errors.with_label_values(&[e.category()]).inc();
    }
}

/// The innermost message of a wasmtime error (the trap itself, without the
/// backtrace context).
fn root_message(e: &wasmtime::Error) -> String {
    if let Some(trap) = e.downcast_ref::<Trap>() {
        return trap.to_string();
    }
    e.root_cause().to_string()
}

/// Writes what a policy printed to the host's log; returns the lines.
fn forward_output(policy: &str, stream: &'static str, out: &CappedOutput) -> Vec<String> {
    let (lines, dropped) = out.take();
    for line in &lines {
        tracing::info!(policy, stream, "{line}");
    }
    if dropped > 0 {
        tracing::warn!(
            policy,
            stream,
            dropped,
            "policy output over the cap was dropped"
        );
    }
    lines
}

/// The per-decision store state.
struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryLimiter,
    policy: String,
    log_lines: u32,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl types::Host for HostState {}

impl DrainPolicyImports for HostState {
    fn log(&mut self, level: Level, message: String) {
        self.log_lines += 1;
        if self.log_lines > MAX_LOG_LINES {
            if self.log_lines == MAX_LOG_LINES + 1 {
                tracing::warn!(
                    policy = %self.policy,
                    "policy logged more than {MAX_LOG_LINES} lines in one call; the rest are dropped"
                );
            }
            return;
        }
        let msg = truncate(&message, MAX_LOG_LINE_BYTES);
        let policy = self.policy.as_str();
        match level {
            Level::Trace => tracing::trace!(policy, "{msg}"),
            Level::Debug => tracing::debug!(policy, "{msg}"),
            Level::Info => tracing::info!(policy, "{msg}"),
            Level::Warn => tracing::warn!(policy, "{msg}"),
            Level::Error => tracing::error!(policy, "{msg}"),
        }
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Refuses memory growth past the limit and remembers that it did, so the
/// resulting trap is reported as a memory-limit error.
struct MemoryLimiter {
    limit: usize,
    hit: bool,
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }
}
