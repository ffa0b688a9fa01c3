//! OpenAI tool calling against the fake backend (which reports the Hermes format and, when the
//! prompt says `CALL_TOOLS`, writes two calls split across tokens; `CALL_FENCED`, one fenced
//! call): tools and history reach the template, calls come back structured with
//! `finish_reason: "tool_calls"` — whole and as incremental `tool_calls` deltas, arguments as
//! they are generated —, `required` and named functions constrain decoding with a grammar, and
//! bad tool input is a 400 naming the field.

use pagekv_server::{Grammar, ToolCallFormat};
use serde_json::{json, Value};

use crate::client::{SseEvent, TestServer};
use crate::fake::FakeConfig;

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
    ])
}

fn ask(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "CALL_TOOLS please"}], "tools": weather_tools()});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_parsed_out_of_the_text() {
    let server = TestServer::start().await;
    let v = server.post("/v1/chat/completions", &ask(json!({}))).await.ok();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let message = &choice["message"];
    assert_eq!(message["content"], "Checking.");
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{v}");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    assert_eq!(calls[1]["function"], json!({"name": "get_time", "arguments": "{}"}));
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    assert_ne!(calls[0]["id"], calls[1]["id"]);
    // auto: decoding is held to text or well-formed calls.
    let Some(Grammar::Lark(g)) = server.backend.last_request().grammar else { panic!("auto constrains") };
    assert!(g.starts_with("start: call* tail\n") && g.contains("get_weather") && g.contains("get_time"), "{g}");

    // tool_choice none: the same text comes back as text.
    let v = server.post("/v1/chat/completions", &ask(json!({"tool_choice": "none"}))).await.ok();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["message"]["content"].as_str().unwrap().contains("<tool_call>"));
    assert!(v["choices"][0]["message"].get("tool_calls").is_none());
    assert_eq!(server.backend.last_request().grammar, None, "none does not constrain");
}

/// The streamed `tool_calls` deltas, accumulated as OpenAI's clients do: by index, the first
/// delta of a call carrying id, type and name, later ones appending to `arguments`.
fn accumulate(events: &[SseEvent]) -> (String, Vec<(String, String, String)>, String) {
    let (mut content, mut calls, mut finish) = (String::new(), Vec::<(String, String, String)>::new(), String::new());
    for e in events.iter().filter(|e| e.data != "[DONE]") {
        let c = &e.json()["choices"][0];
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
        content.push_str(c["delta"]["content"].as_str().unwrap_or(""));
        for d in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = d["index"].as_u64().unwrap() as usize;
            if i == calls.len() {
                let id = d["id"].as_str().expect("a call's first delta has its id").to_string();
                assert_eq!(d["type"], "function");
                calls.push((id, d["function"]["name"].as_str().unwrap().to_string(), String::new()));
            }
            calls[i].2.push_str(d["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    (content, calls, finish)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_calls_come_as_incremental_deltas() {
    let server = TestServer::start().await;
    let events = server.stream("/v1/chat/completions", &ask(json!({"stream": true}))).await;
    let (content, calls, finish) = accumulate(&events);
    assert_eq!((content.as_str(), finish.as_str()), ("Checking.", "tool_calls"));
    assert_eq!(calls.len(), 2);
    assert_eq!((calls[0].1.as_str(), calls[1].1.as_str()), ("get_weather", "get_time"));
    assert_eq!(serde_json::from_str::<Value>(&calls[0].2).unwrap(), json!({"city": "Paris"}));
    // The first call's arguments stream as the tokens come (the fake cuts them after "Pa").
    let fragments = events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .flat_map(|e| e.json()["choices"][0]["delta"]["tool_calls"].as_array().cloned().unwrap_or_default())
        .filter(|d| d["index"] == 0 && d["function"]["arguments"].as_str().is_some_and(|a| !a.is_empty()))
        .count();
    assert!(fragments >= 2, "arguments in {fragments} delta(s)");
    let whole = server.post("/v1/chat/completions", &ask(json!({}))).await.ok();
    let ids: Vec<&str> = whole["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert!(ids.iter().all(|id| !calls.iter().any(|c| c.0 == *id)), "ids are per request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_call_streams_its_arguments_as_the_whole_response_gives_them() {
    let server = TestServer::start().await;
    let ask = |stream: bool| {
        json!({"messages": [{"role": "user", "content": "CALL_FENCED please"}], "tools": weather_tools(),
               "stream": stream})
    };
    let events = server.stream("/v1/chat/completions", &ask(true)).await;
    let (content, calls, finish) = accumulate(&events);
    assert_eq!((content.as_str(), finish.as_str()), ("", "tool_calls"));
    assert_eq!(calls.len(), 1);
    assert_eq!((calls[0].1.as_str(), calls[0].2.as_str()), ("get_weather", r#"{"city":"Paris","days":[1,2]}"#));
    let fragments = events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .flat_map(|e| e.json()["choices"][0]["delta"]["tool_calls"].as_array().cloned().unwrap_or_default())
        .filter(|d| d["function"]["arguments"].as_str().is_some_and(|a| !a.is_empty()))
        .count();
    assert!(fragments >= 3, "arguments in {fragments} delta(s)");
    let whole = server.post("/v1/chat/completions", &ask(false)).await.ok();
    let message = &whole["choices"][0]["message"];
    assert_eq!(message["content"], Value::Null, "{whole}");
    assert_eq!(message["tool_calls"][0]["function"]["arguments"].as_str(), Some(calls[0].2.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_and_named_choices_constrain_decoding() {
    let server = TestServer::start().await;
    let v = server.post("/v1/chat/completions", &ask(json!({"tool_choice": "required"}))).await.ok();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    let Some(Grammar::Lark(g)) = server.backend.last_request().grammar else { panic!("required constrains") };
    assert!(g.contains("get_weather") && g.contains("get_time") && g.contains("(\"\\n\" call)*"), "{g}");

    let named = json!({"type": "function", "function": {"name": "get_time"}});
    server.post("/v1/chat/completions", &ask(json!({"tool_choice": named, "parallel_tool_calls": false}))).await.ok();
    let Some(Grammar::Lark(g)) = server.backend.last_request().grammar else { panic!("a named function constrains") };
    assert!(g.contains("get_time") && !g.contains("get_weather") && g.contains("calls: call\n"), "{g}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_round_trip_renders_the_history() {
    let server = TestServer::start().await;
    let first = server.post("/v1/chat/completions", &ask(json!({}))).await.ok();
    let calls = first["choices"][0]["message"]["tool_calls"].clone();
    let id = calls[0]["id"].as_str().unwrap().to_string();
    let body = json!({"tools": weather_tools(), "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": calls},
        {"role": "tool", "tool_call_id": id, "content": "{\"temp\": 21}"},
    ]});
    let v = server.post("/v1/chat/completions", &body).await.ok();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "a plain answer: {v}");
    let prompt: String = server.backend.last_request().prompt.iter().filter_map(|&c| char::from_u32(c)).collect();
    assert!(prompt.starts_with("<|tools|>get_weather,get_time\n"), "{prompt}");
    assert!(prompt.contains(&format!("[{id}:get_weather({{\"city\":\"Paris\"}})]")), "{prompt}");
    assert!(prompt.contains(&format!("<|tool|>{{\"temp\": 21}}[result of {id}]")), "{prompt}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tool_input_is_a_400_naming_the_field() {
    let server = TestServer::start().await;
    let missing = json!({"type": "function", "function": {"name": "nope"}});
    for (body, param) in [
        (ask(json!({"tool_choice": missing})), "tool_choice.function.name"),
        (ask(json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]})), "tools[0].function.name"),
        (
            json!({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_x", "content": "r"}]}),
            "messages[1].tool_call_id",
        ),
        (
            json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{"}}]}]}),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (ask(json!({"tool_choice": "required", "response_format": {"type": "json_object"}})), "response_format"),
    ] {
        let e = server.post("/v1/chat/completions", &body).await.error(400);
        assert_eq!(e["param"], param, "{body}: {e}");
    }
    assert_eq!(server.post("/v1/chat/completions", &ask(json!({}))).await.status, 200, "the server keeps serving");

    // A model without a known format: auto still answers (no parsing), required is refused.
    let plain = TestServer::with(Default::default(), FakeConfig { tool_format: None, ..Default::default() }).await;
    let v = plain.post("/v1/chat/completions", &ask(json!({}))).await.ok();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let e = plain.post("/v1/chat/completions", &ask(json!({"tool_choice": "required"}))).await.error(400);
    assert_eq!(e["param"], "tool_choice");
    let _ = ToolCallFormat::Hermes;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_format_under_auto_keeps_its_grammar() {
    let server = TestServer::start().await;
    server.post("/v1/chat/completions", &ask(json!({"response_format": {"type": "json_object"}}))).await.ok();
    assert_eq!(server.backend.last_request().grammar, Some(Grammar::JsonObject));
}
