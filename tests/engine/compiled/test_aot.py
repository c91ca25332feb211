"""AOT compile artifacts: compiled once, loaded without tracing, never for the wrong key.

A tiny random-weight Llama (the default model's tokenizer) keeps the compile to under a minute;
one cold compile per module is shared by the tests.
"""
from __future__ import annotations

import dataclasses
import json
import operator
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from handler.cache import LocalStore, RestoreOutcome, publish_if_new, restore
from handler.cache.check import Verdict
from handler.cache.key import KEY_FILE_NAME
from handler.cache.manifest import MANIFEST_NAME
from handler.engine import cpu_profiles, platform
from handler.engine.checkpoint import open_checkpoint
from handler.engine.compiled import aot, artifacts, cpp_cache, saved_graphs, shapes
from handler.engine.compiled.artifact_lookup import ArtifactRequest
from handler.engine.compiled.artifacts import ArtifactPlaces
from handler.engine.compiled.cold import side_by_side
from handler.engine.compiled.errors import CompileError
from handler.engine.compiled.steps import build_steps
from handler.engine.config import EngineConfig
from handler.engine.factory import build_engine
from handler.engine.kv.pages import own_pages, page_columns
from handler.engine.model.args import ModelArgs
from handler.engine.model.transformer import Transformer
from handler.engine.sampling import SamplingParams
from tests.support.generate import generate

REPO = Path(__file__).resolve().parents[3]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,", "Hi"]


@pytest.fixture(scope="module")
def cfg(tiny_checkpoint) -> EngineConfig:
    # blocking: the artifact is loaded when build_engine returns (background loads: see below)
    return EngineConfig(tiny_checkpoint, dtype="float32", max_batch_size=8, max_seq_len=64, freezing=False,
                        warm_start="blocking")


WORKER_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    start = time.perf_counter()
    from torch._dynamo.utils import counters
    from handler.engine.compiled.artifacts import ArtifactPlaces
    from handler.engine.config import EngineConfig
    from handler.engine.factory import build_engine
    from handler.engine.sampling import SamplingParams
    from tests.support.generate import generate
    checkpoint, cache_dir, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    cfg = EngineConfig(Path(checkpoint), dtype="float32", max_batch_size=8, max_seq_len=64, freezing=False,
                       warm_start="blocking")
    rejected = []
    loaded = build_engine(cfg, places=ArtifactPlaces(cache_dir=Path(cache_dir)), on_rejected=lambda: rejected.append(1))
    ready = time.perf_counter() - start
    ids = [loaded.engine.tokenizer.encode(p) for p in prompts]
    tokens = generate(loaded.engine, ids, [SamplingParams(max_new_tokens=12, ignore_eos=True)] * len(ids))
    print(json.dumps({"mode": loaded.steps.mode, "ready_s": ready, "tokens": tokens, "rejected": len(rejected),
                      "frames": sum(counters["frames"].values()), "graphs": counters["stats"]["unique_graphs"]}))
""")


def run_worker(cfg: EngineConfig, cache_dir: Path, inductor_dir: Path, cpu_profile: str | None = None) -> tuple[dict, str]:
    """build_engine in a fresh process, as a TorchServe worker (under `cpu_profile` if given, as
    the launcher starts one); returns its report and stderr."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor_dir)}
    if cpu_profile is not None:
        env = platform.child_environment({**env, cpu_profiles.PROFILE_ENV: cpu_profile})
    proc = subprocess.run([sys.executable, "-c", WORKER_SCRIPT, str(cfg.checkpoint_dir), str(cache_dir), json.dumps(PROMPTS)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.fixture(scope="module")
def cold(cfg, tmp_path_factory):
    """A first worker (a fresh process): compiles cold and installs its artifact in a cache dir."""
    cache_dir = tmp_path_factory.mktemp("cache") / "aot"
    report, _ = run_worker(cfg, cache_dir, tmp_path_factory.mktemp("inductor"))
    assert report["mode"] == "aot-compiled", report["mode"]
    return report, cache_dir


@pytest.fixture(scope="module")
def loaded(cfg, cold):
    """This process loads the cold worker's artifact: the steps the other tests drive."""
    engine = build_engine(cfg, places=ArtifactPlaces(cache_dir=cold[1]))
    assert engine.steps.mode == "aot-loaded", engine.steps.mode
    assert engine.steps.serving == "compiled"
    return engine


@pytest.fixture(scope="module")
def key(cfg, cold):
    return artifacts.artifact_key(cfg, artifacts.weights_digest(open_checkpoint(cfg.checkpoint_dir)))


def _greedy_tokens(engine, n: int = 12, lead: str = "") -> list[list[int]]:  # as WORKER_SCRIPT generates
    ids = [engine.tokenizer.encode(lead + p) for p in PROMPTS]
    return generate(engine, ids, [SamplingParams(max_new_tokens=n, ignore_eos=True)] * len(ids))


def _traced_decode_graph(settings) -> torch.fx.GraphModule:
    """What Dynamo hands the compiler for a 3-layer model's decode step under `settings`."""
    args = ModelArgs(vocab_size=256, dim=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=16, intermediate_size=128,
                     norm_eps=1e-5, rope_theta=10000.0, tie_embeddings=True)
    model = Transformer(args).eval()
    model.setup_cache(2 * page_columns(32), 32)
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad(), settings:
        step = torch.compile(model.decode, backend=capture, fullgraph=True, dynamic=True)
        step(torch.arange(2), own_pages(2, 32), torch.arange(2) + 5, 16)
    return graphs[-1]


def test_each_layer_is_traced_once_and_inlined_into_one_flat_graph():
    regions = _traced_decode_graph(torch._dynamo.config.patch(specialize_float=True))
    calls = [n for n in regions.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
    assert len(calls) == 3 and len({c.args[0].target for c in calls}) == 1  # one trace, called by every layer
    flat = _traced_decode_graph(aot.trace_settings())  # as the compiler gets it: Inductor's C++ wrapper cannot call a subgraph
    assert not [n for n in flat.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
    assert sum(n.target is operator.setitem for n in flat.graph.nodes) == 6  # every layer's k and v writes


def test_cold_compile_installs_a_verified_artifact_with_its_key(cold, key):
    _, cache_dir = cold
    assert artifacts.check_dir(cache_dir, key).verdict == Verdict.VERIFIED
    assert json.loads((cache_dir / KEY_FILE_NAME).read_text()) == key.describe()
    assert list((cache_dir / cpp_cache.KERNEL_DIR).rglob("*.so")), "the built C++ kernels travel with the graphs"
    assert list((cache_dir / cpp_cache.HEADER_DIR).glob("*.gch.gz")), "and so does the precompiled header"


def test_compiled_tokens_equal_eager_tokens(cold, loaded, cfg):
    eager = build_engine(dataclasses.replace(cfg, compile="eager")).engine
    assert cold[0]["tokens"] == _greedy_tokens(loaded.engine) == _greedy_tokens(eager)


def test_every_serving_shape_has_a_graph(loaded, cfg):
    """Coverage is proven over the Engine's whole shape domain, not sampled."""
    steps = loaded.steps
    for name, step in (("prefill", steps.prefill), ("decode", steps.decode)):
        for shape in shapes.serving_shapes(name, cfg):
            assert step.match(*shapes.example_args(name, shape, cfg)) is not None, (name, shape)


def test_varied_batches_and_lengths_compile_nothing(loaded, cfg):
    from torch._dynamo.utils import counters

    steps = loaded.steps
    frames_before = sum(counters["frames"].values())
    with torch.compiler.set_stance("fail_on_recompile"):
        for b in (1, 2, 8):
            for t, window in ((16, 64), (48, cfg.max_seq_len), (cfg.max_seq_len, cfg.max_seq_len)):
                steps.prefill(*shapes.example_args("prefill", shapes.Shape(b, t, window), cfg))
            steps.decode(*shapes.example_args("decode", shapes.Shape(b, cfg.max_seq_len), cfg))
    assert sum(counters["frames"].values()) == frames_before


def test_a_shape_outside_the_domain_is_an_error_not_a_recompile(loaded, cfg):
    tokens, pages, positions, window = shapes.example_args("decode", shapes.Shape(2, 64), cfg)
    with pytest.raises(aot.NoMatchingGraph, match="decode: no compiled graph accepts"):
        loaded.steps.decode(tokens, pages.int(), positions, window)  # int32 page indices: the Engine sends int64


def test_one_general_graph_per_step_plus_a_batch_1_decode_graph(loaded, cfg):
    """The batch is compiled unbacked, so one graph serves every batch; decode also has a
    batch-1 graph (matrix-vector kernels), which batch 1 gets and no other batch does."""
    prefill, decode = loaded.steps.prefill, loaded.steps.decode
    assert (len(prefill.graphs), len(decode.graphs)) == (1, 2)
    assert decode.match(*shapes.example_args("decode", shapes.Shape(1, 64), cfg)) is decode.graphs[0]
    for batch in range(2, cfg.max_batch_size + 1):
        assert decode.match(*shapes.example_args("decode", shapes.Shape(batch, 64), cfg)) is decode.graphs[1]


@pytest.mark.parametrize(("name", "shape"), [("decode", shapes.Shape(1, 64)), ("decode", shapes.Shape(3, 64)),
                                           ("prefill", shapes.Shape(2, 16, 64))])
def test_steps_are_called_flat_with_their_bytecode_s_results(loaded, cfg, name, shape):
    """After a first call, a step skips the bytecode that gathers its inputs (flat_call), and
    returns what the bytecode returns."""
    step = getattr(loaded.steps, name)
    first = shapes.example_args(name, shape, cfg)
    step(*first)
    assert step.called_flat(*first)
    # Same shapes, other tokens: the flat call must use this call's tensors, not the first call's.
    args = (torch.randint_like(first[0], 0, 200, generator=torch.Generator().manual_seed(0)), *first[1:])
    with torch.no_grad():
        through_bytecode = step.match(*args)(step.model, *args)
    assert torch.equal(step(*args), through_bytecode)
    assert not torch.equal(through_bytecode, step(*first))


def test_a_graph_whose_inputs_cannot_be_placed_keeps_its_bytecode_and_says_so(loaded, cfg, monkeypatch, caplog):
    decode = loaded.steps.decode
    step = aot.CompiledStep(decode.model, "decode", decode.graphs)
    monkeypatch.setattr(aot, "record", lambda graph, model, args: (graph(model, *args), None))  # recording gives up
    args = shapes.example_args("decode", shapes.Shape(1, 64), cfg)
    first = step(*args)
    assert not step.called_flat(*args)
    assert "decode: the graph for shapes" in caplog.text and "called through its bytecode" in caplog.text
    assert torch.equal(step(*args), first)


def test_artifact_loads_in_a_fresh_process_without_tracing(cold, cfg, tmp_path):
    """A replacement worker: empty Inductor cache, only the restored artifact."""
    out, stderr = run_worker(cfg, cold[1], tmp_path / "inductor")
    assert out["mode"] == "aot-loaded"
    assert out["frames"] == 0 and out["graphs"] == 0, "loading must not trace or compile anything"
    assert "compiled at load" not in stderr, "the C++ kernels must come from the artifact"
    assert out["tokens"] == cold[0]["tokens"], "the loaded graphs must be the compiled ones"
    assert out["ready_s"] < 60, out["ready_s"]  # ~8 s here; the cold worker took ~45 s


# ---- the key and verification: no compile needed; the cold path is stubbed and observed ------

class ColdPath(Exception):
    pass


@pytest.fixture
def observed(monkeypatch):
    """Record which path build_steps takes without compiling: a cold compile raises ColdPath."""
    calls = {"loads": 0}

    def no_compile(*args):
        raise ColdPath

    def count_load(model, path):
        calls["loads"] += 1
        raise AssertionError(f"load_artifacts({path}) must not be reached")

    monkeypatch.setattr(aot, "compile_steps", no_compile)
    monkeypatch.setattr(side_by_side, "compile_in_parts", no_compile)
    monkeypatch.setattr(saved_graphs, "load_artifacts", count_load)
    return calls


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def test_key_changes_with_torch_version_and_compile_config(cfg, key, monkeypatch):
    digest = key.weights_digest
    assert artifacts.artifact_key(cfg, digest) == key
    assert artifacts.artifact_key(dataclasses.replace(cfg, max_autotune=True), digest) != key
    assert artifacts.artifact_key(dataclasses.replace(cfg, max_seq_len=128), digest) != key
    assert artifacts.artifact_key(cfg, "0" * 64) != key
    monkeypatch.setattr("handler.cache.key.torch_version", lambda: "2.14.0+cpu")
    assert artifacts.artifact_key(cfg, digest).torch_version == "2.14.0+cpu"
    assert artifacts.artifact_key(cfg, digest) != key


def test_another_torch_version_takes_the_cold_path(cold, loaded, cfg, key, tmp_path, monkeypatch, observed, caplog):
    cache_dir = _copy(cold[1], tmp_path / "aot")
    monkeypatch.setattr("handler.cache.key.torch_version", lambda: "2.14.0+cpu")
    newer = artifacts.artifact_key(cfg, key.weights_digest)
    assert artifacts.check_dir(cache_dir, newer).verdict == Verdict.OTHER_KEY
    with pytest.raises(CompileError) as err:
        build_steps(loaded.model, cfg, artifacts_wanted=ArtifactRequest(newer, ArtifactPlaces(cache_dir=cache_dir)))
    assert isinstance(err.value.__cause__, ColdPath) and observed["loads"] == 0
    assert "torch_version: '2.13" in caplog.text and "compiling cold" in caplog.text


def _lower_profile() -> str | None:
    """A profile below the one this process runs whose ATen kernels differ too (avx2 on AVX-512,
    the x86_64 baseline on AVX2; not avx512 on avx512_bf16, which shares its ATen ISA)."""
    plat = platform.detect()
    below = [p for p in plat.usable[plat.usable.index(plat.profile) + 1:]
             if p.aten_capability != plat.profile.aten_capability]
    return below[0].name if below else None


@pytest.mark.skipif(_lower_profile() is None, reason="no CPU profile below this process's: nothing to cross to")
def test_an_artifact_never_crosses_cpu_profiles(cold, cfg, key, tmp_path):
    """Built under this CPU's profile, restored under a lower one: refused (logged, counted),
    compiled fresh for that profile; a worker of that profile then restores it warm."""
    lower = _lower_profile()
    cache_dir = _copy(cold[1], tmp_path / "aot")
    report, stderr = run_worker(cfg, cache_dir, tmp_path / "inductor", cpu_profile=lower)
    assert report["mode"] == "aot-compiled" and report["rejected"] == 1
    assert "REFUSED: built for another key (device_capability: 'x86_64 " in stderr  # ATen's ISA differs, and
    assert "config_digest" in stderr  # the CPU code target in the config
    assert json.loads((cache_dir / KEY_FILE_NAME).read_text())["digest"] != key.digest()
    again, _ = run_worker(cfg, cache_dir, tmp_path / "inductor-2", cpu_profile=lower)
    assert again["mode"] == "aot-loaded" and again["rejected"] == 0
    assert again["tokens"] == report["tokens"]


@pytest.mark.parametrize("victim", ["graph", "kernel", "manifest"])
def test_tampered_artifact_is_rejected_counted_and_never_loaded(cold, loaded, cfg, key, tmp_path, observed, victim, caplog):
    cache_dir = _copy(cold[1], tmp_path / "aot")
    path = {"graph": cache_dir / "decode-0.bin", "kernel": next((cache_dir / cpp_cache.KERNEL_DIR).rglob("*.so")),
            "manifest": cache_dir / MANIFEST_NAME}[victim]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    rejected = []
    request = ArtifactRequest(key, ArtifactPlaces(cache_dir=cache_dir), on_rejected=lambda: rejected.append(1))
    with pytest.raises(CompileError) as err:
        build_steps(loaded.model, cfg, artifacts_wanted=request)
    assert isinstance(err.value.__cause__, ColdPath) and observed["loads"] == 0
    assert rejected == [1] and "REJECTED" in caplog.text


def test_store_never_installs_a_tampered_artifact(cold, key, tmp_path):
    """The sidecar's path: an artifact altered in the store is refused by the restore."""
    store = LocalStore(tmp_path / "store", progress=False)
    assert publish_if_new(store, key, cold[1]) == "published"
    blob = max((tmp_path / "store").rglob("blobs/*"), key=lambda p: p.stat().st_size)
    blob.write_bytes(blob.read_bytes()[:-1] + b"\0")
    dest = tmp_path / "restored"
    assert restore(store, key, dest) == RestoreOutcome.REJECTED
    assert not dest.exists()


def test_weights_digest_is_read_from_the_archive_not_recomputed(tiny_checkpoint, tmp_path, monkeypatch):
    ckpt_dir = _copy(tiny_checkpoint, tmp_path / "ckpt")
    ckpt = open_checkpoint(ckpt_dir)
    digest = artifacts.write_weights_digest(ckpt, ckpt_dir)

    def no_hashing(paths):
        raise AssertionError("weights were hashed again")

    with monkeypatch.context() as m:
        m.setattr(artifacts, "digest_files", no_hashing)
        assert artifacts.weights_digest(ckpt) == digest
    weights = ckpt.weight_files[0]
    weights.write_bytes(weights.read_bytes() + b"\0")  # a different file: the record no longer applies
    assert artifacts.weights_digest(open_checkpoint(ckpt_dir)) != digest


def test_inductor_cache_inside_the_artifact_dir_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "aot" / "inductor"))
    with pytest.raises(ValueError, match="inside the compile artifact dir"):
        artifacts.check_layout(ArtifactPlaces(cache_dir=tmp_path / "aot"))


def test_archive_aot_packs_an_artifact_the_worker_loads(tiny_checkpoint, key, tmp_path):
    """archive.sh --aot: the .mar's key (what the sidecar restores by) is the worker's key, and a
    worker of the unpacked .mar loads the packed artifact instead of compiling."""
    import zipfile

    import yaml

    from handler.packing.cli import main
    from handler.packing.precompile import key_for_mar
    from handler.serving.config import HandlerConfig

    store = tmp_path / "model_store"
    assert main(["--checkpoint", str(tiny_checkpoint), "--model-store", str(store), "--dtype", "float32",
                 "--batch-size", "8", "--max-seq-len", "64", "--aot"]) == 0
    mar = store / "llm.mar"
    assert key_for_mar(mar) == key
    model_dir = tmp_path / "model_dir"
    zipfile.ZipFile(mar).extractall(model_dir)
    handler_cfg = HandlerConfig.from_model_yaml(yaml.safe_load((model_dir / "model-config.yaml").read_text()), model_dir,
                                                environ={})
    places = ArtifactPlaces(bundled_dir=model_dir / artifacts.MAR_ARTIFACT_DIR)
    loaded = build_engine(handler_cfg.engine, places=places)
    assert loaded.steps.mode == "aot-background" and loaded.steps.artifact_dir == places.bundled_dir
    assert loaded.steps.serving == "loading"
    assert loaded.steps.background.done.wait(120) and loaded.steps.background.compiled


# ---- background warm start --------------------------------------------------------------------

def test_background_load_serves_eager_then_the_loaded_graphs(cfg, cold, loaded):
    switched = []
    engine = build_engine(dataclasses.replace(cfg, warm_start="background"), places=ArtifactPlaces(cache_dir=cold[1]),
                          on_compiled=switched.append)
    assert engine.steps.mode == "aot-background"
    assert engine.steps.background.done.wait(120) and engine.steps.background.compiled
    assert len(switched) == 1, "reported as the load ends, before any step: an idle replica's gauge tells the truth"
    # prompts no earlier test sent: the module's `loaded` engine would reuse their cached prefix,
    # prefilling fewer rows, and with random weights a rounding difference flips a near-tie
    fresh = "switch: "
    assert _greedy_tokens(engine.engine, lead=fresh) == _greedy_tokens(loaded.engine, lead=fresh), \
        "after the switch it runs the compiled graphs"
    assert len(switched) == 1 and switched[0] > 0, "reported once"


@pytest.mark.parametrize("on_error", ["raise", "eager"])
def test_background_load_failure_is_loud(cfg, cold, monkeypatch, on_error):
    def broken(model, path):
        raise aot.AotError("simulated: graph does not load")

    monkeypatch.setattr(saved_graphs, "load_artifacts", broken)
    fallbacks = []
    engine = build_engine(dataclasses.replace(cfg, warm_start="background", on_compile_error=on_error),
                          places=ArtifactPlaces(cache_dir=cold[1]), on_fallback=fallbacks.append)
    assert engine.steps.background.done.wait(120) and not engine.steps.background.compiled
    ids = [engine.engine.tokenizer.encode(PROMPTS[0])]
    if on_error == "raise":
        with pytest.raises(CompileError, match="simulated"):
            generate(engine.engine, ids, [SamplingParams(max_new_tokens=2)])
    else:
        assert generate(engine.engine, ids, [SamplingParams(max_new_tokens=2)])
        assert fallbacks and "simulated" in fallbacks[0] and len(fallbacks) == 1
