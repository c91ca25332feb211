"""A compiled graph called with its flat inputs, without the bytecode that gathers them.

A graph from `aot_compile` is called through bytecode Dynamo generated: it reads each of the
model's ~370 parameters and buffers from its module tree (`self._modules["layers"]._modules["0"]
...`), then calls the compiled function with them and the call's own tensors, flat. On a
batch-1 decode step of a small model that bytecode is a noticeable share of the graph call, every
step (docs/benchmarks.md, "Engine choices"). The flat list depends only on the model (fixed once loaded: its tensors are updated in
place, never replaced) and on the call's arguments, so it is recorded once per argument signature
(one bytecode call) and reused: the call's tensors go into their places, everything else is
kept.

Recording gives up (returns None; the bytecode keeps serving) on anything it cannot place: a
tensor that is neither an argument nor one of the model's, a result that is not one of the
compiled function's outputs, or bytecode that writes anything but its own locals (a Python side
effect Dynamo replays, which skipping the bytecode would lose).
"""
from __future__ import annotations

import dis
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

_CONSTANTS = (int, float, bool, type(None))  # what a flat input may be besides a tensor (sizes, flags)
_SIDE_EFFECTS = {"STORE_ATTR", "STORE_SUBSCR", "STORE_GLOBAL", "STORE_DEREF", "DELETE_ATTR", "DELETE_SUBSCR",
                 "DELETE_GLOBAL", "DELETE_DEREF"}


@dataclass(frozen=True)
class FlatCall:
    compiled_fn: Callable[..., Any]
    template: tuple[Any, ...]                # the flat inputs as recorded
    arg_places: tuple[tuple[int, int], ...]  # (flat position, argument index): the call's own tensors
    output: int                              # which of the compiled function's outputs the step returns

    def __call__(self, args: tuple[Any, ...]) -> Any:
        flat = list(self.template)
        for place, index in self.arg_places:
            flat[place] = args[index]
        return self.compiled_fn(*flat)[self.output]


def record(graph: Any, model: nn.Module, args: tuple[Any, ...]) -> tuple[Any, FlatCall | None]:
    """Calls `graph(model, *args)` once through its bytecode, watching the compiled function's
    inputs and outputs; returns the call's result and the FlatCall that repeats it (None when
    this graph's inputs cannot all be placed)."""
    # Private torch API (torch 2.13's AOTCompiledFunction): the bytecode looks the compiled
    # function up in its globals under the backend id.
    if any(op.opname in _SIDE_EFFECTS for op in dis.get_instructions(graph.fn)):
        return graph(model, *args), None
    backend_id = graph._artifacts.backend_id
    names = graph.fn.__globals__
    compiled_fn = names[backend_id]
    seen: dict[str, Any] = {}

    def watched(*flat: Any) -> Any:
        seen["inputs"] = flat
        seen["outputs"] = compiled_fn(*flat)
        return seen["outputs"]

    names[backend_id] = watched
    try:
        result = graph(model, *args)
    finally:
        names[backend_id] = compiled_fn
    if "inputs" not in seen:
        return result, None
    return result, _flat_call(compiled_fn, seen["inputs"], seen["outputs"], result, model, args)


def _flat_call(compiled_fn: Callable[..., Any], inputs: tuple[Any, ...], outputs: Any, result: Any,
               model: nn.Module, args: tuple[Any, ...]) -> FlatCall | None:
    own = {id(t) for t in model.parameters()} | {id(t) for t in model.buffers()}
    arg_index = {id(a): i for i, a in reversed(list(enumerate(args))) if isinstance(a, Tensor)}
    template, places = list(inputs), []
    for place, value in enumerate(inputs):
        if isinstance(value, Tensor) and id(value) in arg_index:
            places.append((place, arg_index[id(value)]))
            template[place] = None  # filled in by each call; the first call's tensor is not kept
        elif not ((isinstance(value, Tensor) and id(value) in own) or isinstance(value, _CONSTANTS)):
            return None
    if not isinstance(outputs, (list, tuple)):
        return None
    output = next((i for i, out in enumerate(outputs) if out is result), None)
    return None if output is None else FlatCall(compiled_fn, tuple(template), tuple(places), output)
