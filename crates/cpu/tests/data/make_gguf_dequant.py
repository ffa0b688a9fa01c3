"""Writes gguf_dequant.json: hand-made blocks of the formats whose layouts were added without a
reference quantizer, each with the values the `gguf` Python package (llama.cpp's own) dequantizes
it to. `quant_reference.rs` checks pagekv's scalar dequantizers against them.

    python -m venv venv && venv/bin/pip install gguf numpy
    venv/bin/python make_gguf_dequant.py > gguf_dequant.json
"""
import json
import random

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

# (type, block bytes, [(offset of an f16 scale, value)])
FORMATS = [
    (T.Q5_0, 22, [(0, 0.0123)]),
    (T.Q5_1, 24, [(0, 0.0071), (2, -0.0425)]),
    (T.IQ4_NL, 18, [(0, 0.0091)]),
    (T.Q2_K, 84, [(80, 0.00137), (82, 0.00052)]),
    (T.Q3_K, 110, [(108, 0.00211)]),
    (T.IQ4_XS, 136, [(0, 0.000173)]),
    (T.Q4_K, 144, [(0, 0.00107), (2, 0.00043)]),
    (T.Q5_K, 176, [(0, 0.00093), (2, 0.00061)]),
    (T.Q6_K, 210, [(208, 0.00077)]),
]

rng = random.Random(20261204)
cases = []
for ty, size, scales in FORMATS:
    for _ in range(2):
        block = bytearray(rng.getrandbits(8) for _ in range(size))
        for at, v in scales:
            block[at:at + 2] = np.float16(v).tobytes()
        values = dequantize(np.frombuffer(bytes(block), dtype=np.uint8), ty)
        cases.append({"type": ty.name, "block_hex": bytes(block).hex(),
                      "values": [float(x) for x in values.reshape(-1)]})
version = __import__("importlib.metadata").metadata.version("gguf")
print(json.dumps({"generator": f"gguf {version} (Python), gguf.quants.dequantize", "cases": cases}))
