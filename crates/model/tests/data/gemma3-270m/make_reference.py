# Makes llamacpp.json, llama.cpp's golden data for Gemma 3 270M (base) Q4_K_M, with
# llama-cpp-python 0.3.36 (flash_attn off, f16 KV cache, 2 threads, logits_all, native build
# without AMX: see README.md); the shared steps are in ../llamacpp_golden.py:
#   python make_reference.py ~/.cache/pagekv/models/gemma3-270m.gguf llamacpp.json
# Texts come from the Python that runs this script (3.11.7 for the stored file), all under the
# PSF licence: the "standard type hierarchy" page of the language reference
# (`pydoc_data.topics`) for the teacher-forced run, another reference page and the source of
# `heapq` (`inspect.getsource`) for the long greedy prompts. Every text used is stored in the
# output, so the ids can be checked without that Python. This GGUF has
# tokenizer.ggml.add_bos_token=true: prompts start with <bos> (id 2).
import heapq, inspect, os, sys
from pydoc_data.topics import topics

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from llamacpp_golden import Reference, tokenizer_texts, write  # noqa: E402

MODEL, OUT = sys.argv[1], sys.argv[2]
N_TF = 2200  # teacher-forced ids, BOS included: far past the 512-token sliding window
N_GREEDY = 16  # greedy tokens per prompt

ref = Reference(MODEL, n_ctx=2560)

SPECIALS = [
    "<start_of_turn>user\nWrite hello world in Rust.<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after a written BOS, and <eos> <pad> <unk> in the middle",
]


def prefix(text, n_tokens, cut_line):
    """Whole lines of `text` until they make more than `n_tokens` tokens (BOS included); with
    `cut_line`, then the first half of the next non-empty line's words, a cue to continue."""
    lines = text.splitlines(keepends=True)
    out, k = "", 0
    while k < len(lines) and len(ref.tok(out, add_bos=True)) <= n_tokens:
        out += lines[k]
        k += 1
    if cut_line:
        while not lines[k].strip():
            out += lines[k]
            k += 1
        words = lines[k].rstrip("\n").split(" ")
        out += " ".join(words[: max(1, len(words) // 2)])
    return out


greedy = [
    ref.greedy("english", "The capital of France is", N_GREEDY),
    ref.greedy("digits", "1, 1, 2, 3, 5, 8, 13, 21,", N_GREEDY),
    ref.greedy("long_prose", prefix(topics["execmodel"], 700, cut_line=True), N_GREEDY),
    ref.greedy("long_code", prefix(inspect.getsource(heapq), 1100, cut_line=True), N_GREEDY),
]

doc = ref.header("tokenize[]: no BOS, special tokens parsed; prompt_ids/ids: as llama.cpp tokenizes a prompt "
                 "(add_special, special parsed), which for this model starts with <bos> (id 2)")
doc |= {
    "bos_id": ref.llm.token_bos(),
    "sliding_window": int(ref.llm.metadata.get("gemma3.attention.sliding_window", 0)),
    "tokenize": ref.tokenize(tokenizer_texts(SPECIALS, extra=[" one leading space"])),
    "teacher_forced": [ref.teacher_forced("python_reference_types", prefix(topics["types"], N_TF + 10, cut_line=False), N_TF)],
    "greedy": greedy,
}
write(doc, OUT)
