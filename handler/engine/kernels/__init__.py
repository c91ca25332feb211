"""CPU kernels of our own, for the projections compiled graphs call as opaque ops.

    quantized.c  int8 / int4 weights (handler.engine.quant): integer dot products on the quantized
                 bytes, 8 weight rows per vector instruction
    matvec.c     bf16 weights in their plain layout, for single rows (decode at batch 1)
    torch_op.cpp the ops' C++ entries: checks, output allocation, bias
    build.py     builds all three with Inductor's C++ toolchain and flags, once per process
    matvec.py    `ts_llm::bf16_linear`: its schema, fake and wrapper
    threads.py   how the threads running their parallel regions wait for each other (a worker's
                 GOMP_SPINCOUNT), and what the worker reports of them
"""
