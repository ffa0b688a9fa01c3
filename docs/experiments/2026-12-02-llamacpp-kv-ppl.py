# What llama.cpp itself loses with a quantized KV cache, over the token ids `pagekv eval` scores.
#   .venv-llama/bin/python docs/experiments/2026-12-02-llamacpp-kv-ppl.py MODEL TEXT
# (llama-cpp-python 0.3.36.) As crates/pagekv/src/commands/eval.rs does: the text tokenized with
# the model's own BOS/EOS rule (pagekv's `encode_with_bos(text, false)` = llama.cpp's
# add_special, no special-token parsing), one chunk (the model's 8192 context holds all of it),
# teacher-forced; position i's logits predict id i+1, every id but the first is scored. For each
# type_k/type_v/flash_attn setup: perplexity, Δppl against f16/f16 (flash_attn off, the setup of
# the golden data) and against f16/f16 with flash_attn on, mean KL(f16 ‖ setup) and top-1
# agreement against f16/f16 (flash_attn off). 2 threads.
# A quantized type_k/type_v is rotated by llama.cpp (ggml-org/llama.cpp#21038: Q, K, V times the
# normalized Hadamard matrix before the store, the output back after): its q4_0 is pagekv's q4r,
# not q4. LLAMA_ATTN_ROT_DISABLE=1 in the environment turns the rotation off (docs/results.md).
import sys
import time

import numpy as np
from llama_cpp import Llama

F16, Q4_0, Q8_0 = 1, 2, 8  # ggml type ids
SETUPS = [  # name, type_k, type_v, flash_attn
    ("f16/f16", F16, F16, False),
    ("f16/f16 fa", F16, F16, True),
    ("q8_0/q8_0 fa", Q8_0, Q8_0, True),
    ("q8_0/q4_0 fa", Q8_0, Q4_0, True),
    ("q4_0/q4_0 fa", Q4_0, Q4_0, True),
    ("q4_0/f16", Q4_0, F16, False),  # each side alone (a quantized V needs flash attention)
    ("f16/q4_0 fa", F16, Q4_0, True),
]


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (np.log(np.exp(x - m).sum(axis=-1, keepdims=True)) + m)


def main():
    model, text_path = sys.argv[1], sys.argv[2]
    text = open(text_path, encoding="utf-8").read()
    n_ctx = 8192
    ref_logp, ref_top, ref_ppl, fa_ppl = None, None, None, None
    rows = []
    for name, tk, tv, fa in SETUPS:
        llm = Llama(model_path=model, n_ctx=n_ctx, n_threads=2, n_threads_batch=2, logits_all=True,
                    verbose=False, flash_attn=fa, type_k=tk, type_v=tv)
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        assert len(ids) <= n_ctx, f"{len(ids)} tokens do not fit one {n_ctx} chunk"
        t0 = time.time()
        llm.eval(ids)
        secs = time.time() - t0
        n = len(ids) - 1
        nll, kl, agree = 0.0, 0.0, 0
        logp_all = np.empty((n, llm.n_vocab()), dtype=np.float32) if ref_logp is None else None
        for s in range(0, n, 256):  # row blocks keep the float64 temporaries small
            e = min(n, s + 256)
            lp = log_softmax(np.asarray(llm.scores[s:e]))
            nll -= lp[np.arange(e - s), ids[s + 1:e + 1]].sum()
            if logp_all is not None:
                logp_all[s:e] = lp
            else:
                ref = ref_logp[s:e].astype(np.float64)
                kl += (np.exp(ref) * (ref - lp)).sum()
                agree += int((lp.argmax(axis=-1) == ref_top[s:e]).sum())
        ppl = float(np.exp(nll / n))
        if ref_logp is None:
            ref_logp, ref_top, ref_ppl = logp_all, logp_all.argmax(axis=-1), ppl
            kl, agree = 0.0, n
        if name == "f16/f16 fa":
            fa_ppl = ppl
        rows.append((name, ppl, kl / n, agree / n, secs))
        print(f"# {name}: {len(ids)} ids, {n} scored, ppl {ppl:.4f}, {secs:.1f} s", file=sys.stderr, flush=True)
        del llm
    print(f"{len(ids)} ids of {text_path}, one chunk, {n} scored; model {model}")
    print(f"| type_k/type_v | ppl | Δppl vs f16 | Δppl vs f16 fa | KL(f16 ‖ setup) | top-1 vs f16 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, ppl, kl, top1, _ in rows:
        d0 = (ppl / ref_ppl - 1) * 100
        d1 = (ppl / fa_ppl - 1) * 100 if fa_ppl else float("nan")
        print(f"| {name} | {ppl:.4f} | {d0:+.2f} % | {d1:+.2f} % | {kl:.3e} | {top1 * 100:.2f} % |")


if __name__ == "__main__":
    main()
