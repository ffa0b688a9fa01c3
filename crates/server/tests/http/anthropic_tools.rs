//! Anthropic tool use against the fake backend (Hermes format; a prompt with `CALL_TOOLS`
//! makes it write text then two calls split across tokens): `tool_use` blocks with
//! `stop_reason: "tool_use"`, streamed as `content_block_start` / `input_json_delta` /
//! `content_block_stop`; `any` and `tool` constrain decoding with the OpenAI path's grammar;
//! `tool_use` / `tool_result` history renders like OpenAI's `tool_calls` / `tool` messages;
//! Claude Code's request shape is accepted; `count_tokens` counts tools; bad input is a 400
//! in Anthropic's shape whose message names the field.

use pagekv_server::Grammar;
use serde_json::{json, Value};

use crate::client::TestServer;
use crate::fake::MODEL;

fn tools() -> Value {
    json!([
        {"name": "get_weather", "description": "Weather in a city", "cache_control": {"type": "ephemeral"},
         "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
        {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
    ])
}

fn ask(extra: Value) -> Value {
    let mut b = json!({"model": MODEL, "max_tokens": 64, "tools": tools(),
                       "messages": [{"role": "user", "content": "CALL_TOOLS please"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_come_back_as_tool_use_blocks() {
    let server = TestServer::start().await;
    let v = server.post("/v1/messages", &ask(json!({}))).await.ok();
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    let content = v["content"].as_array().unwrap();
    assert_eq!(content.len(), 3, "{v}");
    assert_eq!(content[0], json!({"type": "text", "text": "Checking."}));
    assert_eq!(content[1]["type"], "tool_use");
    assert_eq!(content[1]["name"], "get_weather");
    assert_eq!(content[1]["input"], json!({"city": "Paris"}));
    assert_eq!(content[2]["name"], "get_time");
    assert_eq!(content[2]["input"], json!({}));
    let id = content[1]["id"].as_str().unwrap();
    assert!(id.starts_with("toolu_") && id.len() == "toolu_".len() + 24, "{id}");
    assert_ne!(content[1]["id"], content[2]["id"]);
    // auto: the grammar allows text or calls.
    let Some(Grammar::Lark(g)) = server.backend.last_request().grammar else { panic!("auto sends a grammar") };
    assert!(g.starts_with("start: call* tail\n") && g.contains("get_weather") && g.contains("get_time"), "{g}");

    // none: the same text is text.
    let v = server.post("/v1/messages", &ask(json!({"tool_choice": {"type": "none"}}))).await.ok();
    assert_eq!(v["stop_reason"], "end_turn");
    assert!(v["content"][0]["text"].as_str().unwrap().contains("<tool_call>"));
    assert_eq!(server.backend.last_request().grammar, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_calls_are_tool_use_blocks_with_input_json_deltas() {
    let server = TestServer::start().await;
    let events = server.stream("/v1/messages", &ask(json!({"stream": true}))).await;
    let names: Vec<&str> = events.iter().map(|e| e.event.as_deref().unwrap()).collect();
    assert_eq!(&names[..2], &["message_start", "ping"], "{names:?}");
    assert_eq!(&names[names.len() - 2..], &["message_delta", "message_stop"]);
    // Rebuild the blocks as the anthropic SDK does.
    let mut blocks: Vec<Value> = Vec::new();
    let mut partial: Vec<String> = Vec::new();
    let mut open: Option<usize> = None;
    for e in &events {
        let v = e.json();
        match e.event.as_deref().unwrap() {
            "content_block_start" => {
                let i = v["index"].as_u64().unwrap() as usize;
                assert_eq!((i, open), (blocks.len(), None), "blocks start in order, one at a time");
                blocks.push(v["content_block"].clone());
                partial.push(String::new());
                open = Some(i);
            }
            "content_block_delta" => {
                let i = v["index"].as_u64().unwrap() as usize;
                assert_eq!(Some(i), open);
                match v["delta"]["type"].as_str().unwrap() {
                    "text_delta" => {
                        let t = blocks[i]["text"].as_str().unwrap().to_string() + v["delta"]["text"].as_str().unwrap();
                        blocks[i]["text"] = json!(t);
                    }
                    "input_json_delta" => partial[i].push_str(v["delta"]["partial_json"].as_str().unwrap()),
                    other => panic!("unexpected delta {other}"),
                }
            }
            "content_block_stop" => {
                let i = v["index"].as_u64().unwrap() as usize;
                assert_eq!(Some(i), open);
                if blocks[i]["type"] == "tool_use" {
                    assert_eq!(blocks[i]["input"], json!({}), "input starts empty");
                    blocks[i]["input"] = serde_json::from_str(&partial[i]).unwrap();
                }
                open = None;
            }
            _ => {}
        }
    }
    let whole = server.post("/v1/messages", &ask(json!({}))).await.ok();
    let strip = |b: &Value| {
        let mut b = b.clone();
        b.as_object_mut().unwrap().remove("id");
        b
    };
    let want: Vec<Value> = whole["content"].as_array().unwrap().iter().map(strip).collect();
    assert_eq!(blocks.iter().map(strip).collect::<Vec<_>>(), want);
    let delta = events.iter().find(|e| e.event.as_deref() == Some("message_delta")).unwrap().json();
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_and_named_tools_constrain_like_openai() {
    let server = TestServer::start().await;
    server.post("/v1/messages", &ask(json!({"tool_choice": {"type": "any"}}))).await.ok();
    let any = server.backend.last_request().grammar;
    let openai_tools: Vec<Value> = tools()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| json!({"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}))
        .collect();
    let openai = json!({"messages": [{"role": "user", "content": "CALL_TOOLS please"}], "tools": openai_tools,
                        "tool_choice": "required"});
    server.post("/v1/chat/completions", &openai).await.ok();
    assert_eq!(any, server.backend.last_request().grammar, "any is OpenAI's required");
    let Some(Grammar::Lark(g)) = any else { panic!("any constrains") };
    assert!(g.contains("(\"\\n\" call)*"), "{g}");

    let named = json!({"type": "tool", "name": "get_time", "disable_parallel_tool_use": true});
    server.post("/v1/messages", &ask(json!({"tool_choice": named}))).await.ok();
    let Some(Grammar::Lark(g)) = server.backend.last_request().grammar else { panic!("a named tool constrains") };
    assert!(g.contains("get_time") && !g.contains("get_weather") && g.contains("calls: call\n"), "{g}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_renders_like_openai_and_claude_code_requests_pass() {
    let server = TestServer::start().await;
    let first = server.post("/v1/messages", &ask(json!({}))).await.ok();
    let id = first["content"][1]["id"].as_str().unwrap().to_string();
    let history = json!([
        {"role": "user", "content": [{"type": "text", "text": "weather?", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [first["content"][1].clone()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "{\"temp\": 21}",
                                      "cache_control": {"type": "ephemeral"}}]},
    ]);
    let body = json!({"model": MODEL, "max_tokens": 8, "stream": false, "temperature": 1,
                      "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
                      "metadata": {"user_id": "user_abc_session_1"}, "tools": tools(), "messages": history});
    let v = server.post("/v1/messages", &body).await.ok();
    assert_eq!(v["stop_reason"], "end_turn", "a plain answer: {v}");
    let anthropic_prompt = server.backend.last_request().prompt;

    let call =
        json!({"id": id, "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}});
    let openai_tools: Vec<Value> = tools()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| json!({"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}))
        .collect();
    let openai = json!({"tools": openai_tools, "messages": [
        {"role": "system", "content": "You are Claude Code."},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": id, "content": "{\"temp\": 21}"},
    ]});
    server.post("/v1/chat/completions", &openai).await.ok();
    assert_eq!(anthropic_prompt, server.backend.last_request().prompt, "one rendering path for both APIs");

    // count_tokens counts the tools (the fake's template prints their names).
    let plain = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]});
    let mut with_tools = plain.clone();
    with_tools["tools"] = tools();
    let n = server.post("/v1/messages/count_tokens", &plain).await.ok()["input_tokens"].as_u64().unwrap();
    let t = server.post("/v1/messages/count_tokens", &with_tools).await.ok()["input_tokens"].as_u64().unwrap();
    assert!(t > n, "{t} > {n}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tool_input_is_a_400_naming_the_field() {
    let server = TestServer::start().await;
    let bad_schema = json!([{"name": "f", "input_schema": {"type": "object", "properties": {"x": {"type": "text"}}}}]);
    let orphan =
        json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"}]}]);
    for (body, field) in [
        (ask(json!({"tools": bad_schema})), "tools[0].input_schema.properties.x.type"),
        (ask(json!({"tool_choice": {"type": "tool", "name": "nope"}})), "tool_choice.name"),
        (ask(json!({"messages": orphan})), "messages[0].content[0].tool_use_id"),
    ] {
        let r = server.post("/v1/messages", &body).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        let v = r.json();
        assert_eq!((v["type"].as_str(), v["error"]["type"].as_str()), (Some("error"), Some("invalid_request_error")));
        assert!(v["error"]["message"].as_str().unwrap().contains(field), "{v}");
    }
    let r = server
        .post(
            "/v1/messages/count_tokens",
            &json!({"messages": [{"role": "user", "content": "x"}],
                                                             "tools": [{"name": "f"}]}),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(server.post("/v1/messages", &ask(json!({}))).await.status, 200, "the server keeps serving");
}
