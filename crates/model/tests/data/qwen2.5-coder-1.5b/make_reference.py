# Makes llamacpp.json, llama.cpp's golden data for Qwen2.5-Coder-1.5B-Instruct Q4_K_M, with
# llama-cpp-python 0.3.36 (flash_attn off, f16 KV cache, 2 threads, logits_all, native build
# without AMX: see README.md):
#   python make_reference.py ~/.cache/pagekv/models/qwen2.5-coder-1.5b.gguf llamacpp.json
# The teacher-forced text is the source of CPython's `textwrap` module (PSF licence) as
# `inspect.getsource` gives it under the Python that runs this script (3.11.7 for the stored
# file); the text used is stored in the output, so the ids can be checked without that Python.
import inspect, json, sys, textwrap
import numpy as np
import llama_cpp
from llama_cpp import Llama

MODEL, OUT = sys.argv[1], sys.argv[2]
N_TF = 1100  # teacher-forced ids
N_GREEDY = 24  # greedy tokens per prompt

llm = Llama(model_path=MODEL, n_ctx=2048, n_threads=2, n_threads_batch=2, logits_all=True,
            verbose=False, flash_attn=False)
meta = llm.metadata


def tok(text, add_bos):
    # special=True: special tokens written in the text (<|im_start|>, ...) are parsed, as the
    # smollm2 golden data and the engine's prompts do. add_bos=True means "as the vocabulary says"
    # (llama_tokenize's add_special): this GGUF has tokenizer.ggml.add_bos_token=false.
    return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)


def detok(ids):
    return llm.detokenize(ids).decode("utf-8", errors="replace")


def log_softmax(row):
    x = np.asarray(row, dtype=np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


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
    "<|im_start|>system\nYou are a helpful coding assistant.<|im_end|>\n<|im_start|>user\nWrite hello world in Rust."
    "<|im_end|>\n<|im_start|>assistant\n",
    "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c<|fim_middle|>",
    "I'm sure you're right, he'll see; she'd've known. WE'VE DON'T They're",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b\\u00e9"}, "url": "https://example.com/p?q=1&r=2#f"}',
    "    leading spaces and trailing spaces    ",
    "",
]
tokenize = [{"text": t, "ids": tok(t, add_bos=False)} for t in TOKENIZE]

# --- teacher-forced ---------------------------------------------------------------------------
source = inspect.getsource(textwrap)
lines = source.splitlines(keepends=True)
text = ""
for line in lines:  # whole lines, until the text has more tokens than N_TF
    text += line
    if len(tok(text, add_bos=True)) > N_TF + 10:
        break
ids = tok(text, add_bos=True)[:N_TF]
llm.reset()
llm.eval(ids)  # one call: llama-cpp-python evaluates it in n_batch=512 chunks
scores = np.array(llm.scores[: len(ids)], dtype=np.float32)
lps, argmax = [], []
for i in range(len(ids) - 1):
    lp = log_softmax(scores[i])
    lps.append(float(lp[ids[i + 1]]))
    argmax.append(int(np.argmax(scores[i])))
ppl = float(np.exp(-np.mean(lps)))
teacher_forced = [{
    "name": "textwrap_py",
    "text": text,
    "ids": ids,
    "next_token_logprob": [round(x, 5) for x in lps],
    "argmax": argmax,
    "perplexity": ppl,
}]
print(f"teacher-forced: {len(ids)} ids, perplexity {ppl:.4f}", file=sys.stderr)

# --- greedy -----------------------------------------------------------------------------------
def chat_prompt(messages):
    # The GGUF's own chat template, rendered with Jinja (llama-cpp-python's formatter).
    fmt = llama_cpp.llama_chat_format.Jinja2ChatFormatter(
        template=meta["tokenizer.chat_template"], eos_token="<|im_end|>", bos_token="<|endoftext|>")
    return fmt(messages=messages).prompt


chat_messages = [{"role": "user", "content": "Write a Rust function that returns the largest element of a slice."}]
PROMPTS = [
    ("code", "# Return the n-th Fibonacci number\ndef fib(n):\n"),
    ("chat", chat_prompt(chat_messages)),
    ("english", "The history of the printing press begins"),
    ("digits", "Q: What is 17 * 23?\nA: 17 * 23 ="),
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
    case = {"name": name, "prompt": prompt, "prompt_ids": pids, "greedy_ids": out,
            "greedy_text": detok(out), "top2_per_step": top2}
    if name == "chat":
        case["messages"] = chat_messages
    greedy.append(case)
    print(f"greedy {name}: {detok(out)!r}", file=sys.stderr)

doc = {
    "generator": f"llama-cpp-python {llama_cpp.__version__} (llama.cpp), n_threads=2, logits_all, flash_attn=False",
    "model": MODEL.rsplit("/", 1)[-1],
    "note": "tokenize[]: no BOS, special tokens parsed; prompt_ids/ids: as llama.cpp tokenizes a prompt "
            "(add_special, special parsed), which adds no BOS for this model (add_bos_token=false)",
    "add_bos": len(tok("a", add_bos=True)) > len(tok("a", add_bos=False)),  # what llama.cpp did
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
