#!/usr/bin/env bash
# The engine on the GPU, end to end, on the lent GPU machine (run tool; no Rust there). Stage
# first (here):
#   export CARGO_TARGET_DIR=target-engcuda CARGO_PROFILE_RELEASE_DEBUG=0
#   cargo build --release -p pagekv --features cuda
#   mkdir -p $CARGO_TARGET_DIR/dist/bin $CARGO_TARGET_DIR/dist/m1 $CARGO_TARGET_DIR/dist/m2
#   strip -o $CARGO_TARGET_DIR/dist/bin/pagekv $CARGO_TARGET_DIR/release/pagekv
#   xz -9e -c SmolLM2-135M-Instruct.Q4_1.gguf > smol.xz; cut it into dist/m1/part.a + dist/m2/part.b
#   (one call carries at most 64 MiB), and its sha256 into dist/m2/sha256
# then on the device:
#   part1  (carry dist/bin, dist/m1): the binary's GPU errors and a synthetic decode — quick
#   real   (carry dist/bin, dist/m2; dist/m1 left from part1): the real model reassembled;
#          `serve --device cuda` driven with curl (chat completion, streaming and not, a second
#          turn served from the session bank, 16 concurrent completions, /metrics, SIGTERM),
#          `chat --device cuda` over stdin, `eval --device cuda` beside the CPU's, and
#          `bench serve --device cuda`.
# Logs go to $OUT; a short summary is printed last.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PAGEKV_HOME=$OUT/home
D=${DIST:-target-engcuda/dist}
P=$D/bin/pagekv
MODE=${1:-part1}
DEV=${DEV:-cuda}  # DEV=cpu QUICK=1 tries the script here
EVAL_TOKENS=1024; CLIENTS=1,8,32; PAR=16
[ -n "${QUICK:-}" ] && { EVAL_TOKENS=64; CLIENTS=1; PAR=3; }
summary=()
note() { summary+=("$*"); }
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv > "$OUT/gpu.txt" 2>&1

case "$MODE" in
part1)
    sha256sum $D/m1/part.a | tee "$OUT/part_a.sha256"
    $P serve --device cuda:7 --model /nonexistent.gguf > "$OUT/no_device.txt" 2>&1
    note "serve --device cuda:7: rc=$? $(head -c 200 "$OUT/no_device.txt")"
    $P bench decode --device cuda --model synthetic:smollm2 --contexts 128 --decode-tokens 64 --runs 2 \
        --text README.md > "$OUT/bench_decode_synth.txt" 2>&1
    note "bench decode synthetic:smollm2 rc=$?: $(grep pagekv-cuda "$OUT/bench_decode_synth.txt" | tr -s ' ')"
    ;;
real)
    M=/tmp/smollm2.gguf
    if [ -z "${MODEL:-}" ] && [ ! -f $D/m1/part.a ]; then
        echo "part a of the model is gone (a fresh machine): run part1 again first"; exit 3
    fi
    if [ -n "${MODEL:-}" ]; then  # MODEL=FILE: a model already there (trying the script here)
        cp "$MODEL" $M
    else
        cat $D/m1/part.a $D/m2/part.b | python3 -c 'import lzma,sys; sys.stdout.buffer.write(lzma.decompress(sys.stdin.buffer.read()))' > $M
    fi
    got=$(sha256sum $M | cut -d' ' -f1)
    note "model sha256 ok: $([ "$got" = "$(cat $D/m2/sha256)" ] && echo yes || echo NO)"

    # --- serve on the GPU
    $P serve --device $DEV -m $M --port 18080 --context-window 2048 --num-blocks 2048 2> "$OUT/serve.log" &
    pid=$!
    for _ in $(seq 1 600); do grep -q "listening on" "$OUT/serve.log" && break; sleep 0.1; done
    note "serve: $(grep -E 'model on|KV ' "$OUT/serve.log" | tr '\n' ' ' | cut -c1-220)"
    U=http://127.0.0.1:18080
    msg='[{"role":"user","content":"What is the capital of France?"}]'
    curl -s $U/v1/chat/completions -H 'content-type: application/json' \
        -d "{\"model\":\"smollm2\",\"messages\":$msg,\"max_tokens\":32,\"temperature\":0}" > "$OUT/chat.json"
    note "chat (non-stream): $(python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); print(repr(v["choices"][0]["message"]["content"]), v["usage"])' "$OUT/chat.json" 2>&1 | cut -c1-240)"
    curl -sN $U/v1/chat/completions -H 'content-type: application/json' \
        -d "{\"model\":\"smollm2\",\"messages\":$msg,\"max_tokens\":32,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" > "$OUT/chat_stream.txt"
    note "chat (stream): $(python3 -c '
import json,sys
t="";u=None
for l in open(sys.argv[1]):
    l=l.strip()
    if not l.startswith("data: ") or l=="data: [DONE]": continue
    v=json.loads(l[6:])
    for c in v.get("choices",[]): t+=c.get("delta",{}).get("content") or ""
    u=v.get("usage") or u
print(repr(t), u, "DONE" if "[DONE]" in open(sys.argv[1]).read() else "no DONE")' "$OUT/chat_stream.txt" 2>&1 | cut -c1-240)"
    # A second turn: its prompt extends the first's, so the bank serves the shared blocks.
    msg2='[{"role":"user","content":"What is the capital of France?"},{"role":"assistant","content":"Paris."},{"role":"user","content":"And of Italy?"}]'
    curl -s $U/v1/chat/completions -H 'content-type: application/json' \
        -d "{\"model\":\"smollm2\",\"messages\":$msg2,\"max_tokens\":24,\"temperature\":0}" > "$OUT/chat2.json"
    note "second turn: $(python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); print(repr(v["choices"][0]["message"]["content"]), v["usage"])' "$OUT/chat2.json" 2>&1 | cut -c1-240)"
    # $PAR concurrent completions of up to 128 tokens: temperature alone (the step copies full
    # logit rows), then with top_k 40 (the engine's reduced sampling: the top-k on the device);
    # twice each, alternated (the first top-k round includes compiling its kernels).
    for variant in full topk full2 topk2; do
        extra=""; case $variant in topk*) extra=',"top_k":40' ;; esac
        t0=$(date +%s.%N)
        clients=()
        for i in $(seq 1 $PAR); do
            curl -s $U/v1/completions -H 'content-type: application/json' \
                -d "{\"model\":\"smollm2\",\"prompt\":\"Story $i: once upon a time\",\"max_tokens\":128,\"temperature\":0.8,\"seed\":$i$extra}" > "$OUT/par_${variant}_$i.json" &
            clients+=($!)
        done
        wait "${clients[@]}"
        t1=$(date +%s.%N)
        note "$PAR concurrent ($variant): $(python3 -c '
import json,sys
n=0
for i in range(1,int(sys.argv[4])+1):
    v=json.load(open(f"{sys.argv[1]}/par_{sys.argv[5]}_{i}.json")); n+=v["usage"]["completion_tokens"]
dt=float(sys.argv[3])-float(sys.argv[2]); print(f"{n} tokens in {dt:.2f} s = {n/dt:.0f} tok/s")' "$OUT" "$t0" "$t1" "$PAR" "$variant" 2>&1 | cut -c1-200)"
    done
    curl -s $U/metrics > "$OUT/metrics.txt"
    note "metrics: $(grep -E '^pagekv_(computed_prompt_tokens_total|generation_tokens_total|preemptions_total|session_bank_hits_total|prompt_cached_tokens_total|kv_blocks_capacity|attention_calls_total)' "$OUT/metrics.txt" | tr '\n' ' ' | cut -c1-400)"
    kill -TERM $pid; wait $pid; note "serve exit after SIGTERM: $?"

    # --- chat on the GPU over stdin
    printf 'What is the capital of France?\n/stats\nAnd of Italy?\n/quit\n' | \
        timeout 60 $P chat --device $DEV -m $M --temperature 0 -n 24 > "$OUT/chat_cli.txt" 2>&1
    note "chat --device cuda rc=$?: $(tr '\n' ' ' < "$OUT/chat_cli.txt" | cut -c1-300)"

    # --- eval, GPU beside CPU
    $P eval --device $DEV -m $M --text README.md --max-tokens $EVAL_TOKENS --formats f16,bf16,q8,q4,q4r,turbo > "$OUT/eval_cuda.txt" 2>&1
    note "eval cuda rc=$?"
    $P eval --device cpu -m $M --text README.md --max-tokens $EVAL_TOKENS --formats f16,bf16,q8,q4,q4r,turbo > "$OUT/eval_cpu.txt" 2>&1
    note "eval cpu rc=$?"

    # --- bench serve on the GPU
    timeout 120 $P bench serve --device $DEV -m $M --clients $CLIENTS --max-tokens 128 --prefix-tokens 1000 --prefix-runs 2 \
        > "$OUT/bench_serve_cuda.txt" 2>&1
    note "bench serve cuda rc=$?"
    ;;
esac
cat "$OUT/gpu.txt"
for f in eval_cuda eval_cpu bench_serve_cuda; do [ -f "$OUT/$f.txt" ] && { echo "== $f"; cat "$OUT/$f.txt"; }; done
echo "== summary"
printf '%s\n' "${summary[@]}"
