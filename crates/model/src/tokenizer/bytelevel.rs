//! The GPT-2 byte ↔ character map of byte-level BPE vocabularies.
//!
//! Byte-level BPE stores every token as a string of 256 "printable" stand-in characters, one
//! per byte: printable Latin-1 bytes stand for themselves, the other 68 bytes (controls,
//! space, 0x7F–0xA0, 0xAD) map to U+0100 onwards in byte order. So a space is `Ġ` (U+0120)
//! and a newline `Ċ` (U+010A). Encoding maps text bytes to these characters before the
//! merges (the `tokenizers` crate's `ByteLevel` pre-tokenizer does that for us); decoding
//! maps a token's characters back to bytes, which is done here.

/// The stand-in character of byte `b`.
pub fn byte_to_char(b: u8) -> char {
    if is_self_mapped(b) {
        char::from(b)
    } else {
        // The n-th byte that is not self-mapped (in byte order) maps to U+0100 + n.
        let n = (0..b).filter(|&x| !is_self_mapped(x)).count() as u32;
        char::from_u32(0x100 + n).expect("U+0100..U+0143 are valid chars")
    }
}

/// The byte that stand-in character `c` represents, or `None` if `c` is not one of the 256.
/// The plain definition; decoding uses the table in `char_to_byte_fast`, tested against it.
#[cfg(test)]
pub fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 256 && is_self_mapped(cp as u8) {
        return Some(cp as u8);
    }
    let n = cp.checked_sub(0x100)?;
    (0..=255u8).filter(|&x| !is_self_mapped(x)).nth(n as usize)
}

/// Decodes a byte-level token text to the bytes it stands for. A character outside the map
/// (not produced by a byte-level vocabulary, but possible in a hand-made one) is kept as its
/// own UTF-8 bytes rather than dropped.
pub fn decode_token_text(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match char_to_byte_fast(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out
}

/// Bytes that stand for themselves: `!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`.
fn is_self_mapped(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// `char_to_byte` through a table built once (decoding a 50k-token vocabulary calls it
/// hundreds of thousands of times).
fn char_to_byte_fast(c: char) -> Option<u8> {
    use std::sync::OnceLock;
    // [0x144] entry i: the byte that char U+i stands for, or -1.
    static TABLE: OnceLock<[i16; 0x144]> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [-1i16; 0x144];
        for b in 0..=255u8 {
            t[byte_to_char(b) as usize] = b as i16;
        }
        t
    });
    let i = c as usize;
    if i < table.len() && table[i] >= 0 {
        Some(table[i] as u8)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_is_a_bijection_onto_256_chars() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c), "byte {b} maps to a char already used");
            assert_eq!(char_to_byte(c), Some(b));
            assert_eq!(char_to_byte_fast(c), Some(b));
        }
        assert_eq!(seen.len(), 256);
    }

    #[test]
    fn known_stand_ins() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'\t'), 'ĉ');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0xAD), 'Ń');
        assert_eq!(char_to_byte('€'), None);
        assert_eq!(decode_token_text("ĠhelloĊ"), b" hello\n");
        // "😀" = F0 9F 98 80 as byte-level text.
        let emoji: String = "😀".bytes().map(byte_to_char).collect();
        assert_eq!(decode_token_text(&emoji), "😀".as_bytes());
    }
}
