//! SentencePiece-style encoding (`tokenizer.ggml.model = "llama"`), as llama.cpp does it.
//!
//! The text (spaces already replaced by `▁`, and a `▁` prepended when the vocabulary asks for
//! a space prefix — see `Tokenizer::encode`) starts as one symbol per character. Then,
//! repeatedly, the adjacent pair whose concatenation is a vocabulary entry with the highest
//! score is merged (ties: the leftmost pair). A final symbol that is not in the vocabulary
//! is spelled with byte tokens `<0xXX>`.
//!
//! This is written here rather than through the `tokenizers` crate: its BPE model orders
//! merges by a rank list, and turning scores into such a list (as Hugging Face's converter
//! does) breaks ties between equal scores by list order instead of by position, so it would
//! not match llama.cpp on every input.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::TokenizerError;

/// One symbol of the working string: a byte range of the text, linked to its neighbours.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize, // byte offset in the text
    len: usize,   // bytes; 0 once merged into its left neighbour
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of `symbols[left]` with `symbols[right]`.
#[derive(Debug)]
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    len: usize, // bytes of the merged text; a stale candidate no longer matches it
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

/// The vocabulary view the SentencePiece algorithm needs.
pub(super) struct SpmEncoder {
    text_to_id: HashMap<String, u32>, // token text → id; the later id wins on duplicates
    scores: Vec<f32>,                 // [vocab]
    byte_ids: [Option<u32>; 256],     // [256] id of <0xXX> (else of the 1-byte text) per byte
    unk_id: Option<u32>,
}

impl SpmEncoder {
    pub(super) fn new(
        tokens: &[String],
        scores: Vec<f32>,
        byte_ids: [Option<u32>; 256],
        unk_id: Option<u32>,
    ) -> SpmEncoder {
        debug_assert_eq!(tokens.len(), scores.len());
        let text_to_id = tokens.iter().enumerate().map(|(id, t)| (t.clone(), id as u32)).collect();
        SpmEncoder { text_to_id, scores, byte_ids, unk_id }
    }

    /// Appends the ids of `text` (already escaped: spaces as `▁`) to `out`.
    pub(super) fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        if text.is_empty() {
            return Ok(());
        }
        // [n_chars] one symbol per character, linked left to right.
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (start, c) in text.char_indices() {
            let index = symbols.len();
            symbols.push(Symbol { start, len: c.len_utf8(), prev: index.checked_sub(1), next: None });
            if index > 0 {
                symbols[index - 1].next = Some(index);
            }
        }

        let mut queue = BinaryHeap::new();
        for i in 1..symbols.len() {
            self.push_bigram(text, &symbols, i - 1, i, &mut queue);
        }
        while let Some(bigram) = queue.pop() {
            let (left, right) = (symbols[bigram.left], symbols[bigram.right]);
            // Skip candidates made stale by an earlier merge of either side.
            if left.len == 0 || right.len == 0 || left.len + right.len != bigram.len {
                continue;
            }
            symbols[bigram.left].len += right.len;
            symbols[bigram.right].len = 0;
            symbols[bigram.left].next = right.next;
            if let Some(n) = right.next {
                symbols[n].prev = Some(bigram.left);
            }
            if let Some(p) = symbols[bigram.left].prev {
                self.push_bigram(text, &symbols, p, bigram.left, &mut queue);
            }
            if let Some(n) = symbols[bigram.left].next {
                self.push_bigram(text, &symbols, bigram.left, n, &mut queue);
            }
        }

        let mut cursor = Some(0);
        while let Some(i) = cursor {
            let s = symbols[i];
            debug_assert!(s.len > 0, "a linked symbol is never empty");
            let piece = &text[s.start..s.start + s.len];
            match self.text_to_id.get(piece) {
                Some(&id) => out.push(id),
                None => self.spell_with_bytes(piece, out)?,
            }
            cursor = s.next;
        }
        Ok(())
    }

    /// Spells a piece that is not in the vocabulary with one byte token per byte. A
    /// vocabulary without byte tokens for some of its bytes (older SentencePiece models
    /// without byte fallback) gets one unknown token for the whole piece instead.
    fn spell_with_bytes(&self, piece: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let bytes = piece.as_bytes();
        if let Some(&missing) = bytes.iter().find(|&&b| self.byte_ids[b as usize].is_none()) {
            return match self.unk_id {
                Some(unk) => {
                    out.push(unk);
                    Ok(())
                }
                None => Err(TokenizerError::MissingByteToken { byte: missing }),
            };
        }
        out.extend(bytes.iter().filter_map(|&b| self.byte_ids[b as usize]));
        Ok(())
    }

    fn push_bigram(&self, text: &str, symbols: &[Symbol], left: usize, right: usize, queue: &mut BinaryHeap<Bigram>) {
        let (l, r) = (symbols[left], symbols[right]);
        debug_assert_eq!(l.start + l.len, r.start, "neighbours are contiguous");
        let merged = &text[l.start..r.start + r.len];
        if let Some(&id) = self.text_to_id.get(merged) {
            queue.push(Bigram { left, right, score: self.scores[id as usize], len: merged.len() });
        }
    }
}
