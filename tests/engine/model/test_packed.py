"""oneDNN-packed projection weights: same results as the plain ones, in eager and compiled graphs,
for every packing this CPU's profile allows (the others are skipped, saying why)."""
from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

from handler.engine import platform
from handler.engine.compiled import aot
from handler.engine.kv.pages import own_pages, page_columns
from handler.engine.model import packed
from handler.engine.model.args import ModelArgs
from handler.engine.model.transformer import Transformer

BF16_ATOL = 0.05  # |difference| allowed between two bf16 GEMMs of O(1) outputs (accumulation order)

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN is not in this torch build")


def _packings() -> list:
    """(weights dtype, packed dtype) pairs; those the profile refuses are skipped, with the reason."""
    plat = platform.detect()
    cases = []
    for dtype, packing in (("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float32", "float32")):
        try:
            platform.choose_path(plat, "cpu", dtype, packing)
            marks = ()
        except platform.PlatformError as err:
            marks = pytest.mark.skip(reason=f"{plat.describe()}: {err}")
        cases.append(pytest.param(getattr(torch, dtype), getattr(torch, packing), marks=marks, id=f"{dtype}-packed-{packing}"))
    return cases


PACKINGS = _packings()


def _weight(n: int, k: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) * 0.05).to(dtype)


@pytest.mark.parametrize("dtype,packing", PACKINGS)
@pytest.mark.parametrize("shape", [(16, 64), (1, 64), (3, 5, 64)])
def test_packed_linear_equals_linear(shape, dtype, packing):
    w, bias = _weight(96, 64, dtype), torch.randn(96).to(dtype)
    x = torch.randn(*shape).to(dtype)
    packed.pack(w, packing)
    for b in (None, bias):
        got, want = packed.packed_linear(x, w, b), F.linear(x, w, b)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert (got.float() - want.float()).abs().max().item() < BF16_ATOL


def test_a_weight_never_packed_is_an_error():
    with pytest.raises(RuntimeError, match="never packed"):
        packed.packed_linear(torch.ones(2, 64), _weight(8, 64, torch.float32, seed=1))


def test_a_view_at_a_packed_weights_address_is_an_error():
    w = _weight(8, 64, torch.float32, seed=3)
    packed.pack(w, torch.float32)
    with pytest.raises(RuntimeError, match="never packed"):
        packed.packed_linear(torch.ones(2, 64), w[:4])


def test_the_packed_copy_lives_as_long_as_the_weight():
    w = _weight(32, 64, torch.float32, seed=2)
    packed.pack(w, torch.float32)
    gc.collect()  # earlier tests' garbage goes first, so only w's entry leaves below
    entries = len(packed._packed)
    del w
    gc.collect()
    assert len(packed._packed) == entries - 1


def _tiny(dtype: torch.dtype) -> Transformer:
    torch.manual_seed(0)
    args = ModelArgs(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                     intermediate_size=128, norm_eps=1e-5, rope_theta=10000.0, tie_embeddings=True)
    model = Transformer(args)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.1)
    model = model.to(dtype).eval()
    model.setup_cache(3 * page_columns(64), 64)
    return model


def _decode_logits(model: Transformer, fn=None) -> torch.Tensor:
    fn = fn or model.decode
    tokens, pos = torch.tensor([3, 7, 11]), torch.tensor([0, 0, 0])
    with torch.no_grad():
        return fn(tokens, own_pages(3, 64), pos, 16)


@pytest.mark.parametrize("dtype,packing", PACKINGS)
def test_packing_the_model_keeps_its_outputs(dtype, packing):
    plain = _decode_logits(_tiny(dtype))
    model = _tiny(dtype)
    model.pack_weights(packing)
    got = _decode_logits(model)
    assert (got - plain).abs().max().item() < BF16_ATOL
    assert torch.equal(got.argmax(-1), plain.argmax(-1))


@pytest.mark.parametrize("dtype,packing", PACKINGS)
def test_a_compiled_graph_with_packed_weights_saves_and_loads(tmp_path, dtype, packing):
    model = _tiny(dtype)
    model.pack_weights(packing)
    want = _decode_logits(model)
    tokens, pages, pos = torch.tensor([3, 7, 11]), own_pages(3, 64), torch.tensor([0, 0, 0])
    for batched in (tokens, pages, pos):
        torch._dynamo.decorators.mark_unbacked(batched, 0)
    compiled = torch.compile(model.decode, fullgraph=True, dynamic=True)
    with torch.no_grad(), aot.trace_settings():
        graph = compiled.aot_compile(((tokens, pages, pos, 16), {}))
    graph.save_compiled_function(str(tmp_path / "decode.bin"))
    with open(tmp_path / "decode.bin", "rb") as f:
        loaded = torch.compiler.load_compiled_function(f)
    got = _decode_logits(model, lambda *args: loaded(model, *args))  # graphs take the model first
    assert (got - want).abs().max().item() < BF16_ATOL
