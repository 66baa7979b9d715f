//! Chat templates: the Jinja template a model ships to turn a conversation into its prompt text
//! (`<|im_start|>user\n…<|im_end|>` for Qwen, `[INST] … [/INST]` for Llama 2 and Mistral).
//!
//! Rendered with `minijinja` in the environment transformers builds for them
//! (`utils/chat_template_utils.py`, `_compile_jinja_template`): `trim_blocks` and
//! `lstrip_blocks` on, loop controls (`break`, `continue`), a `raise_exception(msg)` function
//! that refuses a conversation, `tojson`, and Python's string methods (`.strip()`,
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
    pub content: String,
}

impl Message {
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
}
