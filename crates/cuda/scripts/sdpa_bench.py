"""Dense contiguous decode attention through PyTorch SDPA on the same shapes as
bench_attention (bf16, 32 query heads, 8 kv heads, head_dim 128), for comparison in the same
device call. Effective bandwidth = K+V bytes / median kernel time (CUDA events), rotating over
>= 512 MiB of K/V copies so small cases are not served from L2. Prints JSON lines."""
import json, torch, torch.nn.functional as F

torch.manual_seed(0)
H, HKV, D = 32, 8, 128
cases = [(1, 4096), (1, 32768), (16, 4096), (64, 4096), (64, 16384)]
for b, ctx in cases:
    kv_bytes = 2 * b * HKV * ctx * D * 2
    copies = max(1, min(64, -(-(512 << 20) // kv_bytes)))
    ks = [torch.randn(b, HKV, ctx, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    vs = [torch.randn(b, HKV, ctx, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    q = torch.randn(b, H, 1, D, device="cuda", dtype=torch.bfloat16)
    for backend in ["default", "flash", "efficient", "cudnn"]:
        try:
            ctxm = {"default": None, "flash": torch.nn.attention.SDPBackend.FLASH_ATTENTION,
                    "efficient": torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION,
                    "cudnn": torch.nn.attention.SDPBackend.CUDNN_ATTENTION}[backend]
            def run(i):
                return F.scaled_dot_product_attention(q, ks[i % copies], vs[i % copies], enable_gqa=True)
            def timed():
                for i in range(5):
                    run(i)
                torch.cuda.synchronize()
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(51)]
                ev[0].record()
                for i in range(50):
                    run(i)
                    ev[i + 1].record()
                torch.cuda.synchronize()
                t = sorted(ev[i].elapsed_time(ev[i + 1]) for i in range(50))
                return t[25]
            if ctxm is None:
                ms = timed()
            else:
                with torch.nn.attention.sdpa_kernel(ctxm):
                    ms = timed()
            print(json.dumps({"impl": "torch-sdpa-" + backend, "format": "bf16-dense", "batch": b, "context": ctx,
                              "ms": round(ms, 6), "us": round(ms * 1e3, 2), "kv_bytes": kv_bytes,
                              "gbps": round(kv_bytes / ms / 1e6, 1)}), flush=True)
        except Exception as e:  # a backend that refuses the shape
            print(json.dumps({"impl": "torch-sdpa-" + backend, "batch": b, "context": ctx, "error": str(e)[:120]}), flush=True)
    del ks, vs
    torch.cuda.empty_cache()
