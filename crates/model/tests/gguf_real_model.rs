//! The default model (SmolLM2-135M-Instruct, Q4_1) opens and reads as the `gguf` Python
//! package (gguf-py, llama.cpp's own reader) reads it: the expected values below were
//! taken from `gguf.GGUFReader` on the same file. Skipped, with a message, when the file
//! is absent.

use pagekv_model::gguf::{GgmlType, GgufFile, MetaValue};

fn open_model() -> Option<GgufFile> {
    let path = pagekv_testkit::default_model("gguf_real_model")?;
    Some(GgufFile::open(&path).expect("the default model must parse"))
}

#[test]
fn default_model_header_and_metadata() {
    let Some(file) = open_model() else { return };
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 32);
    let m = file.metadata();
    assert_eq!(m.len(), 33);
    assert_eq!(m.architecture().unwrap(), "llama");
    assert_eq!(m.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(m.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(m.get_u32("llama.feed_forward_length").unwrap(), 1536);
    assert_eq!(m.get_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(m.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(m.get_u32("llama.context_length").unwrap(), 8192);
    assert_eq!(m.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
    assert_eq!(m.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap(), 1e-5);
    assert_eq!(m.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(m.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert!(!m.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    assert!(!m.get_bool("tokenizer.ggml.add_space_prefix").unwrap());
    assert_eq!(m.get_u32("tokenizer.ggml.bos_token_id").unwrap(), 1);
    assert_eq!(m.get_u32("tokenizer.ggml.eos_token_id").unwrap(), 2);
    assert_eq!(m.get_u32("tokenizer.ggml.unknown_token_id").unwrap(), 0);
    assert_eq!(m.get_str_array("general.languages").unwrap(), ["en"]);

    let tokens = m.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(&tokens[..3], ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]);
    let token_type = m.get_i32_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(token_type.len(), 49152);
    assert_eq!((token_type[16], token_type[17]), (3, 1)); // control, then normal
    let merges = m.get_str_array("tokenizer.ggml.merges").unwrap();
    assert_eq!(merges.len(), 48900);
    assert_eq!(&merges[..2], ["Ġ t", "Ġ a"]);
    assert!(m.get_str("tokenizer.chat_template").unwrap().contains("<|im_start|>assistant"));
    // File order of the first and last keys.
    let keys: Vec<&str> = m.iter().map(|(k, _)| k).collect();
    assert_eq!(keys.first(), Some(&"general.architecture"));
    assert_eq!(keys.last(), Some(&"general.quantization_version"));
    assert!(matches!(m.get("general.file_type"), Some(MetaValue::U32(3))));
}

#[test]
fn default_model_tensors() {
    let Some(file) = open_model() else { return };
    let tensors = file.tensors();
    assert_eq!(tensors.len(), 272);
    let count = |ty| tensors.iter().filter(|t| t.ggml_type == ty).count();
    assert_eq!((count(GgmlType::Q4_1), count(GgmlType::F32), count(GgmlType::Q8_0)), (210, 61, 1));

    let embd = file.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.dims, [576, 49152]);
    assert_eq!(embd.ggml_type, GgmlType::Q8_0);
    assert_eq!((embd.offset, embd.n_bytes), (1785664, 30081024));
    assert_eq!(file.data_start(), embd.offset); // first tensor in the data section

    let down = file.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!(down.dims, [1536, 576]);
    assert_eq!(down.ggml_type, GgmlType::Q4_1);
    assert_eq!((down.offset, down.n_bytes), (31868992, 552960));

    let q = file.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!((q.dims.as_slice(), q.ggml_type), (&[576u64, 576][..], GgmlType::Q4_1));
    let k = file.tensor("blk.29.attn_k.weight").unwrap();
    assert_eq!(k.dims, [576, 192]);

    let norm = file.tensor("output_norm.weight").unwrap();
    assert_eq!((norm.offset, norm.n_bytes), (98360128, 2304));
    assert_eq!(norm.offset + norm.n_bytes, file.len()); // the last tensor ends the file
                                                        // RMSNorm weights are ordinary finite floats.
    let data = file.tensor_data(norm);
    assert_eq!(data.len(), 2304);
    assert!(data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .all(|w| w.is_finite() && w.abs() < 100.0));
    // Tied embeddings: no separate output matrix.
    assert!(file.tensor("output.weight").is_none());
}
