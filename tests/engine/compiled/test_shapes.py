"""The shape domain AOT compiling covers: every prefill and decode call the Engine makes is in it."""
from __future__ import annotations

import random
from pathlib import Path

from handler.engine.compiled.shapes import Shape, decode_window, serving_shapes
from handler.engine.config import EngineConfig
from handler.engine.sampling import SamplingParams
from tests.support.tiny_model import CharTokenizer, counting_engine

CFG = EngineConfig(Path("unused"), max_batch_size=4, max_seq_len=256, prefill_chunk=64, prefix_caching=True)


def test_prefill_shapes_pair_each_chunk_width_with_the_windows_it_can_end_in():
    shapes = serving_shapes("prefill", CFG)
    widths = sorted({s.length for s in shapes})
    assert widths == list(range(4, 65, 4))
    assert {s.window for s in shapes if s.length == 64} == {64, 128, 192, 256}
    assert all(s.window >= s.length for s in shapes)
    assert {s.batch for s in shapes} == {1, 2, 3, 4}


def test_every_call_the_engine_makes_is_a_serving_shape():
    """Random prompt lengths, arrivals and prefix sharing on the counting steps: each prefill
    (width, window) and decode window is in the domain, at its batch."""
    prefill = {(s.batch, s.length, s.window) for s in serving_shapes("prefill", CFG)}
    pairs = {(length, window) for _, length, window in prefill}
    decode = {(s.batch, s.length) for s in serving_shapes("decode", CFG)}
    engine, steps = counting_engine(slots=CFG.max_batch_size, max_seq_len=CFG.max_seq_len,
                                    prefill_chunk=CFG.prefill_chunk, prefix_caching=True)
    seen = []
    real = engine._prefill

    def prefill(tokens, slots, start, last, kv_len):
        seen.append((tokens.shape[0], tokens.shape[1], kv_len))
        return real(tokens, slots, start, last, kv_len)

    engine._prefill = prefill
    rng = random.Random(0)
    shared = CharTokenizer().encode("abcdefghijklmnopqrstuvwxy" * 4)
    for i in range(60):
        while not engine.free_slots:
            engine.step()
        prompt = shared[: rng.randrange(1, 100)] + [rng.randrange(1, 27) for _ in range(rng.randrange(1, 120))]
        engine.add(str(i), prompt, SamplingParams(max_new_tokens=rng.randrange(1, 30), ignore_eos=True))
        if rng.random() < 0.5:
            engine.step()
    while engine.running:
        engine.step()
    assert seen and all((length, window) in pairs for _, length, window in seen), seen
    assert all(batch <= CFG.max_batch_size for batch, _, _ in seen)
    assert all((batch, kv_len) in decode for batch, kv_len in steps.of("decode"))
    assert Shape(1, 64, 64) in serving_shapes("prefill", CFG)


def test_decode_window_covers_the_positions_in_few_shapes():
    for positions in range(1, 2049):
        window = decode_window(positions, 2048)
        assert positions <= window <= 2048 and window % 64 == 0 and window - positions < 64
    assert decode_window(10, 40) == 40, "capped at max_seq_len"
