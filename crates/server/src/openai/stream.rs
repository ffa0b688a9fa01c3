//! The OpenAI streams: `chat.completion.chunk` and `text_completion` chunks of one choice, as
//! SSE `data:` events ending in `data: [DONE]`; tool calls go out as OpenAI's incremental
//! `tool_calls` deltas.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::backend::{FinishReason, Usage};
use crate::choices::stamp_index;
use crate::error::ApiError;
use crate::generation::{sse_data, Encoder, Step};
use crate::tools::{call_id, parser, CallSyntax, Piece, ToolParser};

use super::{chat_logprob, choice_seed, completion_logprobs, usage_json, Head};

const DONE: &[u8] = b"data: [DONE]\n\n";

/// Error chunk then `[DONE]`, as vLLM does when a stream fails midway.
fn stream_error(e: &ApiError, out: &mut Vec<Bytes>) {
    out.push(sse_data(&e.body(crate::error::Dialect::OpenAi)));
    out.push(Bytes::from_static(DONE));
}

/// What every chunk of one choice's stream carries besides its choices, and how the stream ends.
struct Frame {
    head: Head,
    /// `chat.completion.chunk` or `text_completion`.
    object: &'static str,
    include_usage: bool,
    /// The choice's `index`, stamped on every chunk.
    index: usize,
    /// This choice's `Done` ends the stream (usage, `[DONE]`): the only choice; with several,
    /// [`Encoder::close`] does once they are all done.
    closes: bool,
}

impl Frame {
    fn chunk(&self, choices: Value, usage: Option<Value>) -> Bytes {
        let mut v = json!({
            "id": self.head.id,
            "object": self.object,
            "created": self.head.created,
            "model": self.head.model,
            "choices": stamp_index(choices, self.index),
        });
        if self.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        sse_data(&v)
    }

    /// The usage chunk (when asked for), then `[DONE]`.
    fn close(&self, usage: Usage, out: &mut Vec<Bytes>) {
        if self.include_usage {
            out.push(self.chunk(json!([]), Some(usage_json(&usage))));
        }
        out.push(Bytes::from_static(DONE));
    }
}

/// `chat.completion.chunk` stream of one choice.
pub(super) struct ChatEncoder {
    frame: Frame,
    /// Tool calls parsed out of the stream, when the request has tools the model can call.
    calls: Option<StreamedCalls>,
}

/// The tool-call state of a chat stream.
struct StreamedCalls {
    parser: Box<dyn ToolParser>,
    /// Calls sent so far (the next one's `index`).
    count: usize,
    /// Whitespace at the end of the text so far, held until it is known whether a call (which
    /// it would only lay out) or more text follows.
    blank: String,
}

impl ChatEncoder {
    /// The encoder of choice `index`; `calls`: how tool calls are parsed out of the text, if
    /// they are; `closes`: whether its end ends the stream (the only choice).
    pub(super) fn new(head: Head, include_usage: bool, calls: Option<&CallSyntax>, index: usize, closes: bool) -> Self {
        let calls = calls.map(|syntax| StreamedCalls { parser: parser(syntax), count: 0, blank: String::new() });
        let frame = Frame { head, object: "chat.completion.chunk", include_usage, index, closes };
        ChatEncoder { frame, calls }
    }

    fn choice(delta: Value, logprobs: Option<Value>, finish: Option<FinishReason>) -> Value {
        json!([{
            "index": 0,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish.map(FinishReason::as_str),
        }])
    }
}

impl ChatEncoder {
    /// Chunks for parsed pieces: text as `content` deltas (the token's logprobs ride on the
    /// first chunk, or on an empty one), each call as OpenAI's incremental `tool_calls` deltas —
    /// its index, id, type and name first, then its arguments (in one delta, or in fragments
    /// as they are generated).
    fn pieces(&mut self, pieces: Vec<Piece>, mut logprobs: Option<Value>, out: &mut Vec<Bytes>) {
        for piece in pieces {
            match piece {
                Piece::Text(t) => {
                    let Some(calls) = self.calls.as_mut() else { continue };
                    // Blank text around calls is layout, not content (as in the whole response).
                    let mut text = std::mem::take(&mut calls.blank) + &t;
                    let end = text.trim_end().len();
                    calls.blank = text.split_off(end);
                    if text.trim().is_empty() && calls.count > 0 || text.is_empty() {
                        continue;
                    }
                    out.push(self.frame.chunk(Self::choice(json!({"content": text}), logprobs.take(), None), None));
                }
                Piece::Call(call) => {
                    self.begin_call(call.name, logprobs.take(), out);
                    self.call_arguments(call.arguments, None, out);
                }
                Piece::CallBegin(name) => self.begin_call(name, logprobs.take(), out),
                Piece::CallArgs(fragment) => self.call_arguments(fragment, logprobs.take(), out),
                Piece::CallEnd => {}
            }
        }
        if let Some(lp) = logprobs {
            out.push(self.frame.chunk(Self::choice(json!({"content": ""}), Some(lp), None), None));
        }
    }
}

impl ChatEncoder {
    /// A call's first delta: its index, id, type and name.
    fn begin_call(&mut self, name: String, logprobs: Option<Value>, out: &mut Vec<Bytes>) {
        let Some(calls) = self.calls.as_mut() else { return };
        calls.blank.clear();
        let index = calls.count;
        calls.count += 1;
        let id = call_id(&choice_seed(&self.frame.head.id, self.frame.index), index);
        let first = json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                           "function": {"name": name, "arguments": ""}}]});
        out.push(self.frame.chunk(Self::choice(first, logprobs, None), None));
    }

    /// More of the current call's arguments.
    fn call_arguments(&mut self, fragment: String, logprobs: Option<Value>, out: &mut Vec<Bytes>) {
        let Some(calls) = self.calls.as_ref() else { return };
        let index = calls.count.saturating_sub(1);
        let args = json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]});
        out.push(self.frame.chunk(Self::choice(args, logprobs, None), None));
    }
}

impl Encoder for ChatEncoder {
    fn start(&mut self, out: &mut Vec<Bytes>) {
        let delta = json!({"role": "assistant", "content": ""});
        out.push(self.frame.chunk(Self::choice(delta, None, None), None));
    }

    fn step(&mut self, step: Step, out: &mut Vec<Bytes>) {
        match step {
            Step::Token { text, logprob } => {
                let logprobs = logprob.as_ref().map(|lp| json!({"content": [chat_logprob(lp)], "refusal": null}));
                let Some(calls) = self.calls.as_mut() else {
                    if text.is_empty() && logprobs.is_none() {
                        return;
                    }
                    out.push(self.frame.chunk(Self::choice(json!({"content": text}), logprobs, None), None));
                    return;
                };
                let pieces = calls.parser.push(&text);
                self.pieces(pieces, logprobs, out);
            }
            Step::Done { finish_reason, usage, .. } => {
                let mut reason = finish_reason.as_str();
                if let Some(calls) = self.calls.as_mut() {
                    let pieces = calls.parser.finish();
                    self.pieces(pieces, None, out);
                    // Trailing blank text of a plain answer is content.
                    if let Some(c) = self.calls.as_mut().filter(|c| c.count == 0 && !c.blank.is_empty()) {
                        let blank = std::mem::take(&mut c.blank);
                        out.push(self.frame.chunk(Self::choice(json!({"content": blank}), None, None), None));
                    }
                    if self.calls.as_ref().is_some_and(|c| c.count > 0) && finish_reason == FinishReason::Stop {
                        reason = "tool_calls";
                    }
                }
                let choices = json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": reason}]);
                out.push(self.frame.chunk(choices, None));
                if self.frame.closes {
                    self.close(usage, out);
                }
            }
            Step::Failed(e) => stream_error(&e, out),
        }
    }

    fn close(&mut self, usage: Usage, out: &mut Vec<Bytes>) {
        self.frame.close(usage, out);
    }
}

/// `text_completion` stream of one choice.
pub(super) struct CompletionEncoder {
    frame: Frame,
    /// Characters streamed so far (for `text_offset`).
    chars: usize,
}

impl CompletionEncoder {
    /// As [`ChatEncoder::new`], without tool calls.
    pub(super) fn new(head: Head, include_usage: bool, index: usize, closes: bool) -> Self {
        let frame = Frame { head, object: "text_completion", include_usage, index, closes };
        CompletionEncoder { frame, chars: 0 }
    }
}

impl Encoder for CompletionEncoder {
    fn start(&mut self, _out: &mut Vec<Bytes>) {}

    fn step(&mut self, step: Step, out: &mut Vec<Bytes>) {
        match step {
            Step::Token { text, logprob } => {
                if text.is_empty() && logprob.is_none() {
                    return;
                }
                let logprobs = logprob.as_ref().map(|lp| completion_logprobs(std::slice::from_ref(lp), &[self.chars]));
                self.chars += text.chars().count();
                let choices = json!([{
                    "index": 0,
                    "text": text,
                    "logprobs": logprobs,
                    "finish_reason": null,
                }]);
                out.push(self.frame.chunk(choices, None));
            }
            Step::Done { finish_reason, usage, .. } => {
                let choices = json!([{
                    "index": 0,
                    "text": "",
                    "logprobs": null,
                    "finish_reason": finish_reason.as_str(),
                }]);
                out.push(self.frame.chunk(choices, None));
                if self.frame.closes {
                    self.close(usage, out);
                }
            }
            Step::Failed(e) => stream_error(&e, out),
        }
    }

    fn close(&mut self, usage: Usage, out: &mut Vec<Bytes>) {
        self.frame.close(usage, out);
    }
}
