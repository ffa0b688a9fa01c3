#!/usr/bin/env python3
"""Soak a running `pagekv serve` (run by hand, not in CI; loopback only; bounded in time).

Usage: soak.py BASE_URL --pid PID [--clients 32] [--minutes 10] [--api-key KEY] [--seed S]
               [--disconnect 0.2] [--json]

BASE_URL must be a loopback address (http://127.0.0.1:PORT or http://localhost:PORT); PID is
the server's process id (its resident memory is read from /proc/PID/status). Start the server
with a tool template so the tool requests can call, e.g.
    pagekv serve --port 8080 --chat-template scripts/fixtures/qwen2.5-tools.jinja

CLIENTS threads send requests back to back for MINUTES minutes, each picked at random from:
plain chat, streamed chat, a tool call (OpenAI `tool_choice: required`), a JSON-schema output,
a streamed Anthropic message with tools (`tool_choice: any`), a plain Anthropic message. With
probability DISCONNECT a request is abandoned: the client closes its connection after a random
short delay (mid-stream for streams). Standard library only (http.client), so disconnects are
real socket closes.

Reports:
- server errors: 5xx answers and connection failures (refused, reset, closed, timed out) that
  our own disconnects did not cause — the soak passes only with 0;
- 4xx answers (requests this script got wrong, or the server refusing a valid one) — also 0;
- KV blocks from /metrics (used, free, cached) before and after, the after figures taken once
  the engine is idle — used must be back to its baseline;
- the server's resident memory (VmRSS) at start and end, and its peak during the run.
Exit code 1 if there were server errors, 4xx answers, or used blocks did not return to baseline.
"""

import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 24},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "genres": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["title", "year", "genres"],
    "additionalProperties": False,
}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"],
           "additionalProperties": False}
PROMPTS = [
    "Name three colors.",
    "Write a haiku about the sea.",
    "What is the capital of France?",
    "Explain what a KV cache is in one sentence.",
    "List four fruits and their colors.",
    "Tell me a short joke.",
]


def vm_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Target:
    def __init__(self, base: str, api_key: str):
        u = urllib.parse.urlparse(base)
        if u.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit(f"soak.py only drives a loopback server, not {u.hostname}")
        self.host, self.port = u.hostname, u.port or 80
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
            self.headers["x-api-key"] = api_key
        self.headers["anthropic-version"] = "2023-06-01"

    def conn(self, timeout: float = 300.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(self, path: str) -> str:
        c = self.conn(30)
        try:
            c.request("GET", path, headers=self.headers)
            r = c.getresponse()
            return r.read().decode()
        finally:
            c.close()

    def metrics(self) -> dict:
        out = {}
        for line in self.get("/metrics").splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
        return out


def requests_mix(model: str, rng: random.Random):
    """One request: (kind, path, body, streamed)."""
    prompt = rng.choice(PROMPTS)
    seed = rng.randrange(1 << 30)
    kind = rng.choice(["plain", "stream", "tool", "schema", "anthropic_tool_stream", "anthropic"])
    chat = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": rng.randint(8, 64),
            "temperature": 0.8, "seed": seed}
    if kind == "plain":
        return kind, "/v1/chat/completions", chat, False
    if kind == "stream":
        return kind, "/v1/chat/completions", dict(chat, stream=True, stream_options={"include_usage": True}), True
    if kind == "tool":
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
        body = dict(chat, messages=[{"role": "user", "content": "Weather in Rome?"}], tools=tools,
                    tool_choice="required", max_tokens=48)
        return kind, "/v1/chat/completions", body, rng.random() < 0.5
    if kind == "schema":
        rf = {"type": "json_schema", "json_schema": {"name": "movie", "schema": SCHEMA, "strict": True}}
        return kind, "/v1/chat/completions", dict(chat, response_format=rf, max_tokens=96), False
    anthropic = {"model": model, "max_tokens": rng.randint(8, 48), "temperature": 0.8,
                 "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
                 "messages": [{"role": "user", "content": prompt}]}
    if kind == "anthropic_tool_stream":
        tools = [{"name": "get_weather", "input_schema": WEATHER}]
        body = dict(anthropic, tools=tools, tool_choice={"type": "any"}, stream=True,
                    messages=[{"role": "user", "content": "Weather in Lima?"}])
        return kind, "/v1/messages", body, True
    return kind, "/v1/messages", anthropic, False


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_kind = {}
        self.server_errors = []
        self.client_errors = []
        self.disconnects = 0

    def done(self, kind: str):
        with self.lock:
            self.by_kind[kind] = self.by_kind.get(kind, 0) + 1

    def server_error(self, what: str):
        with self.lock:
            self.server_errors.append(what)

    def client_error(self, what: str):
        with self.lock:
            self.client_errors.append(what)

    def disconnected(self):
        with self.lock:
            self.disconnects += 1


def one_request(target: Target, model: str, rng: random.Random, stats: Stats, disconnect_p: float):
    kind, path, body, streamed = requests_mix(model, rng)
    body["stream"] = streamed
    if not streamed:
        body.pop("stream_options", None)
    abandon = rng.random() < disconnect_p
    c = target.conn()
    try:
        if abandon and not streamed:
            # Send, wait a moment (the request is queued or running), then hang up.
            c.request("POST", path, body=json.dumps(body), headers=target.headers)
            time.sleep(rng.uniform(0.0, 0.5))
            c.close()
            stats.disconnected()
            return
        c.request("POST", path, body=json.dumps(body), headers=target.headers)
        r = c.getresponse()
        if r.status >= 500:
            stats.server_error(f"{kind}: HTTP {r.status} {r.read()[:200]!r}")
            return
        if r.status >= 400:
            stats.client_error(f"{kind}: HTTP {r.status} {r.read()[:300]!r}")
            return
        if streamed:
            stop_after = rng.randint(1, 6) if abandon else None
            lines = 0
            saw_end = False
            while True:
                line = r.readline()
                if not line:
                    break
                if line.startswith(b"data:"):
                    lines += 1
                    if b"[DONE]" in line or b'"message_stop"' in line:
                        saw_end = True
                    if b'"error"' in line and (b'"type":"error"' in line or b'"error":{' in line):
                        stats.server_error(f"{kind}: error event {line[:200]!r}")
                        return
                if stop_after is not None and lines >= stop_after:
                    c.close()
                    stats.disconnected()
                    return
            if not saw_end:
                stats.server_error(f"{kind}: the stream ended without its last event")
                return
        else:
            json.loads(r.read())
        stats.done(kind)
    except (ConnectionError, http.client.HTTPException, TimeoutError, OSError) as e:
        stats.server_error(f"{kind}: {type(e).__name__}: {e}")
    finally:
        c.close()


def wait_idle(target: Target, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        m = target.metrics()
        idle = m.get("pagekv_running_sequences", 0) == 0 and m.get("pagekv_waiting_sequences", 0) == 0 \
            and m.get("pagekv_generations_in_flight", 0) == 0
        if idle or time.monotonic() > deadline:
            return m


def blocks(m: dict) -> dict:
    return {k: int(m.get(f"pagekv_kv_blocks_{k}", -1)) for k in ("capacity", "used", "free", "cached")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base_url")
    ap.add_argument("--pid", type=int, required=True, help="the server's process id (for VmRSS)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--api-key", default="")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--disconnect", type=float, default=0.2, help="probability a request is abandoned")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    a = ap.parse_args()
    if not (1 <= a.clients <= 256) or not (0 < a.minutes <= 120):
        raise SystemExit("--clients must be 1..256 and --minutes in (0, 120]")
    target = Target(a.base_url.rstrip("/"), a.api_key)
    model = json.loads(target.get("/v1/models"))["data"][0]["id"]
    before = wait_idle(target, 60)
    rss_start = vm_rss_kib(a.pid)
    rss_peak = [rss_start]
    stats = Stats()
    end = time.monotonic() + a.minutes * 60

    def client(i: int):
        rng = random.Random(a.seed * 1000 + i)
        while time.monotonic() < end:
            one_request(target, model, rng, stats, a.disconnect)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(a.clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(1.0)
        try:
            rss_peak[0] = max(rss_peak[0], vm_rss_kib(a.pid))
        except (OSError, RuntimeError):
            stats.server_error("the server process is gone")
            break
    for t in threads:
        t.join(timeout=600)
    elapsed = time.monotonic() - started
    after = wait_idle(target, 120)
    rss_end = vm_rss_kib(a.pid)
    b0, b1 = blocks(before), blocks(after)
    report = {
        "clients": a.clients,
        "seconds": round(elapsed, 1),
        "completed": dict(sorted(stats.by_kind.items())),
        "completed_total": sum(stats.by_kind.values()),
        "our_disconnects": stats.disconnects,
        "server_errors": len(stats.server_errors),
        "server_error_examples": stats.server_errors[:5],
        "client_errors_4xx": len(stats.client_errors),
        "client_error_examples": stats.client_errors[:5],
        "kv_blocks_before": b0,
        "kv_blocks_after": b1,
        "kv_used_back_to_baseline": b1["used"] == b0["used"],
        "vmrss_kib": {"start": rss_start, "peak": rss_peak[0], "end": rss_end},
    }
    ok = report["server_errors"] == 0 and report["client_errors_4xx"] == 0 and report["kv_used_back_to_baseline"]
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"soak: {a.clients} clients for {elapsed:.0f} s against {a.base_url} (model {model})")
        print(f"completed: {report['completed_total']} {report['completed']}; our disconnects: {stats.disconnects}")
        print(f"server errors: {report['server_errors']} {report['server_error_examples']}")
        print(f"4xx answers: {report['client_errors_4xx']} {report['client_error_examples']}")
        print(f"KV blocks before: {b0}")
        print(f"KV blocks after:  {b1} (used back to baseline: {report['kv_used_back_to_baseline']})")
        r = report["vmrss_kib"]
        print(f"VmRSS: start {r['start'] / 1024:.1f} MiB, peak {r['peak'] / 1024:.1f} MiB, end {r['end'] / 1024:.1f} MiB")
        print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
