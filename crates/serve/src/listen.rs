//! Accepting connections: hyper's HTTP/1 server around the router, with the timeouts a slow
//! client needs. (`axum::serve` sets no timer, so a client that sends half its headers and
//! stalls would hold its connection forever.)
//!
//! * Request headers must arrive within [`HEADER_READ_TIMEOUT`] (hyper closes the connection
//!   otherwise); the body within `BODY_READ_TIMEOUT` (checked in `http.rs`, 408).
//! * Shutdown: stop accepting, ask every connection to finish its current response and close,
//!   and return once all have (responses in flight, streams included, run to their end).

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;

/// Longest wait for a request's headers, from the connection's first byte (or the previous
/// response) to the blank line that ends them.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting connections
/// and returns once the open ones have finished (in-flight completions run to their end).
///
/// # Errors
/// None so far: accept errors are logged and retried (a full file table passes), as
/// `axum::serve` does; the `Result` leaves room for a listener that can fail for good.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Every connection task holds a clone of `open`; `closed()` resolves when all are gone.
    let (open, _) = watch::channel(());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    if !is_connection_error(&e) {
                        // Out of file descriptors or memory: give open connections time to end.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let mut stop = stop_rx.clone();
        let held = open.subscribe();
        tokio::spawn(async move {
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            let mut conn = pin!(builder.serve_connection(TokioIo::new(stream), service));
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = async { stop.wait_for(|s| *s).await.is_ok() } => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!("connection: {e}");
            }
            drop(held);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    open.closed().await;
    Ok(())
}

/// Errors of one connection that do not concern the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}
