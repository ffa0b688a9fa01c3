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
    let mut jobs = start_n(state, arrived, spec, 1).await?;
    jobs.pop().ok_or_else(|| ApiError::internal("the backend returned no stream"))
}

/// [`start`] for `n` choices of one prompt (`1..=MAX_CHOICES`, checked by the caller): one
/// job per choice, choice 0 first. The prompt is prepared and counted once.
pub(crate) async fn start_n(
    state: &Arc<AppState>,
    arrived: Instant,
    spec: Spec,
    n: usize,
) -> Result<Vec<Job>, ApiError> {
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
    let submit = move |backend: &dyn crate::backend::Backend| match n {
        1 => backend.submit(request).map(|s| vec![s]),
        n => backend.submit_n(request, n),
    };
    let submitted = if grammar_param.is_some() {
        // Compiling a grammar takes milliseconds (the first one builds the vocabulary's trie):
        // not on the async threads.
        let backend = state.backend.clone();
        tokio::task::spawn_blocking(move || submit(&*backend))
            .await
            .map_err(|e| ApiError::internal(format!("submitting the request failed: {e}")))?
    } else {
        submit(&*state.backend)
    };
    let events = submitted.map_err(|e| {
        let invalid_grammar = e.code == Some(INVALID_GRAMMAR);
        let api = ApiError::from(e);
        match (invalid_grammar, grammar_param) {
            (true, Some(param)) => ApiError { param: Some(param.into()), ..api },
            _ => api,
        }
    })?;
    state.metrics.add_prompt_tokens(prompt_tokens, 0);
    let deadline = state.request_timeout.map(|t| (tokio::time::Instant::from_std(arrived) + t, t));
    let jobs = events
        .into_iter()
        .map(|events| {
            state.metrics.generation_started();
            Job {
                state: state.clone(),
                events,
                cancel: state.cancel.clone(),
                deadline,
                arrived,
                last_token: None,
                prompt_tokens,
                finished: false,
            }
        })
        .collect();
    Ok(jobs)
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

/// Runs the jobs of one request's choices to the end, together; the first failure is the
/// result (the other choices are then dropped, which cancels them).
pub(crate) async fn collect_all(jobs: Vec<Job>) -> Result<Vec<Collected>, ApiError> {
    futures_util::future::try_join_all(jobs.into_iter().map(collect)).await
}

/// Renders one generation as SSE chunks (one encoder per API shape).
pub(crate) trait Encoder: Send + 'static {
    /// Chunks sent before the first step (role announcement, `message_start`).
    fn start(&mut self, out: &mut Vec<Bytes>);
    /// Chunks for one step; after a terminal step the stream ends.
    fn step(&mut self, step: Step, out: &mut Vec<Bytes>);
    /// Chunks that end a stream of several choices once every choice is done (whose encoders
    /// then leave them out of their `Done` step), given the usage of the whole request.
    fn close(&mut self, _usage: Usage, _out: &mut Vec<Bytes>) {}
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

/// The SSE body of a request's choices (`n > 1`): each job's steps through its own encoder
/// (one per choice, which marks its chunks with the choice's index), interleaved as they come;
/// after the last choice's `Done`, the first encoder's [`Encoder::close`] with the request's
/// usage (the prompt once, the completions summed). A failed choice ends the stream with its
/// error chunks, and dropping the stream (client disconnect) drops every job, which cancels
/// every choice.
pub(crate) fn sse_stream_choices<E: Encoder>(jobs: Vec<Job>, mut encoders: Vec<E>) -> impl Stream<Item = Bytes> + Send {
    debug_assert_eq!(jobs.len(), encoders.len());
    let open = jobs.len();
    let steps = stream::select_all(jobs.into_iter().enumerate().map(|(i, job)| {
        // Yields `(choice, step)` until the job's terminal step (then drops the job).
        Box::pin(stream::unfold(Some(job), move |job| async move {
            let mut job = job?;
            let step = job.next().await;
            let terminal = matches!(step, Step::Done { .. } | Step::Failed(_));
            Some(((i, step), (!terminal).then_some(job)))
        }))
    }));
    let mut pending = Vec::new();
    for e in &mut encoders {
        e.start(&mut pending);
    }
    pending.reverse();
    let usage: Option<Usage> = None;
    // State: (steps, encoders, chunks to send in reverse order, choices not done, usage so
    // far, stream ended).
    let state = (steps, encoders, pending, open, usage, false);
    stream::unfold(state, |(mut steps, mut encoders, mut pending, mut open, mut usage, mut ended)| async move {
        loop {
            if let Some(chunk) = pending.pop() {
                return Some((chunk, (steps, encoders, pending, open, usage, ended)));
            }
            if ended {
                return None;
            }
            let (i, step) = steps.next().await?;
            match &step {
                Step::Done { usage: u, .. } => {
                    open -= 1;
                    usage = Some(Usage::of_choices(usage.into_iter().chain([*u])));
                }
                Step::Failed(_) => ended = true,
                Step::Token { .. } => {}
            }
            let mut out = Vec::new();
            encoders[i].step(step, &mut out);
            if open == 0 && !ended {
                ended = true;
                encoders[0].close(usage.unwrap_or_default(), &mut out);
            }
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
