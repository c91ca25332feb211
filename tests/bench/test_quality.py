"""bench/quality.py's arithmetic and bench/llamacpp_logits.py's reader of llama-perplexity's saved
log-probabilities: a file written here as llama.cpp writes it (16-bit codes over a window of e^16,
each row after its scale and minimum) reads back to the log-probabilities it encoded, and the
comparison counts agreement, ties and KL divergence as documented."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from bench.llamacpp_logits import Saved
from bench.quality import against

N_CTX, VOCAB = 8, 5  # 3 scored positions per chunk: n_ctx - 1 - n_ctx / 2


def _row(logits: np.ndarray) -> np.ndarray:
    """One scored position as llama-perplexity encodes it: scale and minimum log-probability as two
    float32s (four uint16 words), then a code per token (an odd vocabulary padded to even)."""
    top, low = logits.max(), max(logits.min(), logits.max() - 16)
    log_sum_exp = np.log(np.exp(logits - top).sum())
    scale = np.float32((top - low) / 65535)
    head = np.array([scale, low - top - log_sum_exp], dtype=np.float32).view(np.uint16)
    codes = np.where(logits > low, np.rint((logits - low) / scale), 0).astype(np.uint16)
    return np.concatenate([head, codes, np.zeros(2 * ((VOCAB + 1) // 2) - VOCAB, dtype=np.uint16)])


def _saved(tmp_path, logits: np.ndarray, tokens: np.ndarray) -> Saved:
    """logits [chunks, scored, V], tokens [chunks, n_ctx] into a file llama-perplexity could have written."""
    chunks = len(tokens)
    rows = np.stack([_row(logits[c, i]) for c in range(chunks) for i in range(logits.shape[1])])
    path = tmp_path / "base.kld"
    path.write_bytes(b"_logits_" + np.array([N_CTX, VOCAB, chunks], dtype="<i4").tobytes()
                     + tokens.astype("<i4").tobytes() + rows.tobytes())
    return Saved(path)


def test_the_saved_codes_read_back_as_the_log_probabilities_they_encode(tmp_path):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, VOCAB)).astype(np.float32) * 3
    saved = _saved(tmp_path, logits, rng.integers(0, VOCAB, size=(2, N_CTX)))
    assert (saved.n_ctx, saved.scored, saved.first) == (N_CTX, 3, 4)
    exact = F.log_softmax(torch.from_numpy(logits[1]), -1)
    assert (saved.log_probs(1) - exact).abs().max() < 16 / 65535 * 2
    assert torch.equal(saved.targets(1), saved.tokens[1, 5:])


def test_a_path_equal_to_the_reference_agrees_everywhere_with_no_divergence(tmp_path):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(1, 3, VOCAB)).astype(np.float32)
    saved = _saved(tmp_path, logits, rng.integers(0, VOCAB, size=(1, N_CTX)))
    reference = [F.log_softmax(torch.from_numpy(logits[0]), -1)]
    assert against(reference, reference, saved, ties=False) | {"reference_nll": 0} == {
        "top1": 1.0, "kl": 0.0, "ppl_ratio": 1.0, "reference_nll": 0, "positions": 3}


def test_a_different_top_token_counts_against_agreement_and_adds_divergence(tmp_path):
    logits = np.zeros((1, 3, VOCAB), dtype=np.float32)
    logits[0, :, 0] = 4.0  # the reference's top is token 0 everywhere
    saved = _saved(tmp_path, logits, np.zeros((1, N_CTX), dtype=np.int64))
    reference = [F.log_softmax(torch.from_numpy(logits[0]), -1)]
    other = logits.copy()
    other[0, 0, 1] = 8.0  # the first position's top is token 1
    result = against(reference, [F.log_softmax(torch.from_numpy(other[0]), -1)], saved, ties=False)
    assert result["top1"] == round(2 / 3, 4) and result["kl"] > 0 and result["ppl_ratio"] > 1


def test_llamacpps_equal_codes_tie_for_the_top(tmp_path):
    logits = np.zeros((1, 3, VOCAB), dtype=np.float32)
    logits[0, :, 0] = 4.0
    logits[0, :, 2] = 4.0 - 1e-6  # below the 16-bit resolution: the same code as token 0
    saved = _saved(tmp_path, logits, np.zeros((1, N_CTX), dtype=np.int64))
    reference = [F.log_softmax(torch.from_numpy(logits[0]).double(), -1).float()]
    assert against(reference, [saved.log_probs(0)], saved, ties=True)["top1"] == 1.0
