//! What ran the benchmark: CPU, cores, SIMD level, caches, memory, GPU, toolchain and commit.
//! Recorded with every run, because absolute numbers mean nothing without it.

use std::process::Command;

use serde::{Deserialize, Serialize};
use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};

/// The machine and software of one run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Machine {
    /// The CPU's brand (sysinfo: /proc/cpuinfo's "model name" on Linux).
    pub cpu_model: String,
    /// Logical CPUs this process may use (std::thread::available_parallelism).
    pub logical_cpus: usize,
    /// SIMD-related CPU flags present (of avx, avx2, fma, avx512f, avx512bw, avx512vl, ...).
    pub cpu_features: Vec<String>,
    /// The level kvlab-cpu's dot/axpy dispatch chose ("avx512f", "avx2+fma", "scalar").
    pub kvlab_simd: String,
    /// Last-level cache size in bytes (sysfs), when known.
    pub llc_bytes: Option<u64>,
    /// Total memory (sysinfo: MemTotal of /proc/meminfo on Linux), bytes.
    pub mem_total_bytes: Option<u64>,
    /// 1-, 5- and 15-minute load averages when the run started: above the core count means the
    /// machine was shared and timings are noisier.
    pub loadavg_start: Option<[f64; 3]>,
    /// `nvidia-smi` name and driver of each GPU; empty without one.
    pub gpus: Vec<String>,
    /// Kernel name and release, as `uname -sr` prints them (sysinfo).
    pub os: String,
    /// `rustc -V` at run time.
    pub rustc: String,
    /// `git rev-parse HEAD`, with "+dirty" when the work tree has changes.
    pub git_commit: String,
    /// Start of the run, UTC, RFC 3339 (from `date -u`).
    pub date_utc: String,
    /// The machine's host name.
    pub hostname: String,
}

const FLAGS: &[&str] = &[
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
];

/// Collects everything that can be found; missing pieces are left empty, never an error.
pub fn detect() -> Machine {
    let mut sys = System::new_with_specifics(
        RefreshKind::nothing()
            .with_cpu(CpuRefreshKind::nothing())
            .with_memory(MemoryRefreshKind::nothing().with_ram()),
    );
    sys.refresh_memory();
    // sysinfo has no CPU flags: they come from /proc/cpuinfo.
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let have: Vec<&str> = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .and_then(|l| l.split_once(':'))
        .map_or(Vec::new(), |(_, f)| f.split_whitespace().collect());
    let dirty = cmd("git", &["status", "--porcelain"]).is_some_and(|s| !s.is_empty());
    Machine {
        cpu_model: sys
            .cpus()
            .first()
            .map(|c| c.brand().trim().to_string())
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| std::env::consts::ARCH.to_string()),
        logical_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_features: FLAGS
            .iter()
            .filter(|x| have.contains(x))
            .map(|x| x.to_string())
            .collect(),
        kvlab_simd: kvlab_cpu::simd::isa().name().to_string(),
        llc_bytes: llc_bytes(),
        mem_total_bytes: Some(sys.total_memory()).filter(|&m| m > 0),
        loadavg_start: loadavg(),
        gpus: cmd(
            "nvidia-smi",
            &[
                "--query-gpu=name,driver_version,memory.total",
                "--format=csv,noheader",
            ],
        )
        .map(|s| s.lines().map(str::to_string).collect())
        .unwrap_or_default(),
        os: System::kernel_long_version(),
        rustc: cmd("rustc", &["-V"]).unwrap_or_default(),
        git_commit: cmd("git", &["rev-parse", "HEAD"])
            .map(|c| if dirty { format!("{c}+dirty") } else { c })
            .unwrap_or_default(),
        date_utc: cmd("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]).unwrap_or_default(),
        hostname: System::host_name().unwrap_or_default(),
    }
}

/// A command's trimmed stdout, or `None` if it fails or is absent.
fn cmd(program: &str, args: &[&str]) -> Option<String> {
    cmd_in(&crate::paths::workspace_root(), program, args)
}

/// `program args` run in `dir`: its standard output, trimmed; `None` when it cannot start or
/// fails.
pub fn cmd_in(dir: &std::path::Path, program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The largest cache of cpu0 (sysfs "index*/size", e.g. "32768K").
fn llc_bytes() -> Option<u64> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|e| {
        let s = std::fs::read_to_string(e.ok()?.path().join("size")).ok()?;
        let s = s.trim();
        let (num, mult) = match s.strip_suffix('K') {
            Some(n) => (n, 1024),
            None => match s.strip_suffix('M') {
                Some(n) => (n, 1024 * 1024),
                None => (s, 1),
            },
        };
        num.parse::<u64>().ok().map(|n| n * mult)
    })
    .max()
}

/// The 1-, 5- and 15-minute load averages (Unix only).
fn loadavg() -> Option<[f64; 3]> {
    let l = System::load_average();
    cfg!(unix).then_some([l.one, l.five, l.fifteen])
}

/// A memory field of this process's /proc/self/status, bytes: "VmRSS:" (resident now) or
/// "VmHWM:" (the peak); `None` off Linux.
pub fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The 1-minute load average now.
pub fn load_now() -> Option<f64> {
    loadavg().map(|l| l[0])
}

/// The machine as serve.json, tiers.json and eviction.json name it: CPU, logical CPUs, load at
/// the start, date, and the commit measured (so the book can say what a record measured; see
/// `book/records.rs`).
pub fn line(m: &Machine) -> String {
    format!(
        "{} ({} logical CPUs), load {:.1} at the start, {}, commit {}",
        m.cpu_model,
        m.logical_cpus,
        m.loadavg_start.map_or(0.0, |l| l[0]),
        m.date_utc,
        m.git_commit.get(..12).unwrap_or(&m.git_commit)
    )
}
