# Makes logits_apache2_last.npy and logits_apache2_decode300.npy with llama-cpp-python 0.3.36
# (the generator of llamacpp.json; flash_attn off, f16 KV cache, 2 threads, AVX-512 build):
#   python make_logits.py /root/.cache/pagekv/models/SmolLM2-135M-Instruct.Q4_1.gguf
# - logits_apache2_last.npy: all logits after the last of the 1,024 teacher-forced `apache2` ids,
#   evaluated as llamacpp.json's teacher_forced was (one eval call: 512-token ubatches).
# - logits_apache2_decode300.npy: all logits after id 300 of the same text, evaluated as a prompt
#   of 4 ids followed by 296 single-id evals (decode: ggml's one-row matmul path).
import json, os, sys
import numpy as np
from llama_cpp import Llama

here = os.path.dirname(os.path.abspath(__file__))
ids = json.load(open(os.path.join(here, "llamacpp.json")))["teacher_forced"][0]["ids"]
llm = Llama(model_path=sys.argv[1], n_ctx=2048, n_threads=2, n_threads_batch=2, logits_all=True,
            verbose=False, flash_attn=False)
llm.eval(ids)
np.save(os.path.join(here, "logits_apache2_last.npy"), np.array(llm.scores[len(ids) - 1], dtype="<f4"))
llm.reset()
llm.eval(ids[:4])
for t in ids[4:300]:
    llm.eval([t])
np.save(os.path.join(here, "logits_apache2_decode300.npy"), np.array(llm.scores[299], dtype="<f4"))
