//! Server-side metrics and the Prometheus text exposition (format 0.0.4), written by hand.
//!
//! [`ServerMetrics`] holds what only the server can see — requests by endpoint and status,
//! token counts, time to first token, inter-token latency, request duration — as atomics.
//! [`ServerMetrics::render`] appends the engine's [`BackendMetrics`] snapshot and the derived
//! session-bank hit rate. Every family gets `# HELP` and `# TYPE`; histograms export
//! cumulative `_bucket{le=..}` series ending in `+Inf`, then `_sum` and `_count`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::backend::{BackendMetrics, FinishReason};

/// Upper bounds (seconds) of the time-to-first-token buckets.
const TTFT_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// Upper bounds (seconds) of the inter-token latency buckets.
const ITL_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
/// Upper bounds (seconds) of the end-to-end request duration buckets.
const DURATION_BUCKETS: &[f64] =
    &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0];

/// A fixed-bucket histogram of durations, lock-free.
#[derive(Debug)]
pub(crate) struct Histogram {
    /// Upper bounds in seconds, ascending.
    bounds: &'static [f64],
    /// Per-bucket (non-cumulative) counts: `[bounds.len() + 1]`, the last one is `+Inf`.
    counts: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub(crate) fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = self.bounds.partition_point(|&b| b < secs);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        header(out, name, help, "histogram");
        let mut cumulative = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            cumulative += c.load(Ordering::Relaxed);
            let le = match self.bounds.get(i) {
                Some(b) => format!("{b}"),
                None => "+Inf".to_string(),
            };
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

/// How a generation ended, for the finished-requests counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Outcome {
    Stop,
    Length,
    Error,
    Cancelled,
    TimedOut,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Stop => "stop",
            Outcome::Length => "length",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
            Outcome::TimedOut => "timeout",
        }
    }
}

impl From<FinishReason> for Outcome {
    fn from(r: FinishReason) -> Self {
        match r {
            FinishReason::Stop => Outcome::Stop,
            FinishReason::Length => Outcome::Length,
        }
    }
}

/// Counters and histograms measured by the server itself.
#[derive(Debug)]
pub(crate) struct ServerMetrics {
    /// (endpoint route, HTTP status) → count.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// Outcome → generations finished that way.
    finished: Mutex<BTreeMap<Outcome, u64>>,
    prompt_tokens: AtomicU64,
    cached_prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    generations_in_flight: AtomicI64,
    pub(crate) time_to_first_token: Histogram,
    pub(crate) inter_token_latency: Histogram,
    pub(crate) request_duration: Histogram,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        ServerMetrics {
            requests: Mutex::new(BTreeMap::new()),
            finished: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            cached_prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            generations_in_flight: AtomicI64::new(0),
            time_to_first_token: Histogram::new(TTFT_BUCKETS),
            inter_token_latency: Histogram::new(ITL_BUCKETS),
            request_duration: Histogram::new(DURATION_BUCKETS),
        }
    }
}

impl ServerMetrics {
    pub(crate) fn record_request(&self, endpoint: &str, status: u16) {
        let mut map = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *map.entry((endpoint.to_string(), status)).or_default() += 1;
    }

    pub(crate) fn record_outcome(&self, outcome: Outcome) {
        let mut map = self.finished.lock().unwrap_or_else(|p| p.into_inner());
        *map.entry(outcome).or_default() += 1;
    }

    pub(crate) fn add_prompt_tokens(&self, prompt: usize, cached: usize) {
        self.prompt_tokens.fetch_add(prompt as u64, Ordering::Relaxed);
        self.cached_prompt_tokens.fetch_add(cached as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_generation_tokens(&self, n: usize) {
        self.generation_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn generation_started(&self) {
        self.generations_in_flight.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn generation_ended(&self) {
        self.generations_in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// The whole exposition: server families, then the backend's.
    pub(crate) fn render(&self, model: &str, backend: &BackendMetrics) -> String {
        let mut out = String::with_capacity(8 << 10);

        header(&mut out, "pagekv_model_info", "The served model (value is always 1).", "gauge");
        let _ = writeln!(out, "pagekv_model_info{{model=\"{}\"}} 1", escape(model));

        header(&mut out, "pagekv_http_requests_total", "HTTP requests by endpoint and status code.", "counter");
        for ((endpoint, status), n) in self.requests.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(
                out,
                "pagekv_http_requests_total{{endpoint=\"{}\",status=\"{status}\"}} {n}",
                escape(endpoint)
            );
        }

        header(
            &mut out,
            "pagekv_generations_finished_total",
            "Generations by how they ended (stop, length, error, cancelled, timeout).",
            "counter",
        );
        let finished = self.finished.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for outcome in [Outcome::Stop, Outcome::Length, Outcome::Error, Outcome::Cancelled, Outcome::TimedOut] {
            let n = finished.get(&outcome).copied().unwrap_or(0);
            let _ = writeln!(out, "pagekv_generations_finished_total{{reason=\"{}\"}} {n}", outcome.as_str());
        }

        counter(
            &mut out,
            "pagekv_prompt_tokens_total",
            "Prompt tokens of submitted generations.",
            self.prompt_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "pagekv_prompt_cached_tokens_total",
            "Prompt tokens reused from the session bank instead of computed.",
            self.cached_prompt_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "pagekv_generation_tokens_total",
            "Tokens generated (streamed to clients).",
            self.generation_tokens.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "pagekv_generations_in_flight",
            "Generations the server is waiting on.",
            self.generations_in_flight.load(Ordering::Relaxed).max(0) as f64,
        );
        self.time_to_first_token.render(
            &mut out,
            "pagekv_time_to_first_token_seconds",
            "Time from request arrival to the first generated token.",
        );
        self.inter_token_latency.render(
            &mut out,
            "pagekv_inter_token_latency_seconds",
            "Time between consecutive generated tokens of one request.",
        );
        self.request_duration.render(
            &mut out,
            "pagekv_generation_duration_seconds",
            "Time from request arrival to the end of its generation.",
        );

        render_backend(&mut out, backend);
        out
    }
}

fn render_backend(out: &mut String, b: &BackendMetrics) {
    gauge(out, "pagekv_running_sequences", "Sequences being computed by the engine.", b.running_sequences as f64);
    gauge(
        out,
        "pagekv_waiting_sequences",
        "Sequences queued or preempted, waiting for blocks.",
        b.waiting_sequences as f64,
    );
    gauge(out, "pagekv_kv_blocks_capacity", "KV cache blocks in the pool.", b.kv_blocks_total as f64);
    gauge(out, "pagekv_kv_blocks_used", "KV cache blocks referenced by live sequences.", b.kv_blocks_used as f64);
    gauge(out, "pagekv_kv_blocks_free", "KV cache blocks holding nothing.", b.kv_blocks_free as f64);
    gauge(
        out,
        "pagekv_kv_blocks_cached",
        "Unreferenced KV cache blocks kept by the session bank (evictable).",
        b.kv_blocks_cached as f64,
    );
    gauge(
        out,
        "pagekv_kv_blocks_shared",
        "KV cache blocks held by two or more live sequences (choices of one prompt share its blocks).",
        b.kv_blocks_shared as f64,
    );
    counter(
        out,
        "pagekv_sequence_forks_total",
        "Choices forked copy-on-write from a request's computed prompt (n - 1 per request with n > 1).",
        b.sequence_forks,
    );
    counter(out, "pagekv_grammar_masks_total", "Token masks computed for constrained decoding.", b.grammar_masks);
    header(
        out,
        "pagekv_grammar_mask_seconds_total",
        "Seconds spent computing constrained-decoding token masks (mostly beside the forward pass).",
        "counter",
    );
    let _ = writeln!(out, "pagekv_grammar_mask_seconds_total {}", b.grammar_mask_seconds);
    if !b.kv_group_blocks.is_empty() {
        let name = "pagekv_kv_group_blocks_used";
        header(out, name, "KV cache blocks running sequences hold, per layer group.", "gauge");
        for (i, (attention, n)) in b.kv_group_blocks.iter().enumerate() {
            let _ = writeln!(out, "{name}{{group=\"{i}\",attention=\"{}\"}} {n}", escape(attention));
        }
    }
    counter(
        out,
        "pagekv_session_bank_hits_total",
        "Requests whose prompt prefix was found in the session bank.",
        b.session_bank_hits,
    );
    counter(
        out,
        "pagekv_session_bank_misses_total",
        "Requests whose prompt prefix was not in the session bank.",
        b.session_bank_misses,
    );
    counter(
        out,
        "pagekv_session_bank_evictions_total",
        "Cached blocks evicted from the session bank.",
        b.session_bank_evictions,
    );
    let lookups = b.session_bank_hits + b.session_bank_misses;
    let rate = if lookups == 0 { 0.0 } else { b.session_bank_hits as f64 / lookups as f64 };
    gauge(
        out,
        "pagekv_session_bank_hit_rate",
        "Session-bank hits / (hits + misses) since start; 0 before any lookup.",
        rate,
    );
    counter(out, "pagekv_preemptions_total", "Sequences preempted because the block pool ran dry.", b.preemptions);
    counter(
        out,
        "pagekv_computed_prompt_tokens_total",
        "Prompt tokens the engine computed (not reused from the session bank).",
        b.computed_tokens,
    );
    counter(out, "pagekv_generated_tokens_total", "Tokens generated.", b.generated_tokens);
    counter(
        out,
        "pagekv_sequence_steps_total",
        "Sequence-steps that generated tokens (generated / steps = tokens per step).",
        b.sequence_steps,
    );
    counter(out, "pagekv_speculative_steps_total", "Sequence-steps that verified drafted tokens.", b.draft_steps);
    counter(out, "pagekv_speculative_draft_tokens_total", "Tokens drafted for verification.", b.draft_tokens);
    counter(out, "pagekv_speculative_accepted_tokens_total", "Drafted tokens the model kept.", b.draft_accepted_tokens);
    let per_step = if b.sequence_steps == 0 { 0.0 } else { b.generated_tokens as f64 / b.sequence_steps as f64 };
    gauge(
        out,
        "pagekv_tokens_per_step",
        "Tokens generated per sequence-step since start (1 without drafting; 0 before any).",
        per_step,
    );
    gauge(
        out,
        "pagekv_kv_pool_utilization",
        "Live tokens / token slots of the blocks running sequences hold (1 when none).",
        b.kv_pool_utilization,
    );
    header(out, "pagekv_attention_calls_total", "Attention calls by route and KV format.", "counter");
    for c in &b.attention_calls {
        let _ = writeln!(
            out,
            "pagekv_attention_calls_total{{route=\"{}\",format=\"{}\"}} {}",
            escape(&c.route),
            escape(&c.format),
            c.calls
        );
    }
    header(
        out,
        "pagekv_attention_fallbacks_total",
        "Attention calls that fell back from a requested fast path, by reason.",
        "counter",
    );
    for f in &b.fallbacks {
        let _ = writeln!(out, "pagekv_attention_fallbacks_total{{reason=\"{}\"}} {}", escape(&f.reason), f.calls);
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, help, "counter");
    let _ = writeln!(out, "{name} {value}");
}

fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    header(out, name, help, "gauge");
    let _ = writeln!(out, "{name} {value}");
}

/// Escapes a label value: backslash, double quote and newline.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_with_inf() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(Duration::from_millis(50)); // ≤ 0.1
        h.observe(Duration::from_millis(100)); // ≤ 0.1 (le is inclusive)
        h.observe(Duration::from_millis(500)); // ≤ 1
        h.observe(Duration::from_secs(3)); // +Inf
        let mut s = String::new();
        h.render(&mut s, "x_seconds", "help");
        let expected = "# HELP x_seconds help\n# TYPE x_seconds histogram\n\
                        x_seconds_bucket{le=\"0.1\"} 2\nx_seconds_bucket{le=\"1\"} 3\n\
                        x_seconds_bucket{le=\"+Inf\"} 4\nx_seconds_sum 3.65\nx_seconds_count 4\n";
        assert_eq!(s, expected);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn hit_rate_is_zero_without_lookups_and_a_ratio_after() {
        let m = ServerMetrics::default();
        let text = m.render("m", &BackendMetrics::default());
        assert!(text.contains("\npagekv_session_bank_hit_rate 0\n"));
        let b = BackendMetrics { session_bank_hits: 3, session_bank_misses: 1, ..Default::default() };
        assert!(m.render("m", &b).contains("\npagekv_session_bank_hit_rate 0.75\n"));
    }

    #[test]
    fn shared_blocks_forks_and_mask_time_are_rendered() {
        let m = ServerMetrics::default();
        let b = BackendMetrics {
            kv_blocks_shared: 5,
            sequence_forks: 3,
            grammar_masks: 8,
            grammar_mask_seconds: 0.25,
            ..Default::default()
        };
        let text = m.render("m", &b);
        for line in [
            "\npagekv_kv_blocks_shared 5\n",
            "\npagekv_sequence_forks_total 3\n",
            "\npagekv_grammar_masks_total 8\n",
            "\npagekv_grammar_mask_seconds_total 0.25\n",
            "\n# TYPE pagekv_sequence_forks_total counter\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from:\n{text}");
        }
    }

    #[test]
    fn group_blocks_get_one_series_per_group() {
        let m = ServerMetrics::default();
        let b = BackendMetrics {
            kv_group_blocks: vec![("sliding_512".into(), 33), ("full".into(), 250)],
            ..Default::default()
        };
        let text = m.render("m", &b);
        assert!(text.contains("\npagekv_kv_group_blocks_used{group=\"0\",attention=\"sliding_512\"} 33\n"), "{text}");
        assert!(text.contains("\npagekv_kv_group_blocks_used{group=\"1\",attention=\"full\"} 250\n"));
    }
}
