//! A deterministic fake engine implementing `Backend`, so the server is tested without one.
//!
//! - Tokenizer: one token per Unicode scalar (`id = char as u32`); chat messages render as
//!   `<|role|>content\n` each, then `<|assistant|>`.
//! - Generation: the words of [`WORDS`] in a loop, one token each, after `token_delay`; the
//!   end-of-sequence comes after `eos_after` tokens. Stop strings are matched on the text so
//!   far; the text of the stopping token is cut before the match.
//! - Session bank: the common prefix with the previous prompt counts as cached.
//! - Magic prompts: a prompt containing `FAIL_SUBMIT` is refused at submit (overloaded);
//!   one containing `FAIL_MIDWAY` errors after two tokens.
//! - Every submitted request is recorded; every cancellation (stream dropped before the
//!   end) is counted and announced.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pagekv_server::{
    AttentionCalls, Backend, BackendError, BackendErrorKind, BackendMetrics, ChatMessage, Event, EventSender,
    EventStream, FallbackCalls, FinishReason, GenerationRequest, Grammar, LogprobEntry, PreparedPrompt, Prompt,
    TokenLogprob, Tool, ToolCallFormat, Usage, INVALID_GRAMMAR,
};
use tokio::sync::Notify;

pub const MODEL: &str = "fake/model-1";
pub const WORDS: &[&str] = &["Hello", " world", ",", " this", " is", " a", " fake", " model", "."];
pub const VOCAB: u32 = 0x11_0000;

#[derive(Debug, Clone)]
pub struct FakeConfig {
    pub context_window: usize,
    pub eos_after: usize,
    pub token_delay: Duration,
    /// The tool-call format the fake reports (Hermes by default).
    pub tool_format: Option<ToolCallFormat>,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            context_window: 256,
            eos_after: 8,
            token_delay: Duration::ZERO,
            tool_format: Some(ToolCallFormat::Hermes),
        }
    }
}

/// What the fake generates when the prompt contains `CALL_TOOLS`: text, two Hermes calls split
/// across tokens (tags and the first call's arguments cut in the middle), then the end.
pub const TOOL_WORDS: &[&str] = &[
    "Checking.",
    "\n<tool",
    "_call>\n{\"name\": \"get_weather\", ",
    "\"arguments\": {\"city\": \"Pa",
    "ris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}",
    "\n</tool_",
    "call>",
];

/// What the fake generates when the prompt contains `CALL_FENCED`: one Hermes call in a
/// ```` ```json ```` fence instead of tags, its arguments cut across tokens.
pub const FENCED_WORDS: &[&str] =
    &["```json\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Pa", "ris\", \"days\": [1,", " 2]}}\n```"];

#[derive(Debug, Default)]
struct Counters {
    running: AtomicU64,
    generated: AtomicU64,
    cancellations: AtomicU64,
    completed: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
}

pub struct FakeBackend {
    config: FakeConfig,
    counters: Arc<Counters>,
    last_prompt: Mutex<Vec<u32>>,
    pub submitted: Mutex<Vec<GenerationRequest>>,
    changed: Arc<Notify>,
}

/// The text the fake generates for `n` tokens without stops.
pub fn expected_text(n: usize) -> String {
    (0..n).map(|i| WORDS[i % WORDS.len()]).collect()
}

/// The prompt tokens the fake's template makes for chat messages.
pub fn render_chat(messages: &[ChatMessage]) -> String {
    let mut s = String::new();
    for m in messages {
        s.push_str(&format!("<|{}|>{}\n", m.role.as_str(), m.content));
    }
    s.push_str("<|assistant|>");
    s
}

/// The fake's template with tools: their names first, then the messages (calls and call ids shown).
pub fn render_tools(tools: &[Tool], messages: &[ChatMessage]) -> String {
    if tools.is_empty() && messages.iter().all(|m| m.tool_calls.is_empty() && m.tool_call_id.is_none()) {
        return render_chat(messages);
    }
    let mut s = format!("<|tools|>{}\n", tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(","));
    for m in messages {
        s.push_str(&format!("<|{}|>{}", m.role.as_str(), m.content));
        for c in &m.tool_calls {
            s.push_str(&format!("[{}:{}({})]", c.id, c.name, c.arguments));
        }
        if let Some(id) = &m.tool_call_id {
            s.push_str(&format!("[result of {id}]"));
        }
        s.push('\n');
    }
    s.push_str("<|assistant|>");
    s
}

impl FakeBackend {
    pub fn new(config: FakeConfig) -> Arc<FakeBackend> {
        Arc::new(FakeBackend {
            config,
            counters: Arc::default(),
            last_prompt: Mutex::new(Vec::new()),
            submitted: Mutex::new(Vec::new()),
            changed: Arc::new(Notify::new()),
        })
    }

    pub fn cancellations(&self) -> u64 {
        self.counters.cancellations.load(Ordering::SeqCst)
    }

    pub fn completed(&self) -> u64 {
        self.counters.completed.load(Ordering::SeqCst)
    }

    pub fn running(&self) -> u64 {
        self.counters.running.load(Ordering::SeqCst)
    }

    /// How many generations were submitted.
    pub fn submitted_count(&self) -> usize {
        self.submitted.lock().unwrap().len()
    }

    pub fn last_request(&self) -> GenerationRequest {
        self.submitted.lock().unwrap().last().cloned().expect("no request submitted")
    }

    /// Waits (bounded) until `cond` holds; panics if it never does.
    pub async fn wait_until(&self, what: &str, cond: impl Fn(&FakeBackend) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let notified = self.changed.notified();
            if cond(self) {
                return;
            }
            // Woken by the fake's notifications; the short tick is a safety net only.
            let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
            if tokio::time::Instant::now() > deadline {
                assert!(cond(self), "timed out waiting for: {what}");
                return;
            }
        }
    }
}

fn logprob_at(n: usize, k: usize) -> TokenLogprob {
    let entry = |id: u32, token: &str, logprob: f32| LogprobEntry {
        id,
        token: token.to_string(),
        bytes: token.as_bytes().to_vec(),
        logprob,
    };
    let word = WORDS[n % WORDS.len()];
    let chosen = entry(n as u32, word, -0.25);
    let mut top = vec![chosen.clone()];
    for j in 1..k {
        top.push(entry(1000 + j as u32, &format!("alt{j}"), -1.0 - j as f32));
    }
    top.truncate(k);
    TokenLogprob { chosen, top }
}

impl Backend for FakeBackend {
    fn model_id(&self) -> &str {
        MODEL
    }

    fn context_window(&self) -> usize {
        self.config.context_window
    }

    fn prepare(&self, prompt: &Prompt) -> Result<PreparedPrompt, BackendError> {
        let token_ids = match prompt {
            Prompt::Text(t) => t.chars().map(|c| c as u32).collect(),
            Prompt::Chat { messages: m, tools } => render_tools(tools, m).chars().map(|c| c as u32).collect(),
            Prompt::Tokens(ids) => {
                if let Some(bad) = ids.iter().find(|&&id| id >= VOCAB) {
                    return Err(BackendError::new(
                        BackendErrorKind::InvalidRequest,
                        format!("token id {bad} is outside the vocabulary"),
                    ));
                }
                ids.clone()
            }
        };
        Ok(PreparedPrompt { token_ids })
    }

    fn submit(&self, request: GenerationRequest) -> Result<EventStream, BackendError> {
        let text: String = request.prompt.iter().filter_map(|&id| char::from_u32(id)).collect();
        if text.contains("FAIL_SUBMIT") {
            return Err(BackendError::new(BackendErrorKind::Overloaded, "queue is full"));
        }
        // The fake's grammar compiler refuses any schema with an `x-invalid` key.
        if let Some(Grammar::JsonSchema { schema, .. }) = &request.grammar {
            if schema.get("x-invalid").is_some() {
                let e =
                    BackendError::new(BackendErrorKind::InvalidRequest, "invalid grammar: x-invalid is not allowed");
                return Err(e.with_code(INVALID_GRAMMAR));
            }
        }
        let fail_midway = text.contains("FAIL_MIDWAY");
        let cached = {
            let mut last = self.last_prompt.lock().unwrap();
            let common = last.iter().zip(&request.prompt).take_while(|(a, b)| a == b).count();
            *last = request.prompt.clone();
            common
        };
        self.counters.hits.fetch_add(cached as u64, Ordering::SeqCst);
        self.counters.misses.fetch_add((request.prompt.len() - cached) as u64, Ordering::SeqCst);
        self.submitted.lock().unwrap().push(request.clone());
        let (tx, rx) = EventStream::channel();
        let usage = Usage { prompt_tokens: request.prompt.len(), cached_tokens: cached, completion_tokens: 0 };
        self.counters.running.fetch_add(1, Ordering::SeqCst);
        let job = Generate {
            tx,
            request,
            usage,
            config: self.config.clone(),
            counters: self.counters.clone(),
            changed: self.changed.clone(),
            fail_midway,
        };
        tokio::spawn(job.run());
        self.changed.notify_waiters();
        Ok(rx)
    }

    fn tool_call_format(&self) -> Option<ToolCallFormat> {
        self.config.tool_format
    }

    fn metrics(&self) -> BackendMetrics {
        let c = &self.counters;
        let running = c.running.load(Ordering::SeqCst);
        BackendMetrics {
            running_sequences: running,
            waiting_sequences: 0,
            kv_blocks_total: 64,
            kv_blocks_used: 2 * running,
            kv_blocks_free: 64 - 2 * running - 4,
            kv_blocks_cached: 4,
            kv_blocks_shared: 0,
            sequence_forks: 0,
            grammar_masks: 0,
            grammar_mask_seconds: 0.0,
            kv_group_blocks: vec![("full".into(), 2 * running)],
            session_bank_hits: c.hits.load(Ordering::SeqCst),
            session_bank_misses: c.misses.load(Ordering::SeqCst),
            session_bank_evictions: 0,
            preemptions: 0,
            computed_tokens: 0,
            kv_pool_utilization: 1.0,
            generated_tokens: c.generated.load(Ordering::SeqCst),
            sequence_steps: c.generated.load(Ordering::SeqCst),
            draft_steps: 0,
            draft_tokens: 0,
            draft_accepted_tokens: 0,
            attention_calls: vec![AttentionCalls {
                route: "primitive".into(),
                format: "f16".into(),
                calls: c.generated.load(Ordering::SeqCst),
            }],
            fallbacks: vec![FallbackCalls { reason: "no \"fast\" path".into(), calls: 0 }],
        }
    }
}

/// One generation task of the fake.
struct Generate {
    tx: EventSender,
    request: GenerationRequest,
    usage: Usage,
    config: FakeConfig,
    counters: Arc<Counters>,
    changed: Arc<Notify>,
    fail_midway: bool,
}

impl Generate {
    /// The scripted tool-call output when the prompt asks for it, else the fixed sentence.
    fn words(&self) -> &'static [&'static str] {
        let prompt: String = self.request.prompt.iter().filter_map(|&id| char::from_u32(id)).collect();
        if prompt.contains("CALL_TOOLS") {
            TOOL_WORDS
        } else if prompt.contains("CALL_FENCED") {
            FENCED_WORDS
        } else {
            WORDS
        }
    }

    fn eos_after(&self) -> usize {
        let words = self.words();
        if words == WORDS {
            self.config.eos_after
        } else {
            words.len()
        }
    }

    async fn run(self) {
        let finished = self.generate().await;
        self.counters.running.fetch_sub(1, Ordering::SeqCst);
        if finished {
            self.counters.completed.fetch_add(1, Ordering::SeqCst);
        } else {
            self.counters.cancellations.fetch_add(1, Ordering::SeqCst);
        }
        self.changed.notify_waiters();
    }

    /// True when the generation ran to its end, false when the client cancelled it.
    async fn generate(&self) -> bool {
        let mut text = String::new();
        let mut n = 0;
        loop {
            let done = |finish_reason, stop_sequence, n| Event::Done {
                finish_reason,
                stop_sequence,
                usage: Usage { completion_tokens: n, ..self.usage },
            };
            if self.fail_midway && n == 2 {
                let e = BackendError::new(BackendErrorKind::Internal, "the fake engine broke");
                return self.tx.send(Event::Error(e)).is_ok();
            }
            if n == self.eos_after() {
                return self.tx.send(done(FinishReason::Stop, None, n)).is_ok();
            }
            if n == self.request.max_tokens {
                return self.tx.send(done(FinishReason::Length, None, n)).is_ok();
            }
            tokio::select! {
                _ = self.tx.cancelled() => return false,
                _ = tokio::time::sleep(self.config.token_delay) => {}
            }
            let words = self.words();
            let word = words[n % words.len()];
            let candidate = format!("{text}{word}");
            let stop =
                self.request.stop.iter().filter_map(|s| candidate.find(s.as_str()).map(|at| (at, s.clone()))).min();
            let piece = match &stop {
                Some((at, _)) => candidate[text.len().min(*at)..*at].to_string(),
                None => word.to_string(),
            };
            let logprob = self.request.logprobs.map(|k| logprob_at(n, k));
            let token = Event::Token { id: n as u32, text: piece, logprob };
            if self.tx.send(token).is_err() {
                return false;
            }
            self.counters.generated.fetch_add(1, Ordering::SeqCst);
            n += 1;
            text = candidate;
            if let Some((_, s)) = stop {
                return self.tx.send(done(FinishReason::Stop, Some(s), n)).is_ok();
            }
        }
    }
}
