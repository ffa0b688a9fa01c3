# Makes llamacpp.json, llama.cpp's golden data for Qwen2.5-Coder-1.5B-Instruct Q4_K_M, with
# llama-cpp-python 0.3.36 (flash_attn off, f16 KV cache, 2 threads, logits_all, native build
# without AMX: see README.md); the shared steps are in ../llamacpp_golden.py:
#   python make_reference.py ~/.cache/pagekv/models/qwen2.5-coder-1.5b.gguf llamacpp.json
# The teacher-forced text is the source of CPython's `textwrap` module (PSF licence) as
# `inspect.getsource` gives it under the Python that runs this script (3.11.7 for the stored
# file); the text used is stored in the output, so the ids can be checked without that Python.
# This GGUF has tokenizer.ggml.add_bos_token=false: prompts get no BOS.
import inspect, os, sys, textwrap

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import llama_cpp  # noqa: E402
from llamacpp_golden import Reference, tokenizer_texts, write  # noqa: E402

MODEL, OUT = sys.argv[1], sys.argv[2]
N_TF = 1100  # teacher-forced ids
N_GREEDY = 24  # greedy tokens per prompt

ref = Reference(MODEL, n_ctx=2048)

SPECIALS = [
    "<|im_start|>system\nYou are a helpful coding assistant.<|im_end|>\n<|im_start|>user\nWrite hello world in Rust."
    "<|im_end|>\n<|im_start|>assistant\n",
    "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c<|fim_middle|>",
]

# Whole lines of textwrap's source, until the text has more tokens than N_TF.
text = ""
for line in inspect.getsource(textwrap).splitlines(keepends=True):
    text += line
    if len(ref.tok(text, add_bos=True)) > N_TF + 10:
        break


def chat_prompt(messages):
    # The GGUF's own chat template, rendered with Jinja (llama-cpp-python's formatter).
    fmt = llama_cpp.llama_chat_format.Jinja2ChatFormatter(
        template=ref.llm.metadata["tokenizer.chat_template"], eos_token="<|im_end|>", bos_token="<|endoftext|>")
    return fmt(messages=messages).prompt


chat_messages = [{"role": "user", "content": "Write a Rust function that returns the largest element of a slice."}]
greedy = [
    ref.greedy("code", "# Return the n-th Fibonacci number\ndef fib(n):\n", N_GREEDY),
    ref.greedy("chat", chat_prompt(chat_messages), N_GREEDY) | {"messages": chat_messages},
    ref.greedy("english", "The history of the printing press begins", N_GREEDY),
    ref.greedy("digits", "Q: What is 17 * 23?\nA: 17 * 23 =", N_GREEDY),
]

doc = ref.header("tokenize[]: no BOS, special tokens parsed; prompt_ids/ids: as llama.cpp tokenizes a prompt "
                 "(add_special, special parsed), which adds no BOS for this model (add_bos_token=false)")
doc |= {
    "tokenize": ref.tokenize(tokenizer_texts(SPECIALS)),
    "teacher_forced": [ref.teacher_forced("textwrap_py", text, N_TF)],
    "greedy": greedy,
}
write(doc, OUT)
