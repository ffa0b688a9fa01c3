//! Chat templates: [`ChatTemplate`] turns a list of [`ChatMessage`]s into the prompt text a
//! chat model was trained on, by rendering the model's Jinja template with minijinja.
//!
//! The environment imitates the one Hugging Face `transformers` renders templates in, so a
//! template written for it renders byte-identically here:
//! - `trim_blocks` and `lstrip_blocks` on, trailing newline dropped;
//! - Python string/dict/list methods (`.strip()`, `.startswith()`, `.items()`, ...) through
//!   minijinja-contrib's pycompat;
//! - `raise_exception(msg)` fails the render with `msg`; `strftime_now(fmt)` formats the
//!   current UTC time (`strftime.rs`);
//! - `tojson` as `json.dumps(ensure_ascii=False)` (`tojson.rs`);
//! - variables `messages` (with `tool_calls`, `tool_call_id`, `name` where given), `tools`
//!   (undefined when none), `add_generation_prompt`, `bos_token`, `eos_token`;
//! - [`ChatTemplate::tool_call_format`]: the tool-call convention the template teaches.
//!
//! Where the template comes from ([`TemplateOrigin`]): the GGUF key `tokenizer.chat_template`;
//! when that is missing, a ChatML fallback ([`CHATML_TEMPLATE`]) that `inspect` can report;
//! or a caller-supplied source (an override file the caller reads and passes to `new`).

mod strftime;
mod tojson;

use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::gguf::{GgufError, Metadata};

/// ChatML, used when a model file has no `tokenizer.chat_template`.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The GGUF key holding the default chat template.
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// The name the template is stored under in the environment.
const NAME: &str = "chat";

/// One message of a conversation, in the shape Hugging Face templates read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ... (passed to the template as is).
    pub role: String,
    pub content: String,
    /// An assistant's tool calls: `{"id", "type": "function", "function": {"name", "arguments"}}`
    /// with `arguments` an object (templates print it with `tojson`). Absent (undefined in the
    /// template) when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool message's answer to the call with this id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool message's function name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into(), ..ChatMessage::default() }
    }
}

/// How a model writes a tool call, detected from its chat template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// Hermes / Qwen 2.5: `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, one block
    /// per call.
    Hermes,
    /// Llama 3.x JSON: the reply is `{"name": …, "parameters": {…}}` (after `<|python_tag|>`
    /// when the model writes it).
    Llama3Json,
    /// Mistral: `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`, or with `args` (templates
    /// that print `[ARGS]`, Mistral's newer tokenizers) `[TOOL_CALLS]name[ARGS]{…}` per call.
    Mistral { args: bool },
}

/// Where a template's source came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateOrigin {
    /// `tokenizer.chat_template` of the model file.
    Gguf,
    /// The model file has no template; [`CHATML_TEMPLATE`] is used instead (its vocabulary has
    /// ChatML's `<|im_start|>`, or the file lists no vocabulary).
    ChatMlFallback,
    /// The model file has no template and its vocabulary no ChatML tokens (a base model such as
    /// Gemma 3 270M): rendering is an error that says so ([`TemplateError::Missing`]).
    Missing,
    /// Given to [`ChatTemplate::new`] by the caller (e.g. an override file).
    Custom,
}

/// An error compiling or rendering a template.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The source is not a valid template.
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// Rendering failed, including a `raise_exception(...)` in the template.
    #[error("chat template failed to render: {0}")]
    Render(String),
    /// The model file's metadata could not be read.
    #[error("chat template metadata: {0}")]
    Metadata(#[from] GgufError),
    /// The model has no chat template (see [`TemplateOrigin::Missing`]).
    #[error(
        "this model has no chat template and no ChatML tokens (a base model): chat needs a template \
         (--chat-template FILE); raw completion (`pagekv run`, /v1/completions) works without one"
    )]
    Missing,
}

/// A compiled chat template with the special-token texts it may print.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    origin: TemplateOrigin,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("source_len", &self.source.len())
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source`. `bos_token`/`eos_token` are empty until set with
    /// [`with_special_tokens`](Self::with_special_tokens).
    pub fn new(source: &str) -> Result<ChatTemplate, TemplateError> {
        Self::build(source, TemplateOrigin::Custom)
    }

    /// The template of a model file (`tokenizer.chat_template`), or the ChatML fallback when
    /// the key is absent; `bos_token`/`eos_token` are the texts of the file's BOS/EOS tokens.
    pub fn from_gguf(meta: &Metadata) -> Result<ChatTemplate, TemplateError> {
        let has_chatml_tokens = match meta.get("tokenizer.ggml.tokens") {
            Some(_) => meta.get_str_array("tokenizer.ggml.tokens")?.iter().any(|t| t == "<|im_start|>"),
            None => true,
        };
        let (source, origin) = match meta.get(CHAT_TEMPLATE_KEY) {
            Some(_) => (meta.get_str(CHAT_TEMPLATE_KEY)?, TemplateOrigin::Gguf),
            None if has_chatml_tokens => (CHATML_TEMPLATE, TemplateOrigin::ChatMlFallback),
            None => ("", TemplateOrigin::Missing),
        };
        let template = Self::build(source, origin)?;
        let token_text = |key: &str| -> Result<String, TemplateError> {
            if meta.get(key).is_none() || meta.get("tokenizer.ggml.tokens").is_none() {
                return Ok(String::new());
            }
            let id = meta.get_u32(key)? as usize;
            let tokens = meta.get_str_array("tokenizer.ggml.tokens")?;
            Ok(tokens.get(id).cloned().unwrap_or_default())
        };
        let bos = token_text("tokenizer.ggml.bos_token_id")?;
        let eos = token_text("tokenizer.ggml.eos_token_id")?;
        Ok(template.with_special_tokens(bos, eos))
    }

    fn build(source: &str, origin: TemplateOrigin) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", |format: String| strftime::strftime(&format, strftime::now_secs()));
        env.add_filter("tojson", tojson::tojson);
        env.add_template_owned(NAME, source.to_owned()).map_err(|e| TemplateError::Syntax(describe(&e)))?;
        Ok(ChatTemplate { env, source: source.to_owned(), origin, bos_token: String::new(), eos_token: String::new() })
    }

    /// Sets the texts the template sees as `bos_token` and `eos_token`.
    pub fn with_special_tokens(mut self, bos_token: impl Into<String>, eos_token: impl Into<String>) -> ChatTemplate {
        self.bos_token = bos_token.into();
        self.eos_token = eos_token.into();
        self
    }

    /// Makes `strftime_now` format a fixed instant (seconds since the Unix epoch, UTC)
    /// instead of the clock, for reproducible renders in tests and benchmarks.
    pub fn with_fixed_time(mut self, epoch_secs: i64) -> ChatTemplate {
        self.env.add_function("strftime_now", move |format: String| strftime::strftime(&format, epoch_secs));
        self
    }

    /// Renders `messages`; with `add_generation_prompt`, the text that opens the assistant's
    /// reply is appended (as the template defines it).
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TemplateError> {
        self.render_with_tools(messages, &[], add_generation_prompt)
    }

    /// [`render`](Self::render) with the tools the model may call, as `apply_chat_template`
    /// passes them: `tools` is the list of `{"type": "function", "function": {…}}` objects, or
    /// undefined (`None` in Python) when empty.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        if self.origin == TemplateOrigin::Missing {
            return Err(TemplateError::Missing);
        }
        let template = self.env.get_template(NAME).map_err(|e| TemplateError::Render(describe(&e)))?;
        let tools = (!tools.is_empty()).then_some(tools);
        template
            .render(context! {
                messages => messages,
                tools => tools,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|e| TemplateError::Render(describe(&e)))
    }

    /// The tool-call convention the template teaches the model, if it teaches one: Hermes/Qwen
    /// when it writes `<tool_call>` blocks, Mistral when it writes `[TOOL_CALLS]` (with `[ARGS]`:
    /// the newer form), Llama 3.x when it asks for `{"name": …, "parameters": …}` replies (its
    /// templates say so in prose and use the `ipython` role or `<|python_tag|>`).
    pub fn tool_call_format(&self) -> Option<ToolCallFormat> {
        let s = &self.source;
        if !s.contains("tools") {
            None
        } else if s.contains("<tool_call>") {
            Some(ToolCallFormat::Hermes)
        } else if s.contains("[TOOL_CALLS]") {
            Some(ToolCallFormat::Mistral { args: s.contains("[ARGS]") })
        } else if s.contains("<|start_header_id|>")
            && s.contains("parameters")
            && (s.contains("<|python_tag|>") || s.contains("ipython"))
        {
            Some(ToolCallFormat::Llama3Json)
        } else {
            None
        }
    }

    /// Where the source came from.
    pub fn origin(&self) -> TemplateOrigin {
        self.origin
    }

    /// True when the model file had no template and ChatML is used instead.
    pub fn is_fallback(&self) -> bool {
        self.origin == TemplateOrigin::ChatMlFallback
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }
}

/// `raise_exception(msg)`: templates call it to reject a conversation they cannot format.
fn raise_exception(message: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// A minijinja error with its cause chain on one line.
fn describe(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests;
