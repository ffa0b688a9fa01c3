//! Cutting special tokens (`<|im_start|>`, `<|eot_id|>`, ...) out of text before the
//! subword model runs, as llama.cpp's `tokenizer_st_partition` does.
//!
//! Candidates are control, unknown and user-defined tokens. They are tried longest text
//! first (ties: lower id first); each one splits every remaining run of plain text at all
//! its occurrences, left to right. Control and unknown tokens are only recognized when the
//! caller asks to parse special tokens; user-defined tokens always are (they are ordinary
//! words the vocabulary wants kept whole).

use super::vocab::TokenType;

/// A piece of the input: plain text for the subword model, or a token already decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

#[derive(Debug)]
struct Candidate {
    id: u32,
    text: String,
    always: bool, // user-defined: recognized even when special tokens are not parsed
}

/// The special tokens of a vocabulary, in matching order.
#[derive(Debug)]
pub(super) struct SpecialMatcher {
    candidates: Vec<Candidate>, // longest text first, then lower id
}

impl SpecialMatcher {
    /// Collects the candidates from `tokens[id]` / `types[id]` (equal lengths).
    pub(super) fn new(tokens: &[String], types: &[TokenType]) -> SpecialMatcher {
        debug_assert_eq!(tokens.len(), types.len());
        let mut candidates: Vec<Candidate> = tokens
            .iter()
            .zip(types)
            .enumerate()
            .filter(|(_, (text, _))| !text.is_empty())
            .filter_map(|(id, (text, ty))| {
                let always = match ty {
                    TokenType::UserDefined => true,
                    TokenType::Control | TokenType::Unknown => false,
                    _ => return None,
                };
                Some(Candidate { id: id as u32, text: text.clone(), always })
            })
            .collect();
        candidates.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
        SpecialMatcher { candidates }
    }

    /// Splits `text` into plain runs and special tokens. Plain runs are never empty.
    pub(super) fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let mut fragments = Vec::new();
        if !text.is_empty() {
            fragments.push(Fragment::Text(text));
        }
        let mut next = Vec::new();
        for cand in &self.candidates {
            if !(parse_special || cand.always) {
                continue;
            }
            // Cheap test first: most candidates occur nowhere.
            let occurs = fragments.iter().any(|f| matches!(f, Fragment::Text(t) if t.contains(cand.text.as_str())));
            if !occurs {
                continue;
            }
            next.clear();
            for &fragment in &fragments {
                let Fragment::Text(mut rest) = fragment else {
                    next.push(fragment);
                    continue;
                };
                while let Some(pos) = rest.find(cand.text.as_str()) {
                    if pos > 0 {
                        next.push(Fragment::Text(&rest[..pos]));
                    }
                    next.push(Fragment::Token(cand.id));
                    rest = &rest[pos + cand.text.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            std::mem::swap(&mut fragments, &mut next);
        }
        fragments
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Fragment::{Text, Token};

    fn matcher() -> SpecialMatcher {
        let tokens: Vec<String> =
            ["a", "<s>", "<|im_start|>", "<|im", "<tool>", ""].iter().map(|s| s.to_string()).collect();
        let types = [
            TokenType::Normal,
            TokenType::Control,
            TokenType::Control,
            TokenType::Control,
            TokenType::UserDefined,
            TokenType::Control,
        ];
        SpecialMatcher::new(&tokens, &types)
    }

    #[test]
    fn longest_candidate_wins_and_text_between_is_kept() {
        let m = matcher();
        assert_eq!(
            m.partition("x<|im_start|>y<|imz<s><s>", true),
            vec![Text("x"), Token(2), Text("y"), Token(3), Text("z"), Token(1), Token(1)]
        );
    }

    #[test]
    fn control_tokens_only_when_parsing_special_user_defined_always() {
        let m = matcher();
        assert_eq!(m.partition("<s>a<tool>b", false), vec![Text("<s>a"), Token(4), Text("b")]);
        assert_eq!(m.partition("<s>a<tool>b", true), vec![Token(1), Text("a"), Token(4), Text("b")]);
        assert_eq!(m.partition("", true), vec![]);
    }
}
