//! Compiling a policy under limits.
//!
//! A policy file is refused above [`CompileLimits::max_policy_bytes`]
//! before anything reads it as WebAssembly. Compiling is native code
//! generation whose cost a hostile file controls (thousands of functions,
//! hundreds of nested loops): with a worker command configured (the
//! operator and `nmo policy` use the `nmo` binary itself), it runs in a
//! child process with an address-space limit and a limit on its CPU time
//! (with a wall-clock backstop at six times that), and is killed when it
//! exceeds either. The child hands back the compiled
//! artifact on its stdout; nothing it compiled runs in the child.
//!
//! Without a worker (library users, unit tests) the compile runs in the
//! calling thread with only the size limit.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use wasmtime::{Config, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::error::Error;

/// Limits on loading one policy.
#[derive(Debug, Clone)]
pub struct CompileLimits {
    /// Largest policy file, in bytes (a ConfigMap holds at most 1 MiB).
    pub max_policy_bytes: usize,
    /// Most CPU time a compile may use, when run by a worker (it is
    /// stopped at six times this in wall-clock time too).
    pub timeout: Duration,
    /// Address space the worker may use, in bytes.
    pub max_memory_bytes: u64,
    /// The command that runs `nmo policy compile-worker` (program, then
    /// arguments); `None`: compile in this process.
    pub worker: Option<Vec<OsString>>,
}

impl Default for CompileLimits {
    fn default() -> Self {
        CompileLimits {
            max_policy_bytes: 1 << 20,
            timeout: Duration::from_secs(10),
            max_memory_bytes: 384 << 20,
            worker: None,
        }
    }
}

impl CompileLimits {
    /// These limits with the running `nmo` binary as the compile worker.
    pub fn with_worker_exe(mut self, exe: std::path::PathBuf) -> Self {
        self.worker = Some(vec![
            exe.into_os_string(),
            "policy".into(),
            "compile-worker".into(),
        ]);
        self
    }
}

/// Largest artifact read back from a worker.
const MAX_ARTIFACT_BYTES: usize = 256 << 20;

/// Refuses a file over the size limit.
pub(crate) fn check_size(name: &str, wasm: &[u8], limits: &CompileLimits) -> Result<(), Error> {
    if wasm.len() > limits.max_policy_bytes {
        return Err(Error::CompileLimit {
            policy: name.to_owned(),
            reason: format!(
                "the file is {} bytes, more than the {} a policy may have",
                wasm.len(),
                limits.max_policy_bytes
            ),
        });
    }
    Ok(())
}

/// Compiles `wasm` in a worker process and returns the serialized
/// artifact.
pub(crate) fn in_worker(
    name: &str,
    wasm: &[u8],
    limits: &CompileLimits,
    worker: &[OsString],
) -> Result<Vec<u8>, Error> {
    let limit = |reason: String| Error::CompileLimit {
        policy: name.to_owned(),
        reason,
    };
    let load = |reason: String| Error::Load {
        policy: name.to_owned(),
        reason,
    };
    let (program, args) = worker
        .split_first()
        .ok_or_else(|| load("the compile worker command is empty".into()))?;
    let mut child = Command::new(program)
        .args(args)
        .arg("--max-memory-bytes")
        .arg(limits.max_memory_bytes.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| load(format!("cannot start the compile worker: {e}")))?;
    let mut stdin = child.stdin.take();
    let input = wasm.to_vec();
    let writer = std::thread::spawn(move || {
        if let Some(s) = stdin.as_mut() {
            let _ = s.write_all(&input);
        }
    });
    let stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(s) = stdout {
            let _ = s.take(MAX_ARTIFACT_BYTES as u64 + 1).read_to_end(&mut out);
        }
        out
    });
    let stderr = child.stderr.take();
    let err_reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(s) = stderr {
            let _ = s.take(64 << 10).read_to_end(&mut out);
        }
        String::from_utf8_lossy(&out).into_owned()
    });
    let started = Instant::now();
    let pid = child.id();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            // The limit is on the work, the worker's CPU time: a compile
            // starved of CPU by a busy node (two replicas compiling at
            // once beside other pods) is not a hostile policy. The wall
            // clock, at six times the limit, only stops a worker that
            // is stuck.
            Ok(None)
                if cpu_time(pid) >= limits.timeout
                    || started.elapsed() >= limits.timeout.saturating_mul(WALL_FACTOR) =>
            {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                let _ = child.kill();
                return Err(load(format!("waiting for the compile worker: {e}")));
            }
        }
    };
    let _ = writer.join();
    let artifact = reader.join().unwrap_or_default();
    let message = err_reader.join().unwrap_or_default();
    let message = crate::text::clean(message.trim(), 1024);
    let Some(status) = status else {
        return Err(limit(format!(
            "compiling took longer than {:?} of CPU time (or {:?} in all) and was stopped",
            limits.timeout,
            limits.timeout.saturating_mul(WALL_FACTOR)
        )));
    };
    if status.success() && artifact.len() <= MAX_ARTIFACT_BYTES {
        return Ok(artifact);
    }
    if status.code() == Some(EXIT_INVALID) {
        return Err(load(message));
    }
    if status.code() == Some(EXIT_USAGE) {
        return Err(load(format!(
            "the compile worker refused its input: {message}"
        )));
    }
    Err(limit(format!(
        "compiling needed more than the {} MiB it may use and was stopped ({status}{})",
        limits.max_memory_bytes >> 20,
        if message.is_empty() {
            String::new()
        } else {
            format!(": {message}")
        }
    )))
}

/// How many times the CPU-time limit a worker may take in wall-clock time.
const WALL_FACTOR: u32 = 6;

/// CPU time (user and system) process `pid` has used so far; zero when it
/// cannot be read (the wall clock then decides).
fn cpu_time(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // The fields after the command name, which may hold spaces and ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime: fields 14 and 15 of the line, 12 and 13 here.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf only reads its argument.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    match u64::try_from(per_second) {
        Ok(hz) if hz > 0 => Duration::from_millis(ticks.saturating_mul(1000) / hz),
        _ => Duration::ZERO,
    }
}

/// Worker exit code: the input is not a policy that compiles.
pub(crate) const EXIT_INVALID: i32 = 3;
/// Worker exit code: bad arguments, or no way to write the answer.
pub(crate) const EXIT_USAGE: i32 = 4;
/// Worker exit code: memory ran out (an allocation that could fail did;
/// one that cannot fail aborts the worker, which reads the same).
pub(crate) const EXIT_OUT_OF_MEMORY: i32 = 5;

/// The worker's side: limits its own address space, reads a policy from
/// stdin, compiles it with an engine configured as the parent's and writes
/// the artifact to stdout. Returns the process exit code. The engine's
/// compile settings are [`wasm_config`]'s, the
/// parent's own; the instance allocator, which differs, does not enter the
/// artifact.
pub fn worker_main(max_memory_bytes: u64) -> i32 {
    if let Err(e) = limit_address_space(max_memory_bytes) {
        eprintln!("cannot limit the compile worker's memory: {e}");
        return EXIT_USAGE;
    }
    let mut wasm = Vec::new();
    if let Err(e) = std::io::stdin()
        .take(super::compile::CompileLimits::default().max_policy_bytes as u64 * 16)
        .read_to_end(&mut wasm)
    {
        eprintln!("reading the policy: {e}");
        return if e.kind() == std::io::ErrorKind::OutOfMemory {
            EXIT_OUT_OF_MEMORY
        } else {
            EXIT_USAGE
        };
    }
    let config = wasm_config(None);
    let engine = match wasmtime::Engine::new(&config) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("setting up the compiler: {e:#}");
            return EXIT_OUT_OF_MEMORY;
        }
    };
    match engine.precompile_component(&wasm) {
        Ok(artifact) => match std::io::stdout().write_all(&artifact) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("writing the artifact: {e}");
                EXIT_USAGE
            }
        },
        Err(e) => {
            eprintln!("{e:#}");
            EXIT_INVALID
        }
    }
}

/// Sets this process's address-space limit (RLIMIT_AS).
fn limit_address_space(bytes: u64) -> std::io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    // SAFETY: setrlimit only reads the struct we pass, which lives for the
    // call.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The wasmtime configuration policies are compiled and run with. The
/// compile worker builds the same one (without the pool), so its artifacts
/// load here.
pub(crate) fn wasm_config(pool: Option<PoolingAllocationConfig>) -> Config {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        .cranelift_opt_level(wasmtime::OptLevel::Speed)
        // A policy has no business recursing deeply; a small stack makes
        // runaway recursion a quick trap.
        .max_wasm_stack(1 << 20)
        .async_stack_size(2 << 20);
    if let Some(pool) = pool {
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}
