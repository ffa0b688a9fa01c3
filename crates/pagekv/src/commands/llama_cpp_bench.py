# llama-cpp-python side of `pagekv bench decode --llama-cpp PYTHON`: argv[1] is a JSON object
# {model, prompt (token ids), contexts, kv, decode_tokens, runs, threads}, where kv lists the KV
# setups {name, type_k, type_v, flash_attn} (ggml type ids; flash_attn null keeps the library's
# default). Prints one JSON line per setup and context: {"kv", "context", "pp", "tg"} (tokens/s;
# tg is the median over runs). Greedy.
import json, sys, time
from llama_cpp import Llama

cfg = json.loads(sys.argv[1])
max_ctx = max(cfg["contexts"]) + cfg["decode_tokens"] + 16
for kv in cfg["kv"]:
    extra = {"type_k": kv["type_k"], "type_v": kv["type_v"]}
    if kv["flash_attn"] is not None:
        extra["flash_attn"] = kv["flash_attn"]
    # n_batch = the context, so llama-cpp-python keeps a score row per position; n_ubatch = 512
    # keeps its compute chunks as by default.
    llm = Llama(model_path=cfg["model"], n_ctx=max_ctx, n_batch=max_ctx, n_ubatch=512, n_threads=cfg["threads"],
                n_threads_batch=cfg["threads"], verbose=False, **extra)
    for ctx in cfg["contexts"]:
        prompt = cfg["prompt"][:ctx]
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt)
        pp = ctx / (time.perf_counter() - t)
        tgs = []
        for _ in range(cfg["runs"]):
            llm.n_tokens = ctx  # back to the prompt; its cache entries stay valid
            llm._ctx.memory_seq_rm(0, ctx, -1) if hasattr(llm._ctx, "memory_seq_rm") else llm._ctx.kv_cache_seq_rm(0, ctx, -1)
            tok = int(llm.scores[ctx - 1].argmax())
            t = time.perf_counter()
            for _ in range(cfg["decode_tokens"]):
                llm.eval([tok])
                tok = int(llm.scores[llm.n_tokens - 1].argmax())
            tgs.append(cfg["decode_tokens"] / (time.perf_counter() - t))
        tgs.sort()
        print(json.dumps({"kv": kv["name"], "context": ctx, "pp": pp, "tg": tgs[len(tgs) // 2]}), flush=True)
    del llm
