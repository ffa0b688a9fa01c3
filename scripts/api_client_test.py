#!/usr/bin/env python3
"""Tools, JSON-schema outputs and model names with the official `openai` and `anthropic`
Python clients against real `pagekv serve` processes that this script starts (loopback only).

Usage: api_client_test.py PAGEKV_BINARY [--model NAME|FILE] [--samples N]

Starts two servers on 127.0.0.1 (port 0):
- one with a Hermes tool template (scripts/fixtures/qwen2.5-tools.jinja: Qwen 2.5's template,
  so any ChatML model — SmolLM2 by default — writes `<tool_call>` blocks) and
  `--served-model-name smol,alias-a`;
- one with `--served-model-name '*'`.
Then checks:
- a tool round trip (call -> tool result -> final answer), streamed and not, on both APIs,
  with `tool_choice` required / any so the model must call: the call parses, names the tool
  and its arguments validate against the tool's schema (Python `jsonschema`);
- Claude Code's request shape (system blocks with `cache_control`, `metadata`), and
  `count_tokens` counting tools;
- `response_format` `json_schema` strict: N seeded samples at temperature 1 (default 50), each
  parses and validates — 100 % of them;
- served names: the first is listed, an alias is accepted, an unknown name is a 404; `'*'`
  accepts any name on both APIs.
Prints one line per check and "N passed, N failed"; exits non-zero if any failed.
"""

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
import traceback

import anthropic
import jsonschema
import openai

TIMEOUT = 300.0
HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "fixtures", "qwen2.5-tools.jinja")

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}},
    "required": ["city"],
    "additionalProperties": False,
}
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": WEATHER_SCHEMA,
            "strict": True,
        },
    }
]
ANTHROPIC_TOOLS = [
    {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "input_schema": WEATHER_SCHEMA,
        "cache_control": {"type": "ephemeral"},
    }
]
QUESTION = "What is the weather in Paris right now?"
RESULT = '{"city": "Paris", "temperature_c": 21, "sky": "sunny"}'

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "enum": ["Paris", "Rome", "Tokyo", "Lima"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "tags"],
    "additionalProperties": False,
}


class Server:
    """A `pagekv serve` child process on a free loopback port."""

    def __init__(self, binary: str, args: list):
        self.log_path = f"/tmp/pagekv-api-test-{os.getpid()}-{len(args)}-{time.monotonic_ns()}.log"
        self.log = open(self.log_path, "w+")
        self.proc = subprocess.Popen([binary, "serve", "--port", "0", *args], stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 240
        self.addr = None
        while time.monotonic() < deadline:
            with open(self.log_path) as f:
                for line in f:
                    if line.startswith("pagekv: listening on "):
                        self.addr = line.split("listening on ", 1)[1].strip()
            if self.addr:
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        if not self.addr:
            self.stop()
            raise SystemExit(f"pagekv serve did not start:\n{open(self.log_path).read()}")
        self.base = self.addr if self.addr.startswith("http") else f"http://{self.addr}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()

    def tail(self) -> str:
        with open(self.log_path) as f:
            return "".join(f.readlines()[-30:])


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def valid(instance, schema) -> bool:
    try:
        jsonschema.validate(instance, schema)
        return True
    except jsonschema.ValidationError:
        return False


class Checks:
    def __init__(self, tools_server: Server, any_server: Server, samples: int):
        self.samples = samples
        self.oa = openai.OpenAI(base_url=tools_server.base + "/v1", api_key="x", max_retries=0, timeout=TIMEOUT)
        self.an = anthropic.Anthropic(base_url=tools_server.base, api_key="x", max_retries=0, timeout=TIMEOUT)
        self.oa_any = openai.OpenAI(base_url=any_server.base + "/v1", api_key="x", max_retries=0, timeout=TIMEOUT)
        self.an_any = anthropic.Anthropic(base_url=any_server.base, api_key="x", max_retries=0, timeout=TIMEOUT)

    # ---- OpenAI ------------------------------------------------------------------------------

    def _openai_call(self, stream: bool):
        messages = [{"role": "user", "content": QUESTION}]
        kwargs = dict(model="alias-a", messages=messages, tools=OPENAI_TOOLS, tool_choice="required",
                      temperature=0, max_tokens=64)
        if not stream:
            r = self.oa.chat.completions.create(**kwargs)
            choice = r.choices[0]
            check(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason}")
            calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls]
        else:
            calls, finish = {}, None
            for chunk in self.oa.chat.completions.create(stream=True, **kwargs):
                if not chunk.choices:
                    continue
                c = chunk.choices[0]
                finish = c.finish_reason or finish
                for d in c.delta.tool_calls or []:
                    entry = calls.setdefault(d.index, ["", "", ""])
                    entry[0] = d.id or entry[0]
                    entry[1] += (d.function.name or "") if d.function else ""
                    entry[2] += (d.function.arguments or "") if d.function else ""
            check(finish == "tool_calls", f"streamed finish_reason {finish}")
            calls = [tuple(calls[i]) for i in sorted(calls)]
        check(len(calls) >= 1, f"a call: {calls}")
        call_id, name, arguments = calls[0]
        check(name == "get_weather", f"name {name}")
        args = json.loads(arguments)
        check(valid(args, WEATHER_SCHEMA), f"arguments {args} validate")
        # The result goes back; the final answer is text.
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call_id, "content": RESULT},
        ]
        final = dict(model="smol", messages=messages, tools=OPENAI_TOOLS, tool_choice="none", temperature=0,
                     max_tokens=40)
        if stream:
            text = "".join(ch.choices[0].delta.content or "" for ch in
                           self.oa.chat.completions.create(stream=True, **final) if ch.choices)
        else:
            r = self.oa.chat.completions.create(**final)
            check(not r.choices[0].message.tool_calls, "no call in the final answer")
            text = r.choices[0].message.content
        check(isinstance(text, str) and text.strip() != "", f"final answer {text!r}")
        return f"{name}({arguments}) -> {text[:40]!r}"

    def openai_tool_round_trip(self):
        return self._openai_call(stream=False)

    def openai_tool_round_trip_streamed(self):
        return self._openai_call(stream=True)

    # ---- Anthropic ---------------------------------------------------------------------------

    def _anthropic_call(self, stream: bool):
        system = [{"type": "text", "text": "You are a helpful assistant.", "cache_control": {"type": "ephemeral"}}]
        messages = [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}]
        kwargs = dict(model="alias-a", max_tokens=64, system=system, messages=messages, tools=ANTHROPIC_TOOLS,
                      tool_choice={"type": "any", "disable_parallel_tool_use": True}, metadata={"user_id": "user_ci"},
                      # Newer SDKs dropped `temperature` from the signature; the API still takes it.
                      extra_body={"temperature": 0})
        if stream:
            with self.an.messages.stream(**kwargs) as s:
                msg = s.get_final_message()
        else:
            msg = self.an.messages.create(**kwargs)
        check(msg.stop_reason == "tool_use", f"stop_reason {msg.stop_reason}")
        uses = [b for b in msg.content if b.type == "tool_use"]
        check(len(uses) >= 1 and uses[0].name == "get_weather", f"tool_use blocks {msg.content}")
        check(uses[0].id.startswith("toolu_"), f"id {uses[0].id}")
        check(valid(uses[0].input, WEATHER_SCHEMA), f"input {uses[0].input} validates")
        messages += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": RESULT}]},
        ]
        final = dict(kwargs, messages=messages, tool_choice={"type": "none"}, max_tokens=40)
        if stream:
            with self.an.messages.stream(**final) as s:
                answer = s.get_final_message()
        else:
            answer = self.an.messages.create(**final)
        check(answer.stop_reason in ("end_turn", "max_tokens"), f"final stop_reason {answer.stop_reason}")
        text = "".join(b.text for b in answer.content if b.type == "text")
        check(text.strip() != "" and all(b.type == "text" for b in answer.content), f"final answer {answer.content}")
        return f"{uses[0].name}({json.dumps(uses[0].input)}) -> {text[:40]!r}"

    def anthropic_tool_round_trip(self):
        return self._anthropic_call(stream=False)

    def anthropic_tool_round_trip_streamed(self):
        return self._anthropic_call(stream=True)

    def anthropic_count_tokens_counts_tools(self):
        messages = [{"role": "user", "content": QUESTION}]
        plain = self.an.messages.count_tokens(model="smol", messages=messages).input_tokens
        with_tools = self.an.messages.count_tokens(model="smol", messages=messages, tools=ANTHROPIC_TOOLS).input_tokens
        check(with_tools > plain > 0, f"{with_tools} > {plain}")
        return f"{plain} -> {with_tools} tokens"

    def anthropic_bad_tool_input_is_a_400(self):
        bad = [{"name": "f", "input_schema": {"type": "object", "properties": {"x": {"type": "text"}}}}]
        try:
            self.an.messages.create(model="smol", max_tokens=8, tools=bad, messages=[{"role": "user", "content": "x"}])
        except anthropic.BadRequestError as e:
            check("tools[0].input_schema.properties.x.type" in str(e), f"names the field: {e}")
            return "BadRequestError naming the field"
        raise AssertionError("no error")

    # ---- JSON schema ---------------------------------------------------------------------------

    def json_schema_strict_samples_all_validate(self):
        def sample(seed: int):
            r = self.oa.chat.completions.create(
                model="smol",
                messages=[{"role": "user", "content": "Invent a person. Answer in JSON."}],
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True}},
                temperature=1.0, seed=seed, max_tokens=160)
            c = r.choices[0]
            try:
                v = json.loads(c.message.content)
            except json.JSONDecodeError:
                return seed, c.finish_reason, c.message.content, False
            return seed, c.finish_reason, c.message.content, valid(v, PERSON_SCHEMA)

        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(sample, range(self.samples)))
        bad = [r for r in results if not (r[3] and r[1] == "stop")]
        distinct = len({r[2] for r in results})
        check(not bad, f"{len(bad)} of {len(results)} invalid, e.g. {bad[:2]}")
        check(distinct > 1, "seeded samples at temperature 1 differ")
        return f"{len(results)}/{len(results)} valid, {distinct} distinct"

    # ---- names ---------------------------------------------------------------------------------

    def served_names_and_aliases(self):
        ids = [m.id for m in self.oa.models.list()]
        check(ids == ["smol"], f"listed {ids}")
        for name in ("smol", "alias-a"):
            r = self.oa.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            check(r.model == name, f"answers as {r.model}")
        try:
            self.oa.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            raise AssertionError("an unknown name was accepted")
        except openai.NotFoundError:
            pass
        try:
            self.an.messages.create(model="claude-x", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
            raise AssertionError("an unknown name was accepted")
        except anthropic.NotFoundError:
            pass
        return f"listed {ids}; alias accepted; unknown names 404 on both APIs"

    def wildcard_accepts_any_name(self):
        for name in ("gpt-4o", "my-local-model"):
            r = self.oa_any.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=2)
            check(r.choices[0].message.content is not None, "an answer")
        m = self.an_any.messages.create(model="claude-sonnet-4-5", max_tokens=2,
                                        messages=[{"role": "user", "content": "hi"}])
        check(m.content[0].type == "text", f"{m.content}")
        return "any name accepted on both APIs"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--model", default=None, help="model name or file (default: pagekv's default)")
    ap.add_argument("--samples", type=int, default=50)
    a = ap.parse_args()
    common = ["--context-window", "2048", "--num-blocks", "512"] + (["--model", a.model] if a.model else [])
    tools_server = Server(a.binary, common + ["--chat-template", TEMPLATE, "--served-model-name", "smol,alias-a"])
    try:
        any_server = Server(a.binary, common + ["--served-model-name", "*"])
    except SystemExit:
        tools_server.stop()
        raise
    passed = failed = 0
    try:
        checks = Checks(tools_server, any_server, a.samples)
        names = [n for n in dir(Checks) if not n.startswith("_") and callable(getattr(Checks, n))]
        order = sorted(names, key=lambda n: list(Checks.__dict__).index(n))
        for name in order:
            start = time.monotonic()
            try:
                detail = getattr(checks, name)()
                passed += 1
                print(f"ok   {name} ({time.monotonic() - start:.1f}s): {detail}", flush=True)
            except Exception:
                failed += 1
                print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
    finally:
        tools_server.stop()
        any_server.stop()
    if failed:
        print(f"--- server log tail ---\n{tools_server.tail()}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
