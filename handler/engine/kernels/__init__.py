"""CPU kernels of our own, for what compiled graphs call as opaque ops.

    quantized.c  int8 / int4 weights (handler.engine.quant): integer dot products on the quantized
                 bytes, 8 weight rows per vector instruction (amx.c: the same on AMX tiles)
    kquant.c     a GGUF file's k-quant blocks (Q4_K, Q5_K, Q6_K), streamed as stored
    matvec.c     bf16 weights in their plain layout, for single rows (decode at batch 1)
    attention.c  attention, decode and prefill, in blocks of positions merged in order
    pool.c       the threads all of them run on (threading: pool)
    torch_op.cpp the ops' C++ entries: checks, output allocation, bias
    build.py     builds them with Inductor's C++ toolchain and flags, once per process
    matvec.py    `ts_llm::bf16_linear`: its schema, fake and wrapper
    attention.py `ts_llm::attention`: its schema, fake and wrapper
    threads.py   how the threads running their parallel regions wait for each other (the pool, or
                 a worker's GOMP_SPINCOUNT), and what the worker reports of them
"""
