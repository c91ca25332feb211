"""Ahead-of-time compiled prefill and decode: compiled once, saved, loaded without tracing.

`torch.compile(...).aot_compile()` captures one graph per call (Dynamo + Inductor, the code a
first call would produce) into an object that serializes with its guards. Lengths are dynamic,
and the batch is compiled as an unbacked size, which torch cannot specialize to 1 (its 0/1
rule), so one graph per step usually serves every shape. That is checked, not assumed: every
shape the Engine can send is enumerated (it pads prompts and picks attention windows as
shapes.prefill_width and shapes.decode_window say), and a graph is added for each shape no graph's guards accept yet. Serving therefore
never meets a shape that would need a recompile.

Parameters and KV-cache buffers stay graph inputs, read from the live model at each call (no
freezing): prefill and decode share one cache, and an artifact holds code, not weights.

On CPU the serialized graphs carry their C++ kernels as source only, so the built kernels and
Inductor's precompiled header travel with them (handler.engine.compiled.cpp_cache).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from handler.engine import EngineError
from handler.engine.compiled.compile_progress import CompileProgress
from handler.engine.compiled.flat_call import FlatCall, record
from handler.engine.compiled.shapes import Shape, StepName, compile_order, example_args, model_sizes, serving_shapes
from handler.engine.config import EngineConfig
from handler.engine.model.transformer import Transformer

log = logging.getLogger(__name__)

STEPS: tuple[StepName, ...] = ("prefill", "decode")
# Bump when the saved graphs' layout changes: it is part of the artifact's cache key (what each
# value meant: docs/benchmarks.md, "Compile settings").
FORMAT = 17


class AotError(EngineError, RuntimeError):
    """Artifacts cannot be built or loaded; the message names the step, file or shape."""


class NoMatchingGraph(AotError):
    """A call whose shapes no compiled graph accepts: serving it would need a recompile."""


# ---- a step: its graphs and the dispatch between them -----------------------------------------

class CompiledStep:
    """Runs the first graph whose guards accept the call; no graph accepting is an error.

    Callers must not be in inference mode: the guards check each tensor's dispatch keys, and
    inference tensors lack the autograd key the graphs were captured with.
    """

    def __init__(self, model: Transformer, step: StepName, graphs: list[Any] | None = None):
        self.model, self.step = model, step
        self.graphs: list[Any] = []
        # Checking a graph's guards reads every weight's metadata, a share of a batch-1 decode
        # step (docs/benchmarks.md, "Engine choices"); the answer depends only on the arguments'
        # metadata (the model is fixed).
        self._matched: dict[tuple[Any, ...], Any] = {}
        # The same signature also fixes each graph's flat inputs: called flat, a step skips the
        # bytecode that gathers them (handler.engine.compiled.flat_call). None: recorded, not placeable.
        self._flat: dict[tuple[Any, ...], FlatCall | None] = {}
        for graph in graphs or []:
            self.add(graph)

    def add(self, graph: Any) -> None:
        # match() checks the guards once; the graph need not check them again on each call.
        graph.disable_guard_check()
        self.graphs.append(graph)

    def match(self, *args: Any) -> Any | None:
        return self._match(_signature(args), args)

    @torch.no_grad()  # grad mode is guarded too: the graphs were captured without grad
    def _match(self, signature: tuple[Any, ...], args: tuple[Any, ...]) -> Any | None:
        graph = self._matched.get(signature)
        if graph is None:
            graph = next((g for g in self.graphs if g.guard_check(self.model, *args)), None)
            if graph is not None:
                self._matched[signature] = graph
        return graph

    @torch.no_grad()
    def __call__(self, *args: Any) -> Tensor:
        signature = _signature(args)
        flat = self._flat.get(signature)
        if flat is not None:
            return flat(args)
        graph = self._match(signature, args)
        if graph is None:
            raise NoMatchingGraph(f"{self.step}: no compiled graph accepts shapes ({_describe(args)}); "
                                  f"the first one says: {self._first_reason(args)}")
        if signature in self._flat:
            return graph(self.model, *args)
        result, self._flat[signature] = record(graph, self.model, args)
        if self._flat[signature] is None:
            log.warning("%s: the graph for shapes (%s) is called through its bytecode (~0.3 ms a step slower): "
                        "its inputs cannot all be placed", self.step, _describe(args))
        return result

    def called_flat(self, *args: Any) -> bool:
        """Whether calls with these arguments' signature skip the graph's bytecode (after a first call)."""
        return self._flat.get(_signature(args)) is not None

    def _first_reason(self, args: tuple[Any, ...]) -> str:
        if not self.graphs:
            return "there are no graphs"
        graph = self.graphs[0]  # its guard manager names the failing guard (private API, error path only)
        return str(graph._artifacts.guard_manager.check_verbose(graph.prepare_f_locals(self.model, *args)))


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What the guards can see of the arguments: tensor metadata, and other values as they are."""
    return tuple((a.shape, a.stride(), a.dtype, a.device, a.requires_grad, a.is_inference()) if isinstance(a, Tensor)
                 else (type(a), a) for a in args)


def _describe(args: tuple[Any, ...]) -> str:
    return ", ".join(str(tuple(a.shape)) if isinstance(a, Tensor) else repr(a) for a in args)


@dataclass
class AotSteps:
    prefill: CompiledStep
    decode: CompiledStep
    examples: dict[str, list[Shape]] = field(default_factory=dict)  # each graph's example shape

    def step(self, name: StepName) -> CompiledStep:
        return self.prefill if name == "prefill" else self.decode


# ---- compiling --------------------------------------------------------------------------------

def unsupported_reason(cfg: EngineConfig) -> str | None:
    """Why this configuration cannot use AOT artifacts, or None when it can."""
    if cfg.compile != "inductor":
        return f"compile={cfg.compile}"
    if torch.device(cfg.device).type != "cpu":
        return "AOT artifacts are built and tested on CPU only (CUDA compiles at each start)"
    if cfg.freezing:
        # Frozen weights become constants of the graph: the artifact would carry the weights,
        # and torch 2.13's aot_compile cannot serialize frozen graphs.
        return "freezing: true (frozen graphs cannot be saved; set freezing: false)"
    return None


def compile_steps(model: Transformer, cfg: EngineConfig) -> AotSteps:
    """AOT-compile prefill and decode so that every serving shape has a graph."""
    reason = unsupported_reason(cfg)
    if reason is not None:
        raise AotError(f"cannot AOT-compile: {reason}")
    examples: dict[str, list[Shape]] = {}
    steps = {}
    progress = CompileProgress(sum(expected_graphs(name) for name in STEPS))
    for name in STEPS:
        steps[name], examples[name] = compile_step(model, name, cfg, progress)
    return AotSteps(steps["prefill"], steps["decode"], examples)


# A step's graphs: "batch 1" is decode's graph specialized to one sequence (single_shapes),
# "general" the graphs with an unbacked batch that cover every serving shape.
GraphKind = Literal["batch 1", "general"]
KINDS: tuple[GraphKind, ...] = ("batch 1", "general")


def expected_graphs(step: StepName, kinds: tuple[GraphKind, ...] = KINDS) -> int:
    """How many graphs of `kinds` a step usually has: one general graph, and decode's batch-1
    graph (the coverage loop adds any a shape needs; this only sizes the progress lines)."""
    return ("general" in kinds) + (step == "decode" and "batch 1" in kinds)


def single_shapes(step: StepName, cfg: EngineConfig, sizes: set[int]) -> list[Shape]:
    """The example of decode's batch-1 graph (one sequence decoding alone): the batch is
    specialized to 1, the window stays a symbol, so one graph serves every window. Its
    projections compile to matrix-vector kernels (linear.Linear). Compiled first, it is what
    match() picks for batch 1. One graph rather than one per window: about as fast, for a
    quarter of the compile time (docs/benchmarks.md, "Compile settings")."""
    if step != "decode":
        return []
    windows = sorted({s.length for s in serving_shapes(step, cfg)})
    return [Shape(1, next((n for n in windows if n not in sizes), windows[-1]))]


def compile_step(model: Transformer, name: StepName, cfg: EngineConfig, progress: CompileProgress,
                 kinds: tuple[GraphKind, ...] = KINDS) -> tuple[CompiledStep, list[Shape]]:
    """Graphs of `kinds` for `name` (with "general": until every serving shape has one);
    returns them with their examples."""
    step, examples = CompiledStep(model, name), []
    sizes = model_sizes(model)
    single = single_shapes(name, cfg, sizes) if "batch 1" in kinds else []
    general = compile_order(serving_shapes(name, cfg), sizes) if "general" in kinds else []
    for shape in single + general:
        args = example_args(name, shape, cfg)
        if step.match(*args) is not None:
            continue
        kind = "batch 1" if shape in single else "general"
        log.info("aot: %s", progress.starting(f"{name}, {kind}, example batch {shape.batch}, length {shape.length}"))
        start = time.perf_counter()
        step.add(_aot_compile(getattr(model, name), args, cfg, unbacked=shape not in single))
        examples.append(shape)
        progress.finished(time.perf_counter() - start)
        log.info("aot: compiled %s graph %d in %.1f s", name, len(examples), progress.seconds[-1])
    return step, examples


def _aot_compile(fn: Any, args: tuple[Any, ...], cfg: EngineConfig, unbacked: bool = True) -> Any:
    for arg in args:
        if isinstance(arg, Tensor) and unbacked:
            # The batch as an unbacked size: torch then cannot specialize it to 1 (the 0/1 rule),
            # so one graph serves batch 1 and batch 32 alike instead of two.
            torch._dynamo.decorators.mark_unbacked(arg, 0)
    # size_asserts off: CompiledStep.match has checked the guards (every input's sizes and strides).
    # cpp_wrapper: the code calling a step's ~400 kernels is C++, not Python (a third off a
    # batch-1 step); built apart from the kernels, so the kernels' -O3 does not cost a minute on
    # it. Measurements: docs/benchmarks.md, "Compile settings".
    options: dict[str, Any] = {"max_autotune": cfg.max_autotune, "size_asserts": False, "cpp_wrapper": True,
                               "cpp_wrapper_build_separate": True}
    # Typed as a plain callable; what torch.compile returns for a function has aot_compile.
    compiled: Any = torch.compile(fn, fullgraph=True, dynamic=True, options=options)
    with torch.no_grad(), trace_settings():
        return compiled.aot_compile((args, {}))


def trace_settings() -> Any:
    """Dynamo's settings for tracing the model's steps (a context manager).

    Module floats (norm eps) would be traced as symbols: plain torch.compile then restarts and
    specializes them, aot_compile cannot restart, so they are specialized up front. Each layer's
    step is a compile region (model.Block): Dynamo traces it once for all 30 layers, and inlining
    the regions gives AOT autograd and Inductor the flat graph they would otherwise get (the same
    kernels, outputs equal bit for bit), a fifth less compile CPU. Without the inlining Inductor
    would call the region as a subgraph, which its C++ wrapper cannot do."""
    return torch._dynamo.config.patch(specialize_float=True, inline_invoke_subgraph=True)
