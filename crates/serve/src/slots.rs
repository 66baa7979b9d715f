//! `POST /slots/{id}?action=save|restore`: a conversation's cached blocks saved to a file under
//! `--slot-save-path` and restored, in this process or a restarted one — llama.cpp's server
//! convention, adapted. llama.cpp saves a *slot* (one sequence's cache); kvlab has no slots
//! (one prefix cache serves every request), so a save names the conversation by its tokens:
//!
//! ```text
//! POST /slots/0?action=save     {"filename": "chat-42", "prompt": <the conversation so far>}
//! POST /slots/0?action=restore  {"filename": "chat-42"}
//! ```
//!
//! The id is accepted for llama.cpp's clients and ignored. `prompt` is the last turn's prompt
//! and its reply (text, encoded with BOS as a completion's is, or token ids) — or, for a chat,
//! `messages`, rendered by the chat template as a chat completion's are — with the
//! `cache_salt` / `user` the conversation's requests carry; the blocks of it that are cached
//! are written (`kvlab_paged::SavedSession`, checksummed). A restore reads them back into host
//! memory below the pool, and the conversation's next request, whose prompt starts with those
//! tokens, restores them instead of prefilling them. A file saved by a server of another model,
//! weight format, engine, KV dtype or block size is refused (400), naming both.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::engine_loop::{SessionAction, SessionJob, SubmitError};
use crate::http::{ApiError, AppState, PromptField, cache_salt, chat_tokens, tokens_of};

/// `?action=`.
#[derive(Deserialize)]
pub(crate) struct SlotQuery {
    action: Option<String>,
}

/// The body of a save or a restore.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SlotRequest {
    /// The file's name under `--slot-save-path` (a plain name: no directories).
    filename: String,
    /// Save: the conversation whose cached blocks to write, as a completion's prompt...
    prompt: Option<PromptField>,
    /// ... or as a chat completion's messages (rendered by the model's chat template).
    messages: Option<Vec<kvlab_model::chat::Message>>,
    /// Save: the conversation's `cache_salt`, as its requests send it.
    cache_salt: Option<String>,
    /// Save: the conversation's OpenAI `user`, as its requests send it.
    user: Option<String>,
}

/// `POST /slots/{id}?action=save|restore`.
pub(crate) async fn slots(
    State(s): State<Arc<AppState>>,
    Path(id): Path<u64>,
    Query(q): Query<SlotQuery>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let Some((dir, namespace)) = s.slots.clone() else {
        return Err(ApiError::invalid(
            "saving and restoring sessions is off; start the server with --slot-save-path DIR",
            None,
        ));
    };
    let body =
        body.map_err(|e| ApiError::new(e.status(), "invalid_request_error", e.body_text()))?;
    let req: SlotRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("invalid request body: {e}"), None))?;
    check_filename(&req.filename)?;
    let path = dir.join(&req.filename);
    let action = match q.action.as_deref() {
        Some("save") => {
            let max_model_len = s.engine.max_model_len();
            let tokens = match (&req.prompt, &req.messages) {
                (Some(prompt), None) => tokens_of(&s, prompt, max_model_len)?,
                (None, Some(messages)) => chat_tokens(&s, messages, max_model_len)?,
                _ => {
                    return Err(ApiError::invalid(
                        "a save names the conversation: give its prompt (the last prompt and its reply) or its messages, not both",
                        Some("prompt"),
                    ));
                }
            };
            let salt = cache_salt(
                s.prefix_isolation,
                req.cache_salt.as_deref(),
                req.user.as_deref(),
            )?;
            SessionAction::Save { tokens, salt, path }
        }
        Some("restore") => {
            let named = req.prompt.is_some() || req.messages.is_some();
            if named || req.cache_salt.is_some() || req.user.is_some() {
                return Err(ApiError::invalid(
                    "a restore takes only a filename: the file holds the conversation",
                    None,
                ));
            }
            SessionAction::Restore { path }
        }
        other => {
            return Err(ApiError::invalid(
                format!("action {other:?}: expected ?action=save or ?action=restore"),
                Some("action"),
            ));
        }
    };
    let save = matches!(action, SessionAction::Save { .. });
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job = SessionJob {
        action,
        namespace,
        reply,
    };
    s.engine.submit_session(job)?;
    let done = answer
        .await
        .map_err(|_| ApiError::from(SubmitError::EngineGone))?
        .map_err(|e| ApiError::invalid(e, Some("filename")))?;
    Ok(Json(if save {
        json!({
            "id_slot": id,
            "filename": req.filename,
            "n_saved": done.tokens,
            "n_written": done.bytes,
            "timings": {"save_ms": done.ms},
        })
    } else {
        json!({
            "id_slot": id,
            "filename": req.filename,
            "n_restored": done.tokens,
            "n_read": done.bytes,
            "timings": {"restore_ms": done.ms},
        })
    }))
}

/// A plain file name: not empty, at most 255 bytes, no path separator, not `.` or `..`, no
/// control characters (llama.cpp's server checks the same).
fn check_filename(name: &str) -> Result<(), ApiError> {
    let bad = name.is_empty()
        || name.len() > 255
        || name == "."
        || name == ".."
        || name.contains(['/', '\\'])
        || name.chars().any(char::is_control);
    if bad {
        return Err(ApiError::invalid(
            format!("filename {name:?} must be a plain file name (no directories)"),
            Some("filename"),
        ));
    }
    Ok(())
}
