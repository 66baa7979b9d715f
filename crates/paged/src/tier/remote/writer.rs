//! The remote tier's writes, off the engine thread: each step's new blocks go to a thread of
//! their own over a bounded queue, and that thread sends them to Redis (`SET … NX`, one
//! pipeline per step) on a connection of its own. A slow or absent Redis then costs the steps
//! nothing: when the queue is full, a step's writes are dropped and counted, never waited for.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::thread::JoinHandle;

use super::conn::Conn;

/// Steps' worth of writes that may wait for the writer thread.
const QUEUE_STEPS: usize = 16;

/// One block to write: its key, its sealed value and its payload's length.
pub(super) struct Write {
    pub(super) key: String,
    pub(super) value: Vec<u8>,
    pub(super) payload: usize,
}

/// What the writer thread did, shared with the tier's stats.
#[derive(Default)]
pub(super) struct WriteCounts {
    pub(super) blocks: AtomicU64,
    pub(super) bytes: AtomicU64,
    /// Blocks never sent: the queue was full.
    pub(super) dropped: AtomicU64,
}

/// The handle of the writer thread; dropping it lets the thread send what is queued and end.
pub(super) struct Writer {
    tx: Option<SyncSender<Vec<Write>>>,
    thread: Option<JoinHandle<()>>,
    pub(super) counts: Arc<WriteCounts>,
}

impl Writer {
    /// Starts the thread; its writes expire after `ttl_secs` (`None`: never).
    pub(super) fn start(mut conn: Conn, ttl_secs: Option<u64>) -> Writer {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Write>>(QUEUE_STEPS);
        let counts = Arc::new(WriteCounts::default());
        let c = counts.clone();
        let thread = std::thread::Builder::new()
            .name("kvlab-remote-tier-writer".into())
            .spawn(move || {
                for batch in rx {
                    let mut pipe = redis::pipe();
                    for w in &batch {
                        let mut cmd = redis::cmd("SET");
                        cmd.arg(&w.key).arg(&w.value).arg("NX");
                        if let Some(ttl) = ttl_secs {
                            cmd.arg("EX").arg(ttl);
                        }
                        pipe.add_command(cmd);
                    }
                    let Some(connection) = conn.get() else {
                        continue;
                    };
                    let replies: redis::RedisResult<Vec<Option<String>>> = pipe.query(connection);
                    match replies {
                        Ok(replies) => {
                            for (w, reply) in batch.iter().zip(replies) {
                                if reply.is_some() {
                                    c.blocks.fetch_add(1, Ordering::Relaxed);
                                    c.bytes.fetch_add(w.payload as u64, Ordering::Relaxed);
                                }
                            }
                        }
                        Err(e) => conn.failed(&e),
                    }
                }
            })
            .ok();
        Writer {
            tx: thread.as_ref().map(|_| tx),
            thread,
            counts,
        }
    }

    /// Queues one step's writes; drops them (counted) when the queue is full or the thread
    /// could not start.
    pub(super) fn send(&self, batch: Vec<Write>) {
        let n = batch.len() as u64;
        let sent = match &self.tx {
            Some(tx) => match tx.try_send(batch) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
            },
            None => false,
        };
        if !sent {
            self.counts.dropped.fetch_add(n, Ordering::Relaxed);
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
