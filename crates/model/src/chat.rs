//! Chat templates: the Jinja template a model ships to turn a conversation into its prompt text
//! (`<|im_start|>user\n…<|im_end|>` for Qwen, `[INST] … [/INST]` for Llama 2 and Mistral).
//!
//! Rendered with `minijinja` in the environment transformers builds for them
//! (`utils/chat_template_utils.py`, `_compile_jinja_template`): `trim_blocks` and
//! `lstrip_blocks` on, loop controls (`break`, `continue`), a `raise_exception(msg)` function
//! that refuses a conversation, `strftime_now(format)` (the local time as Python's `strftime`
//! writes it, which Llama 3.x templates put in their system prompt; chrono formats it),
//! `tojson`, and Python's string methods (`.strip()`,
//! `.startswith()`, …, from `minijinja-contrib`'s pycompat) since templates are written against
//! Python's Jinja. The variables are transformers': `messages` (role and content of each),
//! `add_generation_prompt`, `bos_token`, `eos_token`.
//!
//! Where a template comes from: a Hugging Face folder's `chat_template.jinja` (transformers ≥ 4.43
//! writes it there), else `tokenizer_config.json`'s `chat_template` (a string, or a list of named
//! templates of which "default" is used); a GGUF's `tokenizer.chat_template`.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Error, Result};

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// "system", "user" or "assistant" (what the template accepts is up to it).
    pub role: String,
    /// The turn's text.
    pub content: String,
}

impl Message {
    /// A turn of `role` saying `content`.
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template and the special tokens it may print.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    bos_token: String,
    eos_token: String,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`.
    ///
    /// # Errors
    /// [`Error::ChatTemplate`] with minijinja's message (line and cause) if it does not compile.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| Error::ChatTemplate(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function(
            "strftime_now",
            |format: String| -> std::result::Result<String, minijinja::Error> {
                use std::fmt::Write;
                let mut out = String::new();
                // chrono reports a specifier it does not know as a formatting error.
                write!(out, "{}", chrono::Local::now().format(&format)).map_err(|_| {
                    minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        format!("strftime_now: {format:?} is not a strftime format"),
                    )
                })?;
                Ok(out)
            },
        );
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| Error::ChatTemplate(format!("does not compile: {e:#}")))?;
        Ok(ChatTemplate {
            env: Arc::new(env),
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// The prompt text of `messages`, ending with the assistant's opening when
    /// `add_generation_prompt` (what the model then continues).
    ///
    /// # Errors
    /// [`Error::ChatTemplate`]: the template's own refusal (`raise_exception`, e.g. roles that do
    /// not alternate), with its message, or a rendering error.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let t = self
            .env
            .get_template(NAME)
            .map_err(|e| Error::ChatTemplate(e.to_string()))?;
        let messages: Vec<minijinja::Value> = messages
            .iter()
            .map(|m| {
                minijinja::Value::from_pairs([
                    ("role", m.role.as_str()),
                    ("content", m.content.as_str()),
                ])
            })
            .collect();
        t.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
        .map_err(|e| match e.kind() {
            ErrorKind::InvalidOperation => Error::ChatTemplate(format!(
                "the template refuses this conversation: {}",
                e.detail().unwrap_or("(no message)")
            )),
            _ => Error::ChatTemplate(format!("{e:#}")),
        })
    }

    /// The template of a Hugging Face folder, if it has one (see the module doc).
    ///
    /// # Errors
    /// [`Error::Open`] / [`Error::Format`] for an unreadable `tokenizer_config.json`;
    /// [`Error::ChatTemplate`] if the template does not compile.
    pub fn from_hf_dir(dir: &Path) -> Result<Option<ChatTemplate>> {
        let config_path = dir.join("tokenizer_config.json");
        let config: Value = if config_path.is_file() {
            let text = std::fs::read_to_string(&config_path).map_err(|source| Error::Open {
                path: config_path.clone(),
                source,
            })?;
            serde_json::from_str(&text)
                .map_err(|e| Error::Format(format!("{}: {e}", config_path.display())))?
        } else {
            Value::Null
        };
        let jinja = dir.join("chat_template.jinja");
        let source = if jinja.is_file() {
            Some(
                std::fs::read_to_string(&jinja).map_err(|source| Error::Open {
                    path: jinja.clone(),
                    source,
                })?,
            )
        } else {
            match &config["chat_template"] {
                Value::String(s) => Some(s.clone()),
                Value::Array(named) => named
                    .iter()
                    .find(|t| t["name"] == "default")
                    .and_then(|t| t["template"].as_str())
                    .map(str::to_string),
                _ => None,
            }
        };
        // A special token is written as a string or as {"content": ...} (AddedToken).
        let token = |key: &str| match &config[key] {
            Value::String(s) => s.clone(),
            v => v["content"].as_str().unwrap_or("").to_string(),
        };
        source
            .map(|s| ChatTemplate::new(&s, &token("bos_token"), &token("eos_token")))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_string_methods_loop_controls_and_refusals() {
        let t = ChatTemplate::new(
            "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}{% endif %}\
             {% if loop.index > 2 %}{% break %}{% endif %}[{{ m.content.strip() | upper }}]{% endfor %}\
             {% if add_generation_prompt %}>{% endif %}",
            "<s>",
            "</s>",
        )
        .unwrap();
        let msgs = [
            Message::new("user", "  hi "),
            Message::new("assistant", "yo"),
            Message::new("user", "cut"),
        ];
        assert_eq!(t.render(&msgs, true).unwrap(), "<s>[HI][YO]>");
        let err = t
            .render(&[Message::new("system", "x")], false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("refuses this conversation: no system"),
            "{err}"
        );
        assert!(
            ChatTemplate::new("{% for %}", "", "")
                .unwrap_err()
                .to_string()
                .contains("does not compile")
        );
    }

    #[test]
    fn strftime_now_writes_the_date_as_python_does() {
        // Llama 3.1's template: the date in its system prompt, when the caller gave none.
        let t = ChatTemplate::new(
            "{% if strftime_now is defined %}{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y') }}{% endif %}",
            "",
            "",
        )
        .unwrap();
        let out = t.render(&[], false).unwrap();
        let (date, year) = out.split_once('|').unwrap();
        assert!(year.len() == 4 && year >= "2026", "{out}");
        // "23 Nov 2026": day, English month abbreviation, year.
        let parts: Vec<&str> = date.split(' ').collect();
        assert_eq!(parts.len(), 3, "{out}");
        assert_eq!(parts[2], year);
        // A specifier strftime does not know is an error, not a panic.
        let bad = ChatTemplate::new("{{ strftime_now('%Q') }}", "", "").unwrap();
        assert!(bad.render(&[], false).is_err());
    }
}

/// What one turn of a [`ChatSession`] cost.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TurnStats {
    /// Tokens of the rendered conversation already in the KV cache from earlier turns.
    pub reused_tokens: usize,
    /// Tokens prefilled this turn (the new user message and the template's markup around it,
    /// or everything when the history could not be reused).
    pub prefilled_tokens: usize,
    /// Tokens the assistant generated (a final stop token not counted).
    pub generated_tokens: usize,
    /// A stop token ended the reply (rather than the token limit or the context).
    pub stopped: bool,
    /// Positions in the sequence's cache after the turn.
    pub cached_tokens: usize,
}

/// A multi-turn conversation whose KV cache lives across turns.
///
/// Each turn renders the whole conversation with the template, as transformers and llama.cpp's
/// server do, and tokenizes it. The longest prefix of it already in the cache (the previous
/// render plus the reply) is kept and only the rest is prefilled: the conversation so far costs
/// no recomputation. Where the render differs from the cache (a reply whose text re-tokenizes
/// differently, a template that rewrites earlier turns), the cache is cut back to the common
/// prefix with [`Engine::truncate`], as llama.cpp's server does; an engine that cannot cut
/// starts over. [`TurnStats`] says how much was reused.
pub struct ChatSession {
    template: ChatTemplate,
    messages: Vec<Message>,
    seq: Option<SeqId>,
    /// The token ids in the sequence's cache, in order.
    cached: Vec<u32>,
    max_seq_len: usize,
}

use crate::{Engine, SeqId, Tokenizer};

impl ChatSession {
    /// A conversation, optionally opened by a system message, with at most `max_seq_len`
    /// positions.
    pub fn new(template: ChatTemplate, system: Option<&str>, max_seq_len: usize) -> ChatSession {
        ChatSession {
            template,
            messages: system
                .map(|s| Message::new("system", s))
                .into_iter()
                .collect(),
            seq: None,
            cached: Vec::new(),
            max_seq_len,
        }
    }

    /// The conversation so far.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Adds the user's message, generates the reply (streamed to `on_text`, at most `max_new`
    /// tokens) and adds it to the conversation.
    ///
    /// # Errors
    /// [`Error::ChatTemplate`] (the template refuses the conversation: nothing is added);
    /// [`Error::PromptTooLong`] when the conversation no longer fits `max_seq_len`; engine and
    /// sampling errors.
    pub fn turn(
        &mut self,
        engine: &mut dyn Engine,
        tok: &Tokenizer,
        sampler: &mut crate::Sampler,
        user: &str,
        max_new: usize,
        mut on_text: impl FnMut(&str),
    ) -> Result<TurnStats> {
        self.messages.push(Message::new("user", user));
        let rendered = match self.template.render(&self.messages, true) {
            Ok(r) => r,
            Err(e) => {
                self.messages.pop();
                return Err(e);
            }
        };
        // The template writes BOS itself where the model wants it (transformers tokenizes a
        // rendered chat with add_special_tokens=False).
        let ids = tok.encode_special(&rendered, false, false);
        if ids.len() >= self.max_seq_len {
            self.messages.pop();
            return Err(Error::PromptTooLong {
                tokens: ids.len(),
                max_seq_len: self.max_seq_len,
            });
        }
        // The longest prefix of the new render already in the cache, leaving at least one
        // token to prefill (its logits start the reply).
        let common = self
            .cached
            .iter()
            .zip(&ids)
            .take_while(|(a, b)| a == b)
            .count()
            .min(ids.len() - 1);
        let kept = match self.seq {
            Some(seq) if common == self.cached.len() => Some(seq),
            Some(seq) if engine.truncate(seq, common)? => {
                self.cached.truncate(common);
                Some(seq)
            }
            _ => None,
        };
        let seq = match kept {
            Some(seq) => seq,
            None => {
                if let Some(old) = self.seq.take() {
                    engine.free(old);
                }
                self.cached.clear();
                let seq = engine.new_sequence(self.max_seq_len)?;
                self.seq = Some(seq);
                seq
            }
        };
        let mut stats = TurnStats {
            reused_tokens: self.cached.len(),
            prefilled_tokens: ids.len() - self.cached.len(),
            ..TurnStats::default()
        };
        let mut logits = engine.prefill(seq, &ids[self.cached.len()..])?;
        self.cached = ids;
        let stop_ids = engine.config().stop_ids.clone();
        let mut stream = crate::tokenizer::Utf8Stream::default();
        let mut reply = Vec::new();
        let mut prev = *self.cached.last().unwrap_or(&u32::MAX);
        loop {
            let next = sampler.next_token(&mut logits, self.cached.len() - 1)?;
            if stop_ids.contains(&next) {
                stats.stopped = true;
                break;
            }
            reply.push(next);
            let text = stream.push(&tok.decode(prev, next, false));
            if !text.is_empty() {
                on_text(&text);
            }
            if reply.len() >= max_new || self.cached.len() >= self.max_seq_len {
                break;
            }
            logits = engine.decode(seq, next)?;
            self.cached.push(next);
            prev = next;
        }
        let rest = stream.finish();
        if !rest.is_empty() {
            on_text(&rest);
        }
        stats.generated_tokens = reply.len();
        stats.cached_tokens = self.cached.len();
        self.messages
            .push(Message::new("assistant", &tok.decode_all(&reply, false)));
        Ok(stats)
    }

    /// Frees the conversation's cache.
    pub fn end(mut self, engine: &mut dyn Engine) {
        if let Some(seq) = self.seq.take() {
            engine.free(seq);
        }
    }
}
