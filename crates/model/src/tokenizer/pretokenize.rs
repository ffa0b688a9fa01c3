//! Pre-tokenizers of byte-level BPE vocabularies, keyed by `tokenizer.ggml.pre`.
//!
//! A pre-tokenizer cuts text into words before the BPE merges run; merges never cross a word
//! boundary. As in llama.cpp, a pre-tokenizer is a list of regexes applied one after the
//! other: each regex cuts every piece produced so far into matches and the text between
//! them (both kept, nothing dropped). The regexes are llama.cpp's (`llama-vocab.cpp`), so
//! token ids agree with it; where llama.cpp had to rewrite a regex for its own regex engine
//! (tekken, gpt-4o) we use the original from the model's `tokenizer.json`, which Oniguruma
//! runs as written.
//!
//! An unknown name is an error that lists the known ones (`TokenizerError::UnknownPreTokenizer`):
//! a wrong pre-tokenizer silently produces different ids, which is worse than refusing to
//! load. A missing `tokenizer.ggml.pre` means `default`, as in llama.cpp.

/// How one family of vocabularies splits text into words, and the flags llama.cpp ties to it.
#[derive(Debug)]
pub struct PreTokenizerSpec {
    /// The `tokenizer.ggml.pre` values that select this entry.
    pub names: &'static [&'static str],
    /// Regexes applied in order (Oniguruma syntax).
    pub regexes: &'static [&'static str],
    /// A word that is itself in the vocabulary becomes that token without merging (llama3).
    pub ignore_merges: bool,
    /// Default of `add_bos_token` when the metadata does not say.
    pub add_bos: bool,
}

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const PORO: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

/// Every known pre-tokenizer. The first name of each entry is the canonical one.
pub static PRE_TOKENIZERS: &[PreTokenizerSpec] = &[
    PreTokenizerSpec {
        names: &["default"],
        regexes: &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &[
            "gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "jina-v2-es",
            "jina-v2-de", "gigachat", "roberta-bpe", "a.x-4.0", "mellum",
        ],
        regexes: &[GPT2],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &[
            "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b",
        ],
        regexes: &[r"\p{N}", GPT2],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &[
            "llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
            "lfm2",
        ],
        regexes: &[LLAMA3],
        ignore_merges: true,
        add_bos: true,
    },
    PreTokenizerSpec {
        names: &["dbrx", "smaug-bpe"],
        regexes: &[LLAMA3],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"],
        regexes: &[QWEN2],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["deepseek-llm"],
        regexes: &[
            "[\r\n]",
            // Written with escapes where a character has a canonical equivalent (U+1F7D, U+1FD3, U+1FDB,
            // U+2126, U+212A): an editor that normalizes to NFC would otherwise silently change the ranges.
            "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u{1F7D}ᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-\u{1FD3}ῖ-\u{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u{2126}ℨ\u{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
            r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
            r"\s+$",
            r"[一-龥ࠀ-一가-퟿]+",
            r"\p{N}+",
        ],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["deepseek-v3"],
        regexes: &[
            r"\p{N}{1,3}",
            r"[一-龥぀-ゟ゠-ヿ]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
        ],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["deepseek-coder"],
        regexes: &["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["falcon"],
        regexes: &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["chatglm-bpe", "glm4"],
        regexes: &[LLAMA3],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["poro-chat", "bloom", "gpt3-finnish"],
        regexes: &[PORO],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["viking"],
        regexes: &[PORO, r"\p{N}"],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["tekken"],
        regexes: &[TEKKEN],
        ignore_merges: true,
        add_bos: true,
    },
    PreTokenizerSpec {
        names: &["gpt-4o", "llama4"],
        regexes: &[GPT4O],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["chameleon"],
        regexes: &[
            r"<sentinel:[0-9]+>",
            r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
            r"([\t\n]|    |  )",
            r"\p{N}",
            r"[\p{P}!-/:-@\[-`{-~]",
            GPT2,
        ],
        ignore_merges: false,
        add_bos: true,
    },
];

/// The entry for a `tokenizer.ggml.pre` value.
pub fn lookup(name: &str) -> Option<&'static PreTokenizerSpec> {
    PRE_TOKENIZERS.iter().find(|p| p.names.contains(&name))
}

/// All accepted `tokenizer.ggml.pre` values, comma-separated (for error messages).
pub fn known_names() -> String {
    let names: Vec<&str> = PRE_TOKENIZERS.iter().flat_map(|p| p.names.iter().copied()).collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for p in PRE_TOKENIZERS {
            for n in p.names {
                assert!(seen.insert(*n), "pre-tokenizer name {n} listed twice");
            }
        }
        assert!(lookup("smollm").is_some());
        assert!(lookup("llama-bpe").unwrap().ignore_merges);
        assert!(lookup("no-such-thing").is_none());
    }
}
