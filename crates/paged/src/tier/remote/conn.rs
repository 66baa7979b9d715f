//! One connection to the remote tier's Redis, made lazily, with timeouts, and what a failure
//! does: a failed connection (refused, timed out, dropped) turns it off for [`RETRY_AFTER`],
//! logged once per outage; an error reply (Redis full under `noeviction`, a command an ACL
//! refuses) is logged once and the connection kept.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(250);
/// How long one command may wait for its reply or to send.
const IO_TIMEOUT: Duration = Duration::from_millis(500);
/// How long the tier stays off after a failed connection before it tries the store again.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// A lazily made connection and its failures.
pub(super) struct Conn {
    client: redis::Client,
    conn: Option<redis::Connection>,
    /// When the store may be tried again after a failed connection (`None`: it is up).
    down_until: Option<Instant>,
    /// Whether an error reply was logged already.
    warned_reply: bool,
    /// The URL without its password, for the log.
    shown: String,
    /// Commands that failed, shared with whoever reports them.
    pub(super) errors: Arc<AtomicU64>,
}

impl Conn {
    pub(super) fn new(client: redis::Client, shown: String, errors: Arc<AtomicU64>) -> Conn {
        Conn {
            client,
            conn: None,
            down_until: None,
            warned_reply: false,
            shown,
            errors,
        }
    }

    /// Whether the store is believed up.
    pub(super) fn up(&self) -> bool {
        self.down_until.is_none()
    }

    /// The connection, if the store may be tried now (connecting if needed).
    pub(super) fn get(&mut self) -> Option<&mut redis::Connection> {
        if let Some(t) = self.down_until {
            if Instant::now() < t {
                return None;
            }
            self.down_until = None;
        }
        if self.conn.is_none() {
            let conn = self
                .client
                .get_connection_with_timeout(CONNECT_TIMEOUT)
                .and_then(|c| {
                    c.set_read_timeout(Some(IO_TIMEOUT))?;
                    c.set_write_timeout(Some(IO_TIMEOUT))?;
                    Ok(c)
                });
            match conn {
                Ok(c) => self.conn = Some(c),
                Err(e) => {
                    self.failed(&e);
                    return None;
                }
            }
        }
        self.conn.as_mut()
    }

    /// A command failed: counted and logged, and for a failed connection the store left alone
    /// for [`RETRY_AFTER`].
    pub(super) fn failed(&mut self, e: &redis::RedisError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let connection = e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal();
        if !connection {
            if !self.warned_reply {
                self.warned_reply = true;
                tracing::warn!(
                    "remote KV tier {}: {e}; carrying on without what failed (counted in kvlab:kv_tier_errors_total)",
                    self.shown
                );
            }
            return;
        }
        self.conn = None;
        if self.down_until.is_none() {
            tracing::warn!(
                "remote KV tier {}: {e}; recomputing instead of restoring, retrying in {:?}",
                self.shown,
                RETRY_AFTER
            );
        }
        self.down_until = Some(Instant::now() + RETRY_AFTER);
    }
}
