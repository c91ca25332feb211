"""Weight-only quantized projections: int8 and int4 weights that decode streams as they are (their
CPU kernels: handler.engine.kernels.quantized.c, x rounded to int8 per block of 32).

    ops.py      `ts_llm::quantized_linear`, the op the model's graphs call, and `dequantize`
    layout.py   QuantizedWeight: the tensors one projection keeps, their checks and the kernels' packing
    rtn.py      round-to-nearest quantization of float weights (int8 per channel, int4 by group)
    gguf.py     GGUF Q8_0 / Q4_0 / Q4_1 tensors taken as they are stored (no requantization)
    apply.py    which source a model's projections come from, and swapping them in
"""
