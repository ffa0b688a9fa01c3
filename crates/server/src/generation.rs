//! One generation as the HTTP layer sees it, shared by every endpoint.
//!
//! [`start`] prepares the prompt on a blocking thread, checks it against the context window,
//! submits it and returns a [`Job`]. [`Job::next`] yields [`Step`]s while measuring time to
//! first token and inter-token latency; it ends early with 503 when the server's grace period
//! is over, and with 504 when the request runs past the server's request timeout. Dropping a
//! `Job` drops the backend's [`EventStream`], which cancels the request — this is how a client
//! disconnect reaches the engine (the response body owns the job).
//!
//! [`sse_response`] turns a stream of encoded chunks into a `text/event-stream` response.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::stream::{self, Stream, StreamExt};
use tokio::sync::watch;

use crate::backend::{
    Event, EventStream, FinishReason, GenerationRequest, Grammar, Prompt, SamplingParams, TokenLogprob, Usage,
    INVALID_GRAMMAR,
};
use crate::error::ApiError;
use crate::metrics::Outcome;
use crate::params::fit_context;
use crate::server::AppState;

/// What an endpoint asks for, after its own parsing and validation.
#[derive(Debug)]
pub(crate) struct Spec {
    pub prompt: Prompt,
    /// Field name for prompt errors (`"messages"` or `"prompt"`).
    pub prompt_param: &'static str,
    /// Already checked to be in 1..=context window; `None` = fill the window.
    pub max_tokens: Option<usize>,
    /// Field name for length errors (`"max_tokens"`, `"max_completion_tokens"`).
    pub max_tokens_param: &'static str,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub logprobs: Option<usize>,
    /// The grammar the output is held to, and the field it came from (for compile errors).
    pub grammar: Option<(Grammar, &'static str)>,
}

/// One step of a generation, as an endpoint renders it.
#[derive(Debug)]
pub(crate) enum Step {
    Token {
        text: String,
        logprob: Option<TokenLogprob>,
    },
    Done {
        finish_reason: FinishReason,
        stop_sequence: Option<String>,
        usage: Usage,
    },
    /// The generation failed or was cancelled by shutdown; nothing follows.
    Failed(ApiError),
}

/// Prepares, checks and submits. Errors are the client's (400) or the backend's.
pub(crate) async fn start(state: &Arc<AppState>, arrived: Instant, spec: Spec) -> Result<Job, ApiError> {
    if *state.cancel.borrow() {
        return Err(ApiError::shutting_down());
    }
    let backend = state.backend.clone();
    let prompt = spec.prompt;
    let prepared = tokio::task::spawn_blocking(move || backend.prepare(&prompt))
        .await
        .map_err(|e| ApiError::internal(format!("preparing the prompt failed: {e}")))??;
    let prompt_tokens = prepared.token_ids.len();
    if prompt_tokens == 0 {
        return Err(ApiError::invalid(spec.prompt_param, "The prompt is empty after tokenization."));
    }
    let window = state.backend.context_window();
    let max_tokens = fit_context(spec.prompt_param, spec.max_tokens_param, prompt_tokens, spec.max_tokens, window)?;
    let (grammar, grammar_param) = spec.grammar.map_or((None, None), |(g, p)| (Some(g), Some(p)));
    let request = GenerationRequest {
        prompt: prepared.token_ids,
        max_tokens,
        sampling: spec.sampling,
        stop: spec.stop,
        logprobs: spec.logprobs,
        grammar,
    };
    let submitted = if request.grammar.is_some() {
        // Compiling a grammar takes milliseconds (the first one builds the vocabulary's trie):
        // not on the async threads.
        let backend = state.backend.clone();
        tokio::task::spawn_blocking(move || backend.submit(request))
            .await
            .map_err(|e| ApiError::internal(format!("submitting the request failed: {e}")))?
    } else {
        state.backend.submit(request)
    };
    let events = submitted.map_err(|e| {
        let invalid_grammar = e.code == Some(INVALID_GRAMMAR);
        let api = ApiError::from(e);
        match (invalid_grammar, grammar_param) {
            (true, Some(param)) => ApiError { param: Some(param.into()), ..api },
            _ => api,
        }
    })?;
    state.metrics.generation_started();
    state.metrics.add_prompt_tokens(prompt_tokens, 0);
    let deadline = state.request_timeout.map(|t| (tokio::time::Instant::from_std(arrived) + t, t));
    Ok(Job {
        state: state.clone(),
        events,
        cancel: state.cancel.clone(),
        deadline,
        arrived,
        last_token: None,
        prompt_tokens,
        finished: false,
    })
}

/// A submitted generation. Owns the backend stream: dropping the job cancels it.
pub(crate) struct Job {
    state: Arc<AppState>,
    events: EventStream,
    cancel: watch::Receiver<bool>,
    /// When the request times out, and the limit (for the message).
    deadline: Option<(tokio::time::Instant, Duration)>,
    arrived: Instant,
    last_token: Option<Instant>,
    /// Prompt length in tokens (known before the backend reports usage).
    pub(crate) prompt_tokens: usize,
    /// A terminal step was returned; the outcome is recorded.
    finished: bool,
}

impl Job {
    /// The next step. After `Done` or `Failed` it keeps returning `Failed`.
    pub(crate) async fn next(&mut self) -> Step {
        if self.finished {
            return Step::Failed(ApiError::internal("generation already finished"));
        }
        let timeout = async {
            match self.deadline {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let event = tokio::select! {
            biased;
            event = self.events.recv() => Ok(event),
            _ = self.cancel.wait_for(|&c| c) => Err(Outcome::Cancelled),
            _ = timeout => Err(Outcome::TimedOut),
        };
        let event = match event {
            Ok(event) => event,
            Err(Outcome::TimedOut) => {
                let limit = self.deadline.map_or(Duration::ZERO, |d| d.1);
                return self.finish(Outcome::TimedOut, Step::Failed(ApiError::timed_out(limit)));
            }
            Err(_) => return self.finish(Outcome::Cancelled, Step::Failed(ApiError::shutting_down())),
        };
        match event {
            Some(Event::Token { text, logprob, .. }) => {
                let now = Instant::now();
                let metrics = &self.state.metrics;
                match self.last_token {
                    None => metrics.time_to_first_token.observe(now - self.arrived),
                    Some(prev) => metrics.inter_token_latency.observe(now - prev),
                }
                self.last_token = Some(now);
                metrics.add_generation_tokens(1);
                Step::Token { text, logprob }
            }
            Some(Event::Done { finish_reason, stop_sequence, usage }) => {
                self.state.metrics.add_prompt_tokens(0, usage.cached_tokens);
                self.finish(finish_reason.into(), Step::Done { finish_reason, stop_sequence, usage })
            }
            Some(Event::Error(e)) => self.finish(Outcome::Error, Step::Failed(e.into())),
            None => self.finish(
                Outcome::Error,
                Step::Failed(ApiError::internal("the engine ended the generation without a result")),
            ),
        }
    }

    fn finish(&mut self, outcome: Outcome, step: Step) -> Step {
        self.finished = true;
        let metrics = &self.state.metrics;
        metrics.record_outcome(outcome);
        metrics.request_duration.observe(self.arrived.elapsed());
        metrics.generation_ended();
        step
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if !self.finished {
            // The client went away (or the handler was dropped): `events` drops with us,
            // which is the cancellation signal for the backend.
            self.finish(Outcome::Cancelled, Step::Failed(ApiError::shutting_down()));
        }
    }
}

/// Everything a non-streaming response needs.
#[derive(Debug)]
pub(crate) struct Collected {
    pub text: String,
    /// One entry per generated token when logprobs were requested, else empty.
    pub logprobs: Vec<TokenLogprob>,
    /// Text length in characters before each token with logprobs: `[logprobs.len()]`.
    pub text_offsets: Vec<usize>,
    pub finish_reason: FinishReason,
    pub stop_sequence: Option<String>,
    pub usage: Usage,
}

/// Runs a job to the end.
pub(crate) async fn collect(mut job: Job) -> Result<Collected, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    let mut text_offsets = Vec::new();
    let mut chars = 0;
    loop {
        match job.next().await {
            Step::Token { text: t, logprob } => {
                if let Some(lp) = logprob {
                    text_offsets.push(chars);
                    logprobs.push(lp);
                }
                chars += t.chars().count();
                text.push_str(&t);
            }
            Step::Done { finish_reason, stop_sequence, usage } => {
                return Ok(Collected { text, logprobs, text_offsets, finish_reason, stop_sequence, usage })
            }
            Step::Failed(e) => return Err(e),
        }
    }
}

/// Renders one generation as SSE chunks (one encoder per API shape).
pub(crate) trait Encoder: Send + 'static {
    /// Chunks sent before the first step (role announcement, `message_start`).
    fn start(&mut self, out: &mut Vec<Bytes>);
    /// Chunks for one step; after a terminal step the stream ends.
    fn step(&mut self, step: Step, out: &mut Vec<Bytes>);
}

/// The SSE body stream of a job: the encoder's chunks, in order, until a terminal step.
/// Dropping the stream (client disconnect) drops the job and so cancels the generation.
pub(crate) fn sse_stream<E: Encoder>(job: Job, mut encoder: E) -> impl Stream<Item = Bytes> + Send {
    let mut pending = Vec::new();
    encoder.start(&mut pending);
    pending.reverse();
    // State: (job, encoder, chunks to send in reverse order, terminal step seen).
    stream::unfold((job, encoder, pending, false), |(mut job, mut encoder, mut pending, mut ended)| async move {
        loop {
            if let Some(chunk) = pending.pop() {
                return Some((chunk, (job, encoder, pending, ended)));
            }
            if ended {
                return None;
            }
            let step = job.next().await;
            ended = matches!(step, Step::Done { .. } | Step::Failed(_));
            let mut out = Vec::new();
            encoder.step(step, &mut out);
            out.reverse();
            pending = out;
        }
    })
}

/// A `text/event-stream` response over encoded chunks.
pub(crate) fn sse_response(chunks: impl Stream<Item = Bytes> + Send + 'static) -> Response {
    let body = Body::from_stream(chunks.map(Ok::<_, Infallible>));
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(body)
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// `data: <json>\n\n`.
pub(crate) fn sse_data(value: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// `event: <name>\ndata: <json>\n\n` (Anthropic's framing).
pub(crate) fn sse_event(name: &str, value: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {value}\n\n"))
}
