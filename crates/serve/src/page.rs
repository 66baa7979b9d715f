//! The live page: `GET /` is one static HTML file (`page.html`, a few lines of JS, no
//! framework) that polls `GET /pool` four times a second and draws the KV block pool the way
//! the book's block-table figure does: one cell per physical block, coloured by the sequence
//! holding it, shared blocks outlined with their holder count, cached free blocks grey; below
//! it, each live sequence with its block table, and the scheduler's counters.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::Html;
use kvlab_paged::PoolView;
use serde::Serialize;

use crate::AppState;

/// `GET /pool`: the engine's last [`PoolView`] and the server's own numbers.
#[derive(Serialize)]
pub(crate) struct PoolResponse {
    model: String,
    /// Requests accepted that have not produced a token yet.
    num_requests_pending: usize,
    /// The bound on `num_requests_pending` past which requests get 429.
    max_waiting: usize,
    #[serde(flatten)]
    view: PoolView,
}

pub(crate) async fn index() -> Html<&'static str> {
    Html(include_str!("page.html"))
}

pub(crate) async fn pool(State(s): State<Arc<AppState>>) -> Json<PoolResponse> {
    let shared = s.engine.shared();
    Json(PoolResponse {
        model: s.model_name.clone(),
        num_requests_pending: shared.pending(),
        max_waiting: s.max_waiting,
        view: shared.view(),
    })
}
