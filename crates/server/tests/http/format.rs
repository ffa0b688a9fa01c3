//! `response_format` reaches the backend as a grammar on both OpenAI endpoints; bad shapes and
//! schemas the backend cannot compile are 400s naming the field, and the server keeps serving.

use pagekv_server::Grammar;
use serde_json::json;

use crate::client::TestServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_format_becomes_the_requests_grammar() {
    let server = TestServer::start().await;
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let body = json!({
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": true}},
    });
    let r = server.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(server.backend.last_request().grammar, Some(Grammar::JsonSchema { schema, strict: true }));

    let body = json!({"prompt": "x", "max_tokens": 2, "response_format": {"type": "json_object"}});
    assert_eq!(server.post("/v1/completions", &body).await.status, 200);
    assert_eq!(server.backend.last_request().grammar, Some(Grammar::JsonObject));

    let body = json!({"prompt": "x", "max_tokens": 2, "response_format": {"type": "text"}});
    assert_eq!(server.post("/v1/completions", &body).await.status, 200);
    assert_eq!(server.backend.last_request().grammar, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_schemas_and_bad_shapes_are_400s_naming_the_field() {
    let server = TestServer::start().await;
    let chat = |format: serde_json::Value| json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "response_format": format});
    let refused = chat(json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"x-invalid": 1}}}));
    let r = server.post("/v1/chat/completions", &refused).await;
    let e = r.error(400);
    assert_eq!(e["param"], "response_format.json_schema.schema", "{e}");
    assert_eq!(e["code"], "invalid_grammar", "{e}");
    assert!(e["message"].as_str().unwrap().contains("x-invalid"), "{e}");
    for (format, param) in [
        (json!({"type": "xml"}), "response_format.type"),
        (json!({"type": "json_schema"}), "response_format.json_schema"),
        (json!({"type": "json_schema", "json_schema": {"schema": 3}}), "response_format.json_schema.schema"),
    ] {
        let e = server.post("/v1/chat/completions", &chat(format.clone())).await.error(400);
        assert_eq!(e["param"], param, "{format}: {e}");
    }
    let ok = server.post("/v1/chat/completions", &chat(json!({"type": "json_object"}))).await;
    assert_eq!(ok.status, 200, "the server keeps serving");
}
