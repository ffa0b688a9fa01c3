//! Template environment tests: Python compatibility, helper functions, `tojson`, fallback.

use super::*;
use crate::gguf::{MetaArray, MetaValue, Metadata};

fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
    pairs.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
}

#[test]
fn chatml_fallback_renders_chatml() {
    let t = ChatTemplate::from_gguf(&Metadata::new()).unwrap();
    assert!(t.is_fallback());
    assert_eq!(t.origin(), TemplateOrigin::ChatMlFallback);
    let out = t.render(&msgs(&[("system", "Be brief."), ("user", "Hi")]), true).unwrap();
    assert_eq!(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    let out = t.render(&msgs(&[("user", "Hi")]), false).unwrap();
    assert_eq!(out, "<|im_start|>user\nHi<|im_end|>\n");
}

#[test]
fn a_base_model_without_template_or_chatml_tokens_has_none() {
    let mut meta = Metadata::new();
    let tokens = ["<pad>", "<eos>", "<bos>", "hello"].map(String::from).to_vec();
    meta.insert("tokenizer.ggml.tokens".into(), MetaValue::Array(MetaArray::String(tokens)));
    let t = ChatTemplate::from_gguf(&meta).unwrap();
    assert_eq!(t.origin(), TemplateOrigin::Missing);
    let err = t.render(&msgs(&[("user", "Hi")]), true).unwrap_err();
    assert!(matches!(err, TemplateError::Missing));
    assert!(err.to_string().contains("--chat-template"), "{err}");
    // With ChatML's tokens in the vocabulary the fallback stays.
    let mut meta = Metadata::new();
    let tokens = ["<|im_start|>", "<|im_end|>"].map(String::from).to_vec();
    meta.insert("tokenizer.ggml.tokens".into(), MetaValue::Array(MetaArray::String(tokens)));
    assert_eq!(ChatTemplate::from_gguf(&meta).unwrap().origin(), TemplateOrigin::ChatMlFallback);
}

#[test]
fn from_gguf_reads_template_and_special_token_texts() {
    let mut meta = Metadata::new();
    let tokens = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    meta.insert("tokenizer.ggml.tokens".into(), MetaValue::Array(MetaArray::String(tokens)));
    meta.insert("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(1));
    meta.insert("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(2));
    meta.insert(
        CHAT_TEMPLATE_KEY.into(),
        MetaValue::String(
            "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}".into(),
        ),
    );
    let t = ChatTemplate::from_gguf(&meta).unwrap();
    assert_eq!(t.origin(), TemplateOrigin::Gguf);
    assert_eq!(t.render(&msgs(&[("user", "a"), ("assistant", "b")]), false).unwrap(), "<s>[user]a</s>[assistant]b</s>");

    let mut bad = Metadata::new();
    bad.insert(CHAT_TEMPLATE_KEY.into(), MetaValue::U32(3));
    assert!(matches!(ChatTemplate::from_gguf(&bad), Err(TemplateError::Metadata(_))));
}

#[test]
fn python_methods_work() {
    let src = "{% for m in messages %}{{ m.content.strip() }}|{{ m.role.startswith('us') }}|{{ m.content.split(',') | length }};{% endfor %}{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }} {% endfor %}{{ 'x'.upper() }}";
    let t = ChatTemplate::new(src).unwrap();
    assert_eq!(t.origin(), TemplateOrigin::Custom);
    let out = t.render(&msgs(&[("user", "  a,b  ")]), false).unwrap();
    // Booleans print as Python does (`True`), as HF templates expect.
    assert_eq!(out, "a,b|True|2;a=1 b=2 X");
}

#[test]
fn trim_and_lstrip_blocks_as_transformers() {
    let src =
        "{% for m in messages %}\n    {% if m.role == 'user' %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}\n";
    let t = ChatTemplate::new(src).unwrap();
    assert_eq!(t.render(&msgs(&[("user", "q")]), false).unwrap(), "q\n");
}

#[test]
fn loop_controls_are_enabled() {
    let src = "{% for m in messages %}{% if m.role == 'stop' %}{% break %}{% endif %}{{ m.content }}{% endfor %}";
    let t = ChatTemplate::new(src).unwrap();
    let out = t.render(&msgs(&[("user", "a"), ("stop", "b"), ("user", "c")]), false).unwrap();
    assert_eq!(out, "a");
}

#[test]
fn raise_exception_fails_the_render_with_its_message() {
    let src =
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok";
    let t = ChatTemplate::new(src).unwrap();
    assert_eq!(t.render(&msgs(&[("user", "a")]), false).unwrap(), "ok");
    let err = t.render(&msgs(&[("assistant", "a")]), false).unwrap_err();
    assert!(matches!(err, TemplateError::Render(_)));
    assert!(err.to_string().contains("Conversation must start with user"), "{err}");
}

#[test]
fn strftime_now_with_fixed_time() {
    let t = ChatTemplate::new("Today Date: {{ strftime_now('%d %b %Y') }}").unwrap().with_fixed_time(1_721_999_109);
    assert_eq!(t.render(&[], false).unwrap(), "Today Date: 26 Jul 2024");
    // The clock version renders a plausible year.
    let live = ChatTemplate::new("{{ strftime_now('%Y') }}").unwrap();
    let year: i32 = live.render(&[], false).unwrap().parse().unwrap();
    assert!(year >= 2024);
}

#[test]
fn tojson_matches_python_json_dumps() {
    let value = r#"{'name': 'f', 'parameters': {'a': 1, 'b': [1, 2.5, true, none], 'c': 'é"<>&\n'}}"#;
    let t = ChatTemplate::new(&format!("{{{{ {value} | tojson }}}}")).unwrap();
    assert_eq!(
        t.render(&[], false).unwrap(),
        "{\"name\": \"f\", \"parameters\": {\"a\": 1, \"b\": [1, 2.5, true, null], \"c\": \"é\\\"<>&\\n\"}}"
    );
    let t = ChatTemplate::new(&format!("{{{{ {value} | tojson(indent=2) }}}}")).unwrap();
    assert_eq!(
        t.render(&[], false).unwrap(),
        "{\n  \"name\": \"f\",\n  \"parameters\": {\n    \"a\": 1,\n    \"b\": [\n      1,\n      2.5,\n      true,\n      null\n    ],\n    \"c\": \"é\\\"<>&\\n\"\n  }\n}"
    );
    let t = ChatTemplate::new("{{ {'z': 1, 'a': []} | tojson(sort_keys=true, separators=[',', ':']) }}").unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "{\"a\":[],\"z\":1}");
    // Messages serialize as role/content objects in field order.
    let t = ChatTemplate::new("{{ messages | tojson }}").unwrap();
    assert_eq!(t.render(&msgs(&[("user", "hi")]), false).unwrap(), "[{\"role\": \"user\", \"content\": \"hi\"}]");
}

#[test]
fn syntax_errors_are_reported_at_construction() {
    let err = ChatTemplate::new("{% for m in messages %}{{ m.content }}").unwrap_err();
    assert!(matches!(err, TemplateError::Syntax(_)), "{err}");
}

/// Tools and tool calls reach the template as `apply_chat_template` passes them: `tools` is
/// undefined without tools, assistant `tool_calls` carry `arguments` objects, tool messages
/// their call id; a Hermes template is recognized, ChatML is not.
#[test]
fn tools_and_tool_calls_render_as_in_transformers() {
    let source = r#"{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}
{%- for m in messages %}[{{ m.role }}]{{ m.content }}
{%- for c in m.tool_calls or [] %}<tool_call>{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}
{%- if m.tool_call_id %}({{ m.tool_call_id }}){% endif %}{% endfor %}"#;
    let t = ChatTemplate::new(source).unwrap();
    assert_eq!(t.tool_call_format(), Some(ToolCallFormat::Hermes));
    assert_eq!(ChatTemplate::new(CHATML_TEMPLATE).unwrap().tool_call_format(), None);
    let mistral = "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}{% endif %}{% for m in messages %}{% if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | tojson }}{% endif %}{% endfor %}";
    assert_eq!(ChatTemplate::new(mistral).unwrap().tool_call_format(), Some(ToolCallFormat::Mistral { args: false }));
    let mistral_args =
        "{% if tools %}{% endif %}{% for c in tool_calls %}[TOOL_CALLS]{{ c.name }}[ARGS]{{ c.arguments }}{% endfor %}";
    let args = ChatTemplate::new(mistral_args).unwrap().tool_call_format();
    assert_eq!(args, Some(ToolCallFormat::Mistral { args: true }));
    let llama = "{% if tools %}<|start_header_id|>user<|end_header_id|>Respond in the format {\"name\": function name, \"parameters\": dictionary}{% endif %}{% for m in messages %}{% if m.role == 'ipython' %}<|start_header_id|>ipython<|end_header_id|>{% endif %}{% endfor %}";
    assert_eq!(ChatTemplate::new(llama).unwrap().tool_call_format(), Some(ToolCallFormat::Llama3Json));

    let call = serde_json::json!({"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}});
    let messages = vec![
        ChatMessage::new("user", "weather?"),
        ChatMessage { tool_calls: Some(vec![call]), ..ChatMessage::new("assistant", "") },
        ChatMessage { tool_call_id: Some("c1".into()), ..ChatMessage::new("tool", "sunny") },
    ];
    let tool = serde_json::json!({"type": "function", "function": {"name": "get_weather", "parameters": {}}});
    let out = t.render_with_tools(&messages, &[tool], false).unwrap();
    assert_eq!(
        out,
        r#"<tools>{"type": "function", "function": {"name": "get_weather", "parameters": {}}}</tools>[user]weather?[assistant]<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>[tool]sunny(c1)"#
    );
    assert_eq!(t.render(&messages[..1], false).unwrap(), "[user]weather?", "no tools: `tools` is undefined");
}
