//! Served model names (`ServerConfig::served_model_names`): the first is reported, aliases are
//! accepted and echoed, `*` accepts anything, anything else is a 404 — on every endpoint.

use pagekv_server::ServerConfig;
use serde_json::json;

use crate::client::TestServer;
use crate::fake::{FakeConfig, MODEL};

fn config(names: &[&str]) -> ServerConfig {
    ServerConfig { served_model_names: names.iter().map(|s| s.to_string()).collect(), ..Default::default() }
}

async fn chat_status(server: &TestServer, model: &str) -> (u16, serde_json::Value) {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let r = server.post("/v1/chat/completions", &body).await;
    (r.status, r.json())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliases_are_accepted_and_the_first_is_reported() {
    let server = TestServer::with(config(&["gpt-4o-mini", "local"]), FakeConfig::default()).await;
    let v = server.get("/v1/models").await.json();
    assert_eq!(v["data"].as_array().unwrap().len(), 1);
    assert_eq!(v["data"][0]["id"], "gpt-4o-mini");
    assert_eq!(server.get("/v1/models/local").await.json()["id"], "local");
    assert_eq!(server.get(&format!("/v1/models/{MODEL}")).await.status, 404);

    for name in ["gpt-4o-mini", "local"] {
        let (status, v) = chat_status(&server, name).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["model"], name, "the response echoes the name asked for");
    }
    let (status, v) = chat_status(&server, MODEL).await;
    assert_eq!((status, v["error"]["code"].as_str()), (404, Some("model_not_found")), "the file stem is replaced");

    let r = server.post("/v1/completions", &json!({"model": "local", "prompt": "x", "max_tokens": 1})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let body = json!({"model": "local", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    let r = server.post("/v1/messages", &body).await;
    assert_eq!((r.status, r.json()["model"].clone()), (200, json!("local")));
    let body = json!({"model": "claude-x", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    let r = server.post("/v1/messages", &body).await;
    assert_eq!((r.status, r.json()["error"]["type"].clone()), (404, json!("not_found_error")));
    let metrics = server.get("/metrics").await.text();
    assert!(metrics.contains("gpt-4o-mini"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcard_accepts_every_name() {
    let server = TestServer::with(config(&["*"]), FakeConfig::default()).await;
    assert_eq!(server.get("/v1/models").await.json()["data"][0]["id"], MODEL);
    for name in ["claude-sonnet-4-5", MODEL, "gpt-5"] {
        let (status, v) = chat_status(&server, name).await;
        assert_eq!((status, v["model"].clone()), (200, json!(name)));
    }
    assert_eq!(server.get("/v1/models/anything").await.status, 200);
}
