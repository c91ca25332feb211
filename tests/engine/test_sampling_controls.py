"""LogitControls (engine/sampling.py) on a row of logits (pure), then in the engine on the real default model:
penalties as a reference loop over transformers computes them, one request's controls leave
the other rows of its batch alone."""
from __future__ import annotations

import pytest
import torch

from handler.engine.sampling import LogitControls, SamplingParams
from tests.support.generate import generate

END = frozenset({0})


def _applied(params: SamplingParams, prompt: list[int], outputs: list[int], logits: list[float]) -> list[float]:
    controls = LogitControls(params, prompt, END)
    row = torch.tensor(logits)
    controls.apply(row.clone())  # allocates, as the first step does
    for token in outputs:
        controls.accept(token)
    row = torch.tensor(logits)
    controls.apply(row)
    return row.tolist()


def test_no_controls_asked_builds_none():
    assert LogitControls.for_params(SamplingParams(), [1, 2], END) is None


def test_frequency_penalty_subtracts_per_occurrence_in_the_output():
    out = _applied(SamplingParams(frequency_penalty=0.5), [3], [1, 1, 2], [1.0, 1.0, 1.0, 1.0])
    assert out == [1.0, 0.0, 0.5, 1.0]  # the prompt's token 3 is not counted


def test_presence_penalty_subtracts_once_per_token_present():
    out = _applied(SamplingParams(presence_penalty=0.5), [3], [1, 1, 2], [1.0, 1.0, 1.0, 1.0])
    assert out == [1.0, 0.5, 0.5, 1.0]


def test_repetition_penalty_shrinks_prompt_and_output_tokens_toward_less_likely():
    out = _applied(SamplingParams(repetition_penalty=2.0), [1], [2], [4.0, 4.0, -4.0, 4.0])
    assert out == [4.0, 2.0, -8.0, 4.0]


def test_logit_bias_adds_to_its_tokens():
    out = _applied(SamplingParams(logit_bias=((2, -100.0), (3, 5.0))), [1], [], [1.0, 1.0, 1.0, 1.0])
    assert out == [1.0, 1.0, -99.0, 6.0]


def test_min_tokens_holds_back_end_and_stop_tokens_until_reached():
    params = SamplingParams(max_new_tokens=8, min_tokens=2, stop_token_ids=(3,))
    assert _applied(params, [1], [2], [1.0] * 4) == [float("-inf"), 1.0, 1.0, float("-inf")]
    assert _applied(params, [1], [2, 2], [1.0] * 4) == [1.0] * 4


# ---- in the engine ------------------------------------------------------------------------

PROMPT = "My favourite words are"


def _reference_greedy(model, ids: list[int], n: int, freq: float, pres: float, rep: float, eos: frozenset[int]) -> list[int]:
    """Greedy decoding (end-of-sequence never sampled) with the penalties written out on transformers' logits."""
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(n):
            logits = model(torch.tensor([ids + out])).logits[0, -1].float()
            seen = torch.tensor(sorted(set(ids + out)))
            logits[seen] = torch.where(logits[seen] > 0, logits[seen] / rep, logits[seen] * rep)
            for token in set(out):
                logits[token] -= freq * out.count(token) + pres
            logits[sorted(eos)] = float("-inf")
            out.append(int(logits.argmax()))
    return out


@pytest.mark.parametrize(("freq", "pres", "rep"), [(1.5, 0.0, 1.0), (0.0, 2.0, 1.0), (0.0, 0.0, 1.5), (0.4, 0.3, 1.2)])
def test_penalized_greedy_equals_the_reference_loop(engine, reference, freq, pres, rep):
    ids = engine.tokenizer.encode(PROMPT)
    params = SamplingParams(max_new_tokens=32, ignore_eos=True, frequency_penalty=freq, presence_penalty=pres,
                            repetition_penalty=rep)
    ours = generate(engine, [ids], [params])[0]
    assert ours == _reference_greedy(reference, ids, 32, freq, pres, rep, engine.tokenizer.eos_ids)
    assert ours != generate(engine, [ids], [SamplingParams(max_new_tokens=32, ignore_eos=True)])[0]


def test_one_requests_controls_leave_the_other_rows_alone(engine):
    ids = engine.tokenizer.encode(PROMPT)
    plain = SamplingParams(max_new_tokens=12, ignore_eos=True)
    heavy = SamplingParams(max_new_tokens=12, ignore_eos=True, frequency_penalty=2.0, repetition_penalty=2.0,
                           logit_bias=((42, 100.0),))
    together = generate(engine, [ids, ids, ids], [plain, heavy, plain])
    assert together[0] == together[2] == generate(engine, [ids], [plain])[0]
    assert together[1][0] == 42


def test_stop_token_id_ends_the_sequence_before_it(engine):
    ids = engine.tokenizer.encode(PROMPT)
    free = generate(engine, [ids], [SamplingParams(max_new_tokens=12, ignore_eos=True)])[0]
    stop = free[3]
    cut = generate(engine, [ids], [SamplingParams(max_new_tokens=12, ignore_eos=True, stop_token_ids=(stop,))])[0]
    assert cut == free[:free.index(stop)]


def test_min_tokens_keeps_a_stop_token_from_ending_early(engine):
    ids = engine.tokenizer.encode(PROMPT)
    free = generate(engine, [ids], [SamplingParams(max_new_tokens=12, ignore_eos=True)])[0]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True, stop_token_ids=(free[0],), min_tokens=4)
    out = generate(engine, [ids], [params])[0]
    assert len(out) >= 4 and free[0] not in out[:4]
