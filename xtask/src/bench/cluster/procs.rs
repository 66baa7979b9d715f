//! The cluster bench's two real services, each a process of its own on a free loopback port,
//! killed when dropped: Debian's `redis-server` (the remote tier) and HAProxy (the load balancer
//! in front of the `kvlab serve` instances).

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How requests are spread over the instances.
#[derive(Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    /// Each request to the next instance in turn (HAProxy's `balance roundrobin`).
    RoundRobin,
    /// Every request of a session to the same instance: a consistent hash of its
    /// `X-Session-Id` header (`balance hdr(X-Session-Id)`, `hash-type consistent`).
    Affinity,
}

impl Routing {
    pub fn name(self) -> &'static str {
        match self {
            Routing::RoundRobin => "round robin",
            Routing::Affinity => "session affinity",
        }
    }

    fn balance(self) -> &'static str {
        match self {
            Routing::RoundRobin => "balance roundrobin",
            Routing::Affinity => "balance hdr(X-Session-Id)\n    hash-type consistent",
        }
    }
}

/// A port nothing listens on now.
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until something listens on `port`.
fn wait_listening(port: u16, what: &str, child: &mut Child) -> Result<()> {
    let t = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited ({status}) before listening on port {port}");
        }
        if t.elapsed() > Duration::from_secs(20) {
            bail!("{what} did not listen on port {port} within 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// `what` is on PATH, or an error naming the Debian package that has it.
pub fn require(what: &str, package: &str) -> Result<()> {
    let found = Command::new(what)
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        bail!(
            "{what} is not installed; the cluster bench runs the real one: apt-get install {package}"
        );
    }
    Ok(())
}

/// A fresh `redis-server` without persistence.
pub struct Redis {
    _process: Process,
    pub url: String,
}

impl Redis {
    pub fn start() -> Result<Redis> {
        let port = free_port()?;
        let mut child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .context("starting redis-server (apt-get install redis-server)")?;
        wait_listening(port, "redis-server", &mut child)?;
        Ok(Redis {
            _process: Process(child),
            url: format!("redis://127.0.0.1:{port}"),
        })
    }
}

/// HAProxy in HTTP mode in front of `backends` (`http://HOST:PORT` each), routing by `routing`.
pub struct Haproxy {
    _process: Process,
    pub base: String,
    _config: tempfile::NamedTempFile,
}

impl Haproxy {
    pub fn start(backends: &[String], routing: Routing) -> Result<Haproxy> {
        let port = free_port()?;
        let servers: String = backends
            .iter()
            .enumerate()
            .map(|(i, b)| format!("    server s{i} {}\n", b.trim_start_matches("http://")))
            .collect();
        // Long client and server timeouts: a request waits in a server's queue under load.
        let config = format!(
            "global\n    maxconn 4096\n\ndefaults\n    mode http\n    timeout connect 5s\n    timeout client 600s\n    timeout server 600s\n\nfrontend kvlab\n    bind 127.0.0.1:{port}\n    default_backend instances\n\nbackend instances\n    {}\n{servers}",
            routing.balance()
        );
        let mut file = tempfile::Builder::new()
            .prefix("kvlab-haproxy-")
            .suffix(".cfg")
            .tempfile()?;
        std::io::Write::write_all(&mut file, config.as_bytes())?;
        let mut child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(file.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting haproxy (apt-get install haproxy)")?;
        wait_listening(port, "haproxy", &mut child)?;
        Ok(Haproxy {
            _process: Process(child),
            base: format!("http://127.0.0.1:{port}"),
            _config: file,
        })
    }
}

/// A child process, killed (and reaped) when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
