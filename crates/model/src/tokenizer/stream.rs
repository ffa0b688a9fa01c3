//! `StreamDecoder`: turns ids arriving one at a time into text without ever emitting half
//! a UTF-8 character.
//!
//! A byte-level BPE token can end in the middle of a multi-byte character (an emoji is
//! often two or three tokens), and so can a run of SentencePiece byte tokens. The decoder
//! keeps the bytes of an unfinished character until the token that completes it arrives.
//! Bytes that can never become valid UTF-8 are replaced by U+FFFD as soon as that is
//! certain, so one bad byte does not stall the stream.
//!
//! The decoder holds no reference to the tokenizer (it lives in a per-sequence state next to
//! a shared `Arc<Tokenizer>`), so every call takes the tokenizer. It prints pieces as they
//! are: unlike `Tokenizer::decode` it does not drop a SentencePiece space prefix, because
//! generated text continues a prompt.

use super::{Tokenizer, TokenizerError};

/// Incremental decoder state for one sequence.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>, // [< 4] bytes of a character not yet complete
    skip_special: bool,
}

impl StreamDecoder {
    /// A decoder; with `skip_special`, control and unknown tokens print nothing.
    pub fn new(skip_special: bool) -> StreamDecoder {
        StreamDecoder { pending: Vec::new(), skip_special }
    }

    /// Adds token `id`; returns the text completed by it (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        let piece = tokenizer.piece(id, self.skip_special)?;
        self.pending.extend_from_slice(piece);
        Ok(self.take_complete())
    }

    /// Ends the stream: whatever bytes are still pending (a character that was never
    /// completed) come out as U+FFFD.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }

    /// Number of bytes held back, waiting for the rest of a character.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Removes and returns the longest prefix of `pending` that is finished text.
    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut start = 0; // bytes of `pending` consumed so far
        loop {
            let rest = &self.pending[start..];
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&rest[..valid]));
                    match e.error_len() {
                        // An unfinished character at the end: keep it for the next token.
                        None => {
                            start += valid;
                            break;
                        }
                        // Bytes that no continuation can repair.
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            start += valid + bad;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        debug_assert!(self.pending.len() < 4, "an unfinished UTF-8 char has < 4 bytes");
        out
    }
}
