"""What the registry models' `make_reference.py` scripts share: llama.cpp (llama-cpp-python
0.3.36, flash attention off, f16 KV cache, 2 threads, logits_all) run over tokenizer strings, a
teacher-forced text and greedy prompts, written as `llamacpp.json` in the layout the Rust golden
tests (`crates/model/tests/golden/`) read."""
import json
import sys

import numpy as np
import llama_cpp
from llama_cpp import Llama

# Tokenizer strings every model is checked on; each script adds its own special-token strings
# between the two parts (see `tokenizer_texts`).
COMMON_HEAD = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "impl Iterator for Counter {\n    type Item = u32;\n\n    fn next(&mut self) -> Option<Self::Item> {\n"
    "        self.count += 1;\n        if self.count < 6 { Some(self.count) } else { None }\n    }\n}\n",
    "class Stack:\n\tdef __init__(self):\n\t\tself.items = []  # tabs, not spaces\n\n\n\tdef push(self, x): self.items.append(x)",
    "你好，世界！这是一个分词测试。日本語のテキストもあります。한국어 텍스트도 있습니다.",
    "Emoji: 😀 🚀🔥✨ 👨‍👩‍👧‍👦 🇯🇵 👍🏽 — and ❤️ ok",
    "Ünïcödé café naïve résumé — “quotes”, ‘single’, «guillemets» and Привет мир, مرحبا, नमस्ते",
    "Numbers: 3.14159265358979 1234567890123456789 0x1F_FF_00 1e-10 -42 +7 1,000,000.00 2024-12-04 12:30:45",
    "a  b   c    d     e\t\tf\t \tg\n\n\nh \n \n\t \r\n   end   ",
    "Hello!!! ...??? (a[b]{c}) <tag/> && || -> => :: ;; // /* */ @#$%^&*~` '\"' \\n",
]
COMMON_TAIL = [
    "I'm sure you're right, he'll see; she'd've known. WE'VE DON'T They're",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b\\u00e9"}, "url": "https://example.com/p?q=1&r=2#f"}',
    "    leading spaces and trailing spaces    ",
]


def tokenizer_texts(specials, extra=()):
    """The common strings with the model's `specials` (and `extra` ones), ending on ""."""
    return COMMON_HEAD + list(specials) + COMMON_TAIL + list(extra) + [""]


def log_softmax(row):
    x = np.asarray(row, dtype=np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


class Reference:
    def __init__(self, model, n_ctx):
        self.model = model
        self.llm = Llama(model_path=model, n_ctx=n_ctx, n_threads=2, n_threads_batch=2, logits_all=True,
                         verbose=False, flash_attn=False)

    def tok(self, text, add_bos):
        # special=True: special tokens written in the text are parsed, as the engine's prompts
        # do. add_bos=True means "as the vocabulary says" (llama_tokenize's add_special).
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)

    def detok(self, ids):
        return self.llm.detokenize(ids).decode("utf-8", errors="replace")

    def add_bos(self):
        """Whether llama.cpp prepends BOS to a prompt of this model."""
        return len(self.tok("a", add_bos=True)) > len(self.tok("a", add_bos=False))

    def tokenize(self, texts):
        return [{"text": t, "ids": self.tok(t, add_bos=False)} for t in texts]

    def teacher_forced(self, name, text, n_ids):
        """The first `n_ids` ids of `text` (as a prompt) evaluated in one call (llama-cpp-python
        splits it into n_batch=512 chunks): log p of each next id, the argmax, the perplexity."""
        ids = self.tok(text, add_bos=True)[:n_ids]
        self.llm.reset()
        self.llm.eval(ids)
        lps, argmax = [], []
        for i in range(len(ids) - 1):
            row = np.array(self.llm.scores[i], dtype=np.float32)
            lps.append(float(log_softmax(row)[ids[i + 1]]))
            argmax.append(int(np.argmax(row)))
        ppl = float(np.exp(-np.mean(lps)))
        print(f"teacher-forced: {len(ids)} ids, perplexity {ppl:.4f}", file=sys.stderr)
        return {"name": name, "text": text, "ids": ids, "next_token_logprob": [round(x, 5) for x in lps],
                "argmax": argmax, "perplexity": ppl}

    def greedy(self, name, prompt, n_tokens):
        """`n_tokens` argmax tokens after `prompt` (stopping on nothing, EOS included), with the
        two best logits of every step."""
        pids = self.tok(prompt, add_bos=True)
        self.llm.reset()
        self.llm.eval(pids)
        out, top2 = [], []
        for _ in range(n_tokens):
            row = np.array(self.llm.scores[self.llm.n_tokens - 1], dtype=np.float32)
            order = np.argsort(-row, kind="stable")[:2]
            top2.append([[int(j), round(float(row[j]), 5)] for j in order])
            t = int(np.argmax(row))
            out.append(t)
            self.llm.eval([t])
        print(f"greedy {name} ({len(pids)} prompt ids): {self.detok(out)!r}", file=sys.stderr)
        return {"name": name, "prompt": prompt, "prompt_ids": pids, "greedy_ids": out,
                "greedy_text": self.detok(out), "top2_per_step": top2}

    def header(self, note):
        return {
            "generator": f"llama-cpp-python {llama_cpp.__version__} (llama.cpp), n_threads=2, logits_all, flash_attn=False",
            "model": self.model.rsplit("/", 1)[-1],
            "note": note,
            "add_bos": self.add_bos(),  # what llama.cpp did
        }


def dumps(o, ind=0):
    # Objects and lists of objects one entry a line; every other list on one line.
    pad, inner = " " * ind, " " * (ind + 1)
    if isinstance(o, dict):
        return "{\n" + ",\n".join(f"{inner}{json.dumps(k)}: {dumps(v, ind + 1)}" for k, v in o.items()) + f"\n{pad}}}"
    if isinstance(o, list) and o and all(isinstance(x, dict) for x in o):
        return "[\n" + ",\n".join(inner + dumps(x, ind + 1) for x in o) + f"\n{pad}]"
    return json.dumps(o, ensure_ascii=False, separators=(",", ":"))


def write(doc, out):
    with open(out, "w", encoding="utf-8") as f:
        f.write(dumps(doc) + "\n")
