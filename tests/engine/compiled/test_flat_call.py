"""Flat calls: a recorded graph input list reused with each call's own tensors put in place.

The real graphs are covered in test_aot.py (called flat, equal to their bytecode's results);
here is what recording must refuse, on a stand-in compiled function.
"""
from __future__ import annotations

import torch
from torch import nn

from handler.engine.compiled.flat_call import _flat_call


def _echo(*flat):
    """A compiled function's stand-in: returns its inputs as its outputs."""
    return list(flat)


def test_the_call_s_tensors_go_where_the_recorded_call_had_its_own():
    model, first, second = nn.Linear(2, 2), torch.zeros(3), torch.ones(3)
    inputs = (model.weight, first, 7, model.bias)
    flat = _flat_call(_echo, inputs, _echo(*inputs), first, model, (first, 7))
    assert flat is not None and flat.output == 1
    assert flat((second, 7)) is second
    assert flat.template[0] is model.weight and flat.template[1] is None  # no reference to the first call's tensor


def test_a_tensor_neither_the_model_s_nor_an_argument_is_refused():
    model, arg, stray = nn.Linear(2, 2), torch.zeros(3), torch.zeros(3)
    assert _flat_call(_echo, (model.weight, arg, stray), [arg], arg, model, (arg,)) is None


def test_a_result_that_is_not_one_of_the_outputs_is_refused():
    model, arg = nn.Linear(2, 2), torch.zeros(3)
    assert _flat_call(_echo, (model.weight, arg), [arg], arg.clone(), model, (arg,)) is None


def test_an_input_of_another_kind_is_refused():
    model, arg = nn.Linear(2, 2), torch.zeros(3)
    assert _flat_call(_echo, (arg, "cpu"), [arg], arg, model, (arg,)) is None
