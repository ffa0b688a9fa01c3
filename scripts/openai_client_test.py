#!/usr/bin/env python3
"""The official `openai` Python package against a running `pagekv serve`.

Usage: openai_client_test.py BASE_URL [--api-key KEY] [--wait SECONDS]

BASE_URL is the server's root (http://127.0.0.1:PORT). Waits for /health, then checks with
the client people actually use: the model list, chat completions streaming and not (the same
greedy text both ways, usage in the last chunk), completions streaming and not, a second chat
turn that reports cached prompt tokens, and errors raised as the client's typed exceptions
(an over-long prompt is a BadRequestError with code context_length_exceeded, an unknown model
a NotFoundError, a wrong key an AuthenticationError). Prints one line per check and ends with
"N passed, N failed"; the exit code is non-zero if any check failed.
"""

import argparse
import sys
import time
import traceback
import urllib.request

import openai

TIMEOUT = 180.0


def wait_for_health(base_url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"pagekv serve at {base_url} did not become healthy within {seconds}s")
        time.sleep(0.1)


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


class Checks:
    def __init__(self, base_url: str, api_key: str):
        self.base_url = base_url
        self.api_key = api_key
        self.client = openai.OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0, timeout=TIMEOUT)
        self.model = ""

    def models(self):
        models = list(self.client.models.list())
        check(len(models) == 1, f"one model expected, got {models}")
        self.model = models[0].id
        check(self.client.models.retrieve(self.model).id == self.model, "models.retrieve")
        check(self.model != "", "empty model id")

    def chat(self):
        messages = [{"role": "user", "content": "Name three colors."}]
        whole = self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=24, temperature=0)
        choice = whole.choices[0]
        text = choice.message.content
        check(choice.message.role == "assistant", f"role {choice.message.role}")
        check(bool(text), "empty reply")
        check(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason}")
        u = whole.usage
        check(u.prompt_tokens > 0 and 1 <= u.completion_tokens <= 24, f"usage {u}")
        check(u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}")

        stream = self.client.chat.completions.create(
            model=self.model,
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        parts, finish, usage = [], None, None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                if c.delta.content:
                    parts.append(c.delta.content)
                if c.finish_reason:
                    finish = c.finish_reason
        check("".join(parts) == text, f"streamed {''.join(parts)!r} != {text!r}")
        check(finish == choice.finish_reason, f"streamed finish {finish} != {choice.finish_reason}")
        check(usage is not None and usage.completion_tokens == u.completion_tokens, f"streamed usage {usage}")

    def completions(self):
        whole = self.client.completions.create(
            model=self.model, prompt="The capital of France is", max_tokens=8, temperature=0
        )
        text = whole.choices[0].text
        check("Paris" in text, f"completion {text!r}")
        parts = []
        for chunk in self.client.completions.create(
            model=self.model, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
        ):
            parts.extend(c.text for c in chunk.choices)
        check("".join(parts) == text, f"streamed {''.join(parts)!r} != {text!r}")

    def second_turn_is_cached(self):
        turn = [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "Write two sentences about the sea."},
        ]
        first = self.client.chat.completions.create(model=self.model, messages=turn, max_tokens=40, temperature=0)
        turn += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "Now one about mountains."},
        ]
        second = self.client.chat.completions.create(model=self.model, messages=turn, max_tokens=16, temperature=0)
        details = second.usage.prompt_tokens_details
        cached = details.cached_tokens if details is not None else None
        check(cached is not None and cached > 0, f"second turn reports no cached tokens: {second.usage}")
        check(cached <= second.usage.prompt_tokens, f"cached {cached} > prompt {second.usage.prompt_tokens}")

    def over_long_prompt_is_bad_request(self):
        try:
            self.client.completions.create(model=self.model, prompt="the sea and the sky " * 5000, max_tokens=4)
        except openai.BadRequestError as e:
            check(e.status_code == 400, f"status {e.status_code}")
            check(e.code == "context_length_exceeded", f"code {e.code!r}")
        else:
            raise AssertionError("an over-long prompt was accepted")
        try:
            self.client.chat.completions.create(model=self.model, messages=[], max_tokens=4)
        except openai.BadRequestError:
            pass
        else:
            raise AssertionError("empty messages were accepted")

    def unknown_model_is_not_found(self):
        try:
            self.client.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        except openai.NotFoundError as e:
            check(e.code == "model_not_found", f"code {e.code!r}")
        else:
            raise AssertionError("an unknown model was accepted")

    def wrong_key_is_refused(self):
        if not self.api_key or self.api_key == "unused":
            print("  (server runs without --api-key: nothing to refuse)")
            return
        bad = openai.OpenAI(base_url=self.base_url + "/v1", api_key="sk-wrong", max_retries=0, timeout=TIMEOUT)
        try:
            bad.models.list()
        except openai.AuthenticationError as e:
            check(e.status_code == 401, f"status {e.status_code}")
        else:
            raise AssertionError("a wrong API key was accepted")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base_url")
    p.add_argument("--api-key", default="unused")
    p.add_argument("--wait", type=float, default=120.0)
    a = p.parse_args()
    base = a.base_url.rstrip("/")
    wait_for_health(base, a.wait)
    checks = Checks(base, a.api_key)
    order = [
        checks.models,
        checks.chat,
        checks.completions,
        checks.second_turn_is_cached,
        checks.over_long_prompt_is_bad_request,
        checks.unknown_model_is_not_found,
        checks.wrong_key_is_refused,
    ]
    order += [f.__get__(checks) for f in N_CHOICE_CHECKS]
    passed = failed = 0
    for c in order:
        try:
            c()
        except Exception:  # every failure is reported, then the next check runs
            failed += 1
            print(f"FAIL {c.__name__}")
            traceback.print_exc(file=sys.stdout)
        else:
            passed += 1
            print(f"ok   {c.__name__}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


# `n` choices: the server computes the prompt once and forks it into the n continuations.


def n_choices_sampled_are_distinct(self: Checks):
    """n=4 at temperature 1 (seeded): four different answers with indices 0..3, the same
    four when streamed (chunks interleaved, each choice with its own index and finish)."""
    messages = [{"role": "user", "content": "Write a short poem about the sea."}]
    kw = dict(model=self.model, messages=messages, max_tokens=24, temperature=1.0, seed=1234, n=4)
    whole = self.client.chat.completions.create(**kw)
    check([c.index for c in whole.choices] == [0, 1, 2, 3], f"indices {[c.index for c in whole.choices]}")
    texts = [c.message.content for c in whole.choices]
    check(len(set(texts)) == 4, f"expected 4 distinct samples, got {texts}")
    check(all(c.finish_reason in ("stop", "length") for c in whole.choices), "finish reasons")
    u = whole.usage
    check(4 <= u.completion_tokens <= 4 * 24, f"usage sums the choices' tokens: {u}")
    check(u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}")
    parts, finishes, usage = {}, {}, None
    for chunk in self.client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            parts.setdefault(c.index, []).append(c.delta.content or "")
            if c.finish_reason:
                check(c.index not in finishes, f"choice {c.index} finished twice")
                finishes[c.index] = c.finish_reason
    streamed = ["".join(parts.get(i, [])) for i in range(4)]
    check(streamed == texts, f"streamed {streamed} != {texts}")
    check(sorted(finishes) == [0, 1, 2, 3], f"finish chunks {finishes}")
    check(usage is not None and usage.completion_tokens == u.completion_tokens, f"streamed usage {usage}")


def n_choices_greedy_are_identical(self: Checks):
    """n=4 at temperature 0: four identical answers, the n=1 answer, on both endpoints; n=17
    is a 400 naming `n`."""
    messages = [{"role": "user", "content": "Name three colors."}]
    one = self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=16, temperature=0)
    four = self.client.chat.completions.create(
        model=self.model, messages=messages, max_tokens=16, temperature=0, n=4
    )
    texts = [c.message.content for c in four.choices]
    check(texts == [one.choices[0].message.content] * 4, f"expected 4 x {one.choices[0].message.content!r}: {texts}")
    check(four.usage.prompt_tokens == one.usage.prompt_tokens, f"the prompt is counted once: {four.usage}")
    check(four.usage.completion_tokens == 4 * one.usage.completion_tokens, f"usage {four.usage}")
    done = self.client.completions.create(
        model=self.model, prompt="The capital of France is", max_tokens=8, temperature=0, n=4
    )
    check(len({c.text for c in done.choices}) == 1 and len(done.choices) == 4, f"completions {done.choices}")
    try:
        self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=4, n=17)
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.param == "n", f"status {e.status_code}, param {e.param!r}")
    else:
        raise AssertionError("n=17 was accepted")


N_CHOICE_CHECKS = [n_choices_sampled_are_distinct, n_choices_greedy_are_identical]


if __name__ == "__main__":
    sys.exit(main())
