#!/usr/bin/env python3
"""How often a model answers a fixed set of tool-use prompts with a valid call, under
`tool_choice: auto` and `required`, through the official `openai` client against a running
`pagekv serve` (loopback only). A measurement, run by hand (not in CI):

    pagekv serve -m qwen2.5-coder-1.5b --port 8080 &
    python3 scripts/tool_use_share.py http://127.0.0.1:8080

A call is valid when the response carries `tool_calls`, every call names one of the offered
tools and its arguments parse as JSON and validate against that tool's schema (`jsonschema`).
Greedy (temperature 0), one request per prompt and mode. Prints one line per request and the
two shares.
"""

import argparse
import json
import sys
import urllib.parse

import jsonschema
import openai

TOOLS = [
    {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    {
        "name": "read_file",
        "description": "Reads a file of the user's project and returns its text.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
            "additionalProperties": False,
        },
    },
    {
        "name": "search_code",
        "description": "Searches the user's project for a regular expression; returns matching lines.",
        "parameters": {
            "type": "object",
            "properties": {"pattern": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1}},
            "required": ["pattern"],
            "additionalProperties": False,
        },
    },
    {
        "name": "run_tests",
        "description": "Runs the project's test suite (optionally one test by name) and returns the output.",
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "additionalProperties": False,
        },
    },
]

PROMPTS = [
    "What's the weather like in Lisbon right now?",
    "Show me what's in src/main.rs.",
    "Find every place in the project that calls `parse_config`.",
    "Run the tests and tell me whether test_login passes.",
    "Is it colder in Oslo or in Helsinki today? Use fahrenheit.",
    "Open README.md and summarize the install steps.",
    "Where do we define the struct `BlockPool`?",
    "Check whether the whole test suite is green.",
]


def valid_calls(message) -> tuple[bool, str]:
    calls = message.tool_calls or []
    if not calls:
        return False, "no call: " + repr((message.content or "")[:60])
    schemas = {t["name"]: t["parameters"] for t in TOOLS}
    for call in calls:
        name = call.function.name
        if name not in schemas:
            return False, f"unknown tool {name!r}"
        try:
            args = json.loads(call.function.arguments)
            jsonschema.validate(args, schemas[name])
        except (json.JSONDecodeError, jsonschema.ValidationError) as e:
            return False, f"{name}: invalid arguments ({type(e).__name__})"
    return True, ", ".join(f"{c.function.name}({c.function.arguments})" for c in calls)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base_url", help="the server, e.g. http://127.0.0.1:8080")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    host = urllib.parse.urlparse(args.base_url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"refusing a non-loopback server: {host}", file=sys.stderr)
        return 2
    client = openai.OpenAI(base_url=args.base_url.rstrip("/") + "/v1", api_key="unused", timeout=600.0)
    model = client.models.list().data[0].id
    tools = [{"type": "function", "function": t} for t in TOOLS]
    shares = {}
    for mode in ("auto", "required"):
        ok = 0
        for prompt in PROMPTS:
            r = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt}],
                tools=tools,
                tool_choice=mode,
                temperature=0,
                max_tokens=args.max_tokens,
            )
            good, what = valid_calls(r.choices[0].message)
            ok += good
            print(f"{mode:8s} {'ok  ' if good else 'FAIL'} {prompt[:50]!r}: {what}")
        shares[mode] = ok / len(PROMPTS)
    print(f"model {model}: valid calls under auto {shares['auto']:.0%}, under required {shares['required']:.0%} "
          f"({len(PROMPTS)} prompts each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
