# Makes llamacpp.json, llama.cpp's golden data for Gemma 3 270M (base) Q4_K_M, with
# llama-cpp-python 0.3.36 (flash_attn off, f16 KV cache, 2 threads, logits_all, native build
# without AMX: see README.md):
#   python make_reference.py ~/.cache/pagekv/models/gemma3-270m.gguf llamacpp.json
# Texts come from the Python that runs this script (3.11.7 for the stored file), all under the
# PSF licence: the "standard type hierarchy" page of the language reference
# (`pydoc_data.topics`) for the teacher-forced run, another reference page and the source of
# `heapq` (`inspect.getsource`) for the long greedy prompts. Every text used is stored in the
# output, so the ids can be checked without that Python.
import heapq, inspect, json, sys
import numpy as np
import llama_cpp
from llama_cpp import Llama
from pydoc_data.topics import topics

MODEL, OUT = sys.argv[1], sys.argv[2]
N_TF = 2200  # teacher-forced ids, BOS included: far past the 512-token sliding window
N_GREEDY = 16  # greedy tokens per prompt

llm = Llama(model_path=MODEL, n_ctx=2560, n_threads=2, n_threads_batch=2, logits_all=True,
            verbose=False, flash_attn=False)


def tok(text, add_bos):
    # special=True: special tokens written in the text (<start_of_turn>, ...) are parsed.
    # add_bos=True means "as the vocabulary says" (llama_tokenize's add_special): this GGUF has
    # tokenizer.ggml.add_bos_token=true, so llama.cpp prepends <bos> (id 2) to a prompt.
    return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)


def detok(ids):
    return llm.detokenize(ids).decode("utf-8", errors="replace")


def log_softmax(row):
    x = np.asarray(row, dtype=np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def prefix(text, n_tokens, cut_line):
    """Whole lines of `text` until they make more than `n_tokens` tokens (BOS included); with
    `cut_line`, then the first half of the next non-empty line's words, a cue to continue."""
    lines = text.splitlines(keepends=True)
    out, k = "", 0
    while k < len(lines) and len(tok(out, add_bos=True)) <= n_tokens:
        out += lines[k]
        k += 1
    if cut_line:
        while not lines[k].strip():
            out += lines[k]
            k += 1
        words = lines[k].rstrip("\n").split(" ")
        out += " ".join(words[: max(1, len(words) // 2)])
    return out


# --- tokenize ---------------------------------------------------------------------------------
TOKENIZE = [
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
    "<start_of_turn>user\nWrite hello world in Rust.<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after a written BOS, and <eos> <pad> <unk> in the middle",
    "I'm sure you're right, he'll see; she'd've known. WE'VE DON'T They're",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b\\u00e9"}, "url": "https://example.com/p?q=1&r=2#f"}',
    "    leading spaces and trailing spaces    ",
    " one leading space",
    "",
]
tokenize = [{"text": t, "ids": tok(t, add_bos=False)} for t in TOKENIZE]

# --- teacher-forced ---------------------------------------------------------------------------
text = prefix(topics["types"], N_TF + 10, cut_line=False)
ids = tok(text, add_bos=True)[:N_TF]
llm.reset()
llm.eval(ids)  # one call: llama-cpp-python evaluates it in n_batch=512 chunks
lps, argmax = [], []
for i in range(len(ids) - 1):
    row = np.array(llm.scores[i], dtype=np.float32)
    lps.append(float(log_softmax(row)[ids[i + 1]]))
    argmax.append(int(np.argmax(row)))
ppl = float(np.exp(-np.mean(lps)))
teacher_forced = [{
    "name": "python_reference_types",
    "text": text,
    "ids": ids,
    "next_token_logprob": [round(x, 5) for x in lps],
    "argmax": argmax,
    "perplexity": ppl,
}]
print(f"teacher-forced: {len(ids)} ids, perplexity {ppl:.4f}", file=sys.stderr)

# --- greedy -----------------------------------------------------------------------------------
PROMPTS = [
    ("english", "The capital of France is"),
    ("digits", "1, 1, 2, 3, 5, 8, 13, 21,"),
    ("long_prose", prefix(topics["execmodel"], 700, cut_line=True)),
    ("long_code", prefix(inspect.getsource(heapq), 1100, cut_line=True)),
]
greedy = []
for name, prompt in PROMPTS:
    pids = tok(prompt, add_bos=True)
    llm.reset()
    llm.eval(pids)
    out, top2 = [], []
    for _ in range(N_GREEDY):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        order = np.argsort(-row, kind="stable")[:2]
        top2.append([[int(j), round(float(row[j]), 5)] for j in order])
        t = int(np.argmax(row))  # stop on nothing, EOS included
        out.append(t)
        llm.eval([t])
    greedy.append({"name": name, "prompt": prompt, "prompt_ids": pids, "greedy_ids": out,
                   "greedy_text": detok(out), "top2_per_step": top2})
    print(f"greedy {name} ({len(pids)} prompt ids): {detok(out)!r}", file=sys.stderr)

doc = {
    "generator": f"llama-cpp-python {llama_cpp.__version__} (llama.cpp), n_threads=2, logits_all, flash_attn=False",
    "model": MODEL.rsplit("/", 1)[-1],
    "note": "tokenize[]: no BOS, special tokens parsed; prompt_ids/ids: as llama.cpp tokenizes a prompt "
            "(add_special, special parsed), which for this model starts with <bos> (id 2)",
    "add_bos": len(tok("a", add_bos=True)) > len(tok("a", add_bos=False)),  # what llama.cpp did
    "bos_id": llm.token_bos(),
    "sliding_window": int(llm.metadata.get("gemma3.attention.sliding_window", 0)),
    "tokenize": tokenize,
    "teacher_forced": teacher_forced,
    "greedy": greedy,
}


def dumps(o, ind=0):
    # Objects and lists of objects one entry a line; every other list on one line.
    pad, inner = " " * ind, " " * (ind + 1)
    if isinstance(o, dict):
        return "{\n" + ",\n".join(f"{inner}{json.dumps(k)}: {dumps(v, ind + 1)}" for k, v in o.items()) + f"\n{pad}}}"
    if isinstance(o, list) and o and all(isinstance(x, dict) for x in o):
        return "[\n" + ",\n".join(inner + dumps(x, ind + 1) for x in o) + f"\n{pad}]"
    return json.dumps(o, ensure_ascii=False, separators=(",", ":"))


with open(OUT, "w", encoding="utf-8") as f:
    f.write(dumps(doc) + "\n")
