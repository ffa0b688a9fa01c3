//! The streaming stop matcher against a naive reference: concatenate every piece, find the
//! first stop string (earliest end, then longest), cut there.

use pagekv_engine::{FinishReason, StopMatcher};
use proptest::prelude::*;

/// Expected emitted text and whether a stop matched.
fn reference(stops: &[String], pieces: &[String]) -> (String, bool) {
    let text: String = pieces.concat();
    let stops: Vec<&String> = stops.iter().filter(|s| !s.is_empty()).collect();
    for end in 0..=text.len() {
        if !text.is_char_boundary(end) {
            continue;
        }
        let head = &text[..end];
        if let Some(s) = stops.iter().filter(|s| head.ends_with(s.as_str())).max_by_key(|s| s.len()) {
            return (head[..end - s.len()].to_string(), true);
        }
    }
    (text, false)
}

fn streamed(stops: &[String], pieces: &[String]) -> (String, bool) {
    let mut m = StopMatcher::new(stops);
    let mut out = String::new();
    let mut received = String::new();
    for p in pieces {
        received.push_str(p);
        let o = m.push(p);
        out.push_str(&o.text);
        // Never more than what arrived, and always a prefix of it.
        assert!(received.starts_with(&out));
        if o.finish == Some(FinishReason::Stop) {
            assert!(m.stopped());
            assert_eq!(m.push("more").text, "");
            return (out, true);
        }
    }
    out.push_str(&m.flush());
    (out, false)
}

/// Text over a small alphabet (so stops actually occur), including a multibyte character.
fn text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(vec!['a', 'b', 'c', 'é', ' ']), 0..max)
        .prop_map(|cs| cs.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn matches_reference(stops in prop::collection::vec(text(4), 0..4), pieces in prop::collection::vec(text(5), 0..12)) {
        prop_assert_eq!(streamed(&stops, &pieces), reference(&stops, &pieces));
    }

    #[test]
    fn emission_is_eager(stops in prop::collection::vec(text(4), 1..3), pieces in prop::collection::vec(text(5), 1..12)) {
        // What is held back after each piece is shorter than the longest stop string.
        let longest = stops.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut m = StopMatcher::new(&stops);
        let (mut recv, mut out) = (0usize, 0usize);
        for p in &pieces {
            recv += p.len();
            let o = m.push(p);
            out += o.text.len();
            if o.finish.is_some() { break; }
            prop_assert!(recv - out < longest.max(1));
        }
    }
}
