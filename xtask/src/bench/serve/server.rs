//! A `kvlab serve` process of the load test's own, on a free port, killed when dropped.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

use super::BLOCK_SIZE;
use crate::paths::workspace_root;

/// A running `kvlab serve`, killed when dropped.
pub(in crate::bench) struct Server {
    pub(in crate::bench) child: Child,
    pub(in crate::bench) base: String,
    pub(in crate::bench) banner: String,
}

impl Server {
    /// Starts `kvlab serve` on a free port, with `extra` flags, and reads its address from the
    /// banner on stderr.
    pub(in crate::bench) fn start(
        kvlab: &Path,
        model: &str,
        num_blocks: usize,
        prefix_caching: bool,
        extra: &[String],
    ) -> Result<Server> {
        let mut child = Command::new(kvlab)
            .args(["serve", "-m", model, "--port", "0"])
            .args(["--num-blocks", &num_blocks.to_string()])
            .args(["--block-size", &BLOCK_SIZE.to_string()])
            .args((!prefix_caching).then_some("--no-enable-prefix-caching"))
            .args(extra)
            .current_dir(workspace_root())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {} serve", kvlab.display()))?;
        let stderr = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::<String>::new()));
        let log2 = log.clone();
        // Reads stderr to the end (so the server never blocks on a full pipe), sends the banner.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains(" at http://") {
                    let _ = tx.send(line.clone());
                }
                log2.lock().expect("log").push(line);
            }
        });
        let mut server = Server {
            child,
            base: String::new(),
            banner: String::new(),
        };
        let banner = rx.recv_timeout(Duration::from_secs(300)).map_err(|_| {
            let tail = log.lock().expect("log").join("\n");
            anyhow!("kvlab serve printed no address within 300 s; its stderr:\n{tail}")
        })?;
        let addr = banner
            .rsplit(" at ")
            .next()
            .context("banner without an address")?
            .trim();
        server.base = addr.to_string();
        server.banner = banner.clone();
        Ok(server)
    }
}

impl Server {
    /// Spawns `cmd`, a server that will listen at `base` (its own flags name the port), with its
    /// stderr in `log`; `name` stands for its banner. Health is the client's to wait for.
    pub(in crate::bench) fn spawn(
        mut cmd: Command,
        base: String,
        name: &str,
        log: &Path,
    ) -> Result<Server> {
        let file =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut child = cmd
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        // A server that refuses its flags or its port exits at once: say so, with its log,
        // instead of waiting minutes for its /health.
        std::thread::sleep(Duration::from_millis(300));
        if let Some(status) = child.try_wait()? {
            let log_text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = log_text.lines().rev().take(20).collect();
            bail!(
                "{name} exited at start ({status}); the end of {}:\n{}",
                log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        Ok(Server {
            child,
            base,
            banner: name.to_string(),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
