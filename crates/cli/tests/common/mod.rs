//! What the CLI's process-level tests share: `kvlab serve` processes on free ports.

// Test code may unwrap: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, dead_code)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `kvlab serve` process on a free port, killed on drop.
pub struct Server {
    child: Child,
    pub base: String,
}

impl Server {
    /// `kvlab serve -m <model> --port 0 <args>`, once it listens.
    pub fn start(model: &str, args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvlab"))
            .args(["serve", "-m", model, "--port", "0", "-t", "1"])
            .args(args)
            .env_remove("KVLAB_REMOTE_TIER")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut seen = String::new();
        let base = loop {
            let Some(Ok(line)) = lines.next() else {
                panic!("kvlab serve {model} {args:?} exited before listening:\n{seen}");
            };
            if let Some(at) = line.find(" at http://") {
                break line[at + 4..].trim().to_string();
            }
            seen.push_str(&line);
            seen.push('\n');
        };
        // Keep draining stderr (warnings), so that the server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Server { child, base }
    }

    /// The greedy completion of `prompt`: its text and the prompt tokens served from cache.
    pub fn complete(&self, prompt: &str) -> (String, u64) {
        self.send(json!({"prompt": prompt, "max_tokens": 16, "temperature": 0}))
    }

    /// [`Self::complete`] with vLLM's `cache_salt`.
    pub fn complete_salted(&self, prompt: &str, salt: &str) -> (String, u64) {
        let body =
            json!({"prompt": prompt, "max_tokens": 16, "temperature": 0, "cache_salt": salt});
        self.send(body)
    }

    pub fn send(&self, body: Value) -> (String, u64) {
        let reply: Value = serde_json::from_str(
            &ureq::post(&format!("{}/v1/completions", self.base))
                .send_string(&body.to_string())
                .unwrap()
                .into_string()
                .unwrap(),
        )
        .unwrap();
        let text = reply["choices"][0]["text"].as_str().unwrap().to_string();
        let cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        (text, cached)
    }

    /// POSTs `body` to `path`: the status and the JSON answer (an error's too).
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let (status, text) = match ureq::post(&url).send_string(&body.to_string()) {
            Ok(r) => (r.status(), r.into_string().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
            Err(e) => panic!("POST {url}: {e}"),
        };
        (status, serde_json::from_str(&text).unwrap())
    }

    /// The value of the metric line starting with `name{labels` (summed over the rest).
    pub fn metric(&self, prefix: &str) -> f64 {
        let text = ureq::get(&format!("{}/metrics", self.base))
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
