//! The default model's chat template against llama.cpp's golden renders: every `chat[]`
//! case of ../shared/reference/smollm2/llamacpp.json renders byte-identically and tokenizes
//! to the same ids. Skipped, with a visible line, when the model or golden file is absent.

use pagekv_model::gguf::GgufFile;
use pagekv_model::template::{ChatMessage, ChatTemplate, TemplateOrigin};
use pagekv_model::tokenizer::Tokenizer;
use serde_json::Value;

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/smollm2/llamacpp.json");

#[test]
fn chat_cases_render_and_tokenize_like_llama_cpp() {
    let Some(model) = pagekv_testkit::default_model("chat golden cases") else { return };
    let file = GgufFile::open(&model).unwrap();
    let template = ChatTemplate::from_gguf(file.metadata()).unwrap();
    assert_eq!(template.origin(), TemplateOrigin::Gguf);
    assert_eq!(template.bos_token(), "<|im_start|>");
    assert_eq!(template.eos_token(), "<|im_end|>");
    let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(GOLDEN).unwrap()).unwrap();

    let cases = golden["chat"].as_array().unwrap();
    for case in cases {
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let rendered = template.render(&messages, true).unwrap();
        assert_eq!(rendered, case["rendered"].as_str().unwrap());
        let want: Vec<u32> = case["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(tok.encode(&rendered, true).unwrap(), want);
        let reply: Vec<u32> =
            case["greedy_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(tok.decode(&reply, true).unwrap(), case["greedy_text"].as_str().unwrap());
    }
    println!("chat: {}/{} cases identical to llama.cpp", cases.len(), cases.len());
}
