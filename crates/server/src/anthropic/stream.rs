//! The Messages event stream: `message_start`, then content blocks — each
//! `content_block_start`, its `content_block_delta`s, `content_block_stop` — then
//! `message_delta` (stop reason, usage) and `message_stop`; `error` on failure.
//!
//! Without tools the output is one text block, opened at once. With tools the output goes
//! through the model's tool-call parser: text opens a text block when it comes, and each call
//! is a `tool_use` block (`content_block_start` with its id, name and `input: {}`, its
//! arguments as `partial_json` in `input_json_delta`s — one for a call decided whole, several
//! for one streamed as it is generated —, `content_block_stop`), as Anthropic's API streams
//! them.

use bytes::Bytes;
use serde_json::{json, Value};

use super::{stop_reason, tool_use_block, tool_use_id, usage_json};
use crate::error::Dialect;
use crate::generation::{sse_event, Encoder, Step};
use crate::tools::{parser, CallSyntax, Piece, ToolParser};

pub(super) struct MessagesEncoder {
    id: String,
    model: String,
    prompt_tokens: usize,
    /// The tool-call parser, when calls are parsed out of this output.
    parser: Option<Box<dyn ToolParser>>,
    /// Blocks started so far (the next block's index).
    blocks: usize,
    /// A text block is open (its index is `blocks - 1`).
    text_open: bool,
    /// Calls sent so far.
    calls: usize,
    /// Blank text held until it is known whether more text (it belongs to) or a call (it only
    /// lays out) follows.
    blank: String,
}

impl MessagesEncoder {
    pub(super) fn new(id: String, model: String, prompt_tokens: usize, calls: Option<&CallSyntax>) -> Self {
        let parser = calls.map(parser);
        MessagesEncoder {
            id,
            model,
            prompt_tokens,
            parser,
            blocks: 0,
            text_open: false,
            calls: 0,
            blank: String::new(),
        }
    }

    fn event(name: &str, body: Value, out: &mut Vec<Bytes>) {
        out.push(sse_event(name, &body));
    }

    fn open_text(&mut self, out: &mut Vec<Bytes>) {
        if !self.text_open {
            let start = json!({"type": "content_block_start", "index": self.blocks,
                               "content_block": {"type": "text", "text": ""}});
            Self::event("content_block_start", start, out);
            self.blocks += 1;
            self.text_open = true;
        }
    }

    fn close_text(&mut self, out: &mut Vec<Bytes>) {
        if self.text_open {
            Self::event("content_block_stop", json!({"type": "content_block_stop", "index": self.blocks - 1}), out);
            self.text_open = false;
        }
    }

    fn text(&mut self, text: &str, out: &mut Vec<Bytes>) {
        if text.is_empty() {
            return;
        }
        self.open_text(out);
        let delta = json!({"type": "content_block_delta", "index": self.blocks - 1,
                           "delta": {"type": "text_delta", "text": text}});
        Self::event("content_block_delta", delta, out);
    }

    fn pieces(&mut self, pieces: Vec<Piece>, out: &mut Vec<Bytes>) {
        for piece in pieces {
            match piece {
                Piece::Text(t) => {
                    // Blank text around calls is layout (as in the whole response, which trims).
                    let mut text = std::mem::take(&mut self.blank) + &t;
                    let end = text.trim_end().len();
                    self.blank = text.split_off(end);
                    if !(self.calls > 0 && text.trim().is_empty()) {
                        self.text(&text, out);
                    }
                }
                Piece::Call(call) => {
                    let input = tool_use_block(&call, String::new())["input"].to_string();
                    self.begin_tool_use(call.name, out);
                    self.tool_input(input, out);
                    self.end_tool_use(out);
                }
                Piece::CallBegin(name) => self.begin_tool_use(name, out),
                Piece::CallArgs(fragment) => self.tool_input(fragment, out),
                Piece::CallEnd => self.end_tool_use(out),
            }
        }
    }
}

impl MessagesEncoder {
    /// Opens a `tool_use` block (its input comes as `input_json_delta`s).
    fn begin_tool_use(&mut self, name: String, out: &mut Vec<Bytes>) {
        self.blank.clear();
        self.close_text(out);
        let start = json!({"type": "tool_use", "id": tool_use_id(&self.id, self.calls), "name": name, "input": {}});
        Self::event(
            "content_block_start",
            json!({"type": "content_block_start", "index": self.blocks, "content_block": start}),
            out,
        );
    }

    /// More of the open `tool_use` block's input JSON.
    fn tool_input(&mut self, partial_json: String, out: &mut Vec<Bytes>) {
        let delta = json!({"type": "content_block_delta", "index": self.blocks,
                           "delta": {"type": "input_json_delta", "partial_json": partial_json}});
        Self::event("content_block_delta", delta, out);
    }

    fn end_tool_use(&mut self, out: &mut Vec<Bytes>) {
        Self::event("content_block_stop", json!({"type": "content_block_stop", "index": self.blocks}), out);
        self.blocks += 1;
        self.calls += 1;
    }
}

impl Encoder for MessagesEncoder {
    fn start(&mut self, out: &mut Vec<Bytes>) {
        let start = json!({
            "type": "message_start",
            "message": {
                "id": self.id,
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
            },
        });
        Self::event("message_start", start, out);
        if self.parser.is_none() {
            self.open_text(out);
        }
        Self::event("ping", json!({"type": "ping"}), out);
    }

    fn step(&mut self, step: Step, out: &mut Vec<Bytes>) {
        match step {
            Step::Token { text, .. } => match self.parser.as_mut() {
                None => self.text(&text, out),
                Some(p) => {
                    let pieces = p.push(&text);
                    self.pieces(pieces, out);
                }
            },
            Step::Done { finish_reason, stop_sequence, usage } => {
                if let Some(p) = self.parser.as_mut() {
                    let pieces = p.finish();
                    self.pieces(pieces, out);
                    // Trailing blank text of a plain answer is text.
                    if self.calls == 0 {
                        let blank = std::mem::take(&mut self.blank);
                        self.text(&blank, out);
                    }
                    if self.blocks == 0 {
                        self.open_text(out);
                    }
                }
                self.close_text(out);
                let delta = json!({
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": stop_reason(finish_reason, &stop_sequence, self.calls > 0),
                        "stop_sequence": stop_sequence,
                    },
                    "usage": usage_json(&usage),
                });
                Self::event("message_delta", delta, out);
                Self::event("message_stop", json!({"type": "message_stop"}), out);
            }
            Step::Failed(e) => out.push(sse_event("error", &e.body(Dialect::Anthropic))),
        }
    }
}
