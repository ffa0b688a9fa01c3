//! Several choices of one prompt (OpenAI's `n`): the field's validation, the `index` of each choice's chunks, and the response stream of one or
//! several choices. The backend computes the prompt once and forks it into the choices
//! ([`crate::Backend::submit_n`]); [`crate::generation::start_n`] gives one job per choice.

use axum::response::Response;
use serde_json::{json, Value};

use crate::backend::MAX_CHOICES;
use crate::error::ApiError;
use crate::generation::{sse_response, sse_stream, sse_stream_choices, Encoder, Job};
use crate::params::Fields;

/// `n`: how many choices to generate, `1..=MAX_CHOICES` (1 when absent); otherwise a 400
/// naming `n`.
pub(crate) fn choices(f: &mut Fields) -> Result<usize, ApiError> {
    match f.integer("n")? {
        None => Ok(1),
        Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::invalid("n", format!("'n' must be between 1 and {MAX_CHOICES}, got {n}."))
            .with_code("invalid_value")),
    }
}

/// `choices` with every element's `index` set to the choice a stream's encoder serves.
pub(crate) fn stamp_index(mut choices: Value, index: usize) -> Value {
    if let Value::Array(items) = &mut choices {
        for c in items.iter_mut().filter(|c| c.get("index").is_some()) {
            c["index"] = json!(index);
        }
    }
    choices
}

/// The SSE response of a request's choices: the one job's encoder stream, or the choices'
/// chunks interleaved as they come ([`sse_stream_choices`]).
pub(crate) fn choices_stream<E: Encoder>(mut jobs: Vec<Job>, mut encoders: Vec<E>) -> Response {
    if let ([_], [_]) = (jobs.as_slice(), encoders.as_slice()) {
        if let (Some(job), Some(encoder)) = (jobs.pop(), encoders.pop()) {
            return sse_response(sse_stream(job, encoder));
        }
    }
    sse_response(sse_stream_choices(jobs, encoders))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::parse_object;

    #[test]
    fn n_is_one_to_sixteen_and_errors_name_it() {
        let n = |body: &str| choices(&mut parse_object(body.as_bytes()).unwrap());
        assert_eq!(n("{}").unwrap(), 1);
        assert_eq!(n(r#"{"n": 1}"#).unwrap(), 1);
        assert_eq!(n(r#"{"n": 16}"#).unwrap(), 16);
        for bad in [r#"{"n": 0}"#, r#"{"n": 17}"#, r#"{"n": -1}"#, r#"{"n": "4"}"#, r#"{"n": 2.5}"#] {
            let e = n(bad).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some("n")), "{bad}");
        }
    }

    #[test]
    fn usage_counts_the_prompt_once_and_sums_completions() {
        use crate::backend::Usage;
        let u = |completion_tokens| Usage { prompt_tokens: 7, cached_tokens: 4, completion_tokens };
        assert_eq!(Usage::of_choices([u(3), u(5), u(1)]), u(9));
        assert_eq!(Usage::of_choices([u(3)]), u(3));
        assert_eq!(Usage::of_choices([]), Usage::default());
    }

    #[test]
    fn every_choice_of_a_chunk_gets_the_index() {
        let c = stamp_index(json!([{"index": 0, "delta": {}}]), 3);
        assert_eq!(c, json!([{"index": 3, "delta": {}}]));
        assert_eq!(stamp_index(json!([]), 2), json!([]));
    }
}
