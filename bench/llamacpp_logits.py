"""Next-token distributions at every scored position of a text: ours from a model's hidden states,
llama.cpp's from `llama-perplexity --kl-divergence-base` (its chunks of n_ctx tokens, each chunk's
second half scored), so the two are compared on the same positions (bench/quality.py,
bench/gguf_files.py)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import torch

TEXT = Path(__file__).resolve().parent / "data" / "perplexity.txt"


def all_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token logits [T, V] at every position of one sequence (Transformer.prefill keeps only the
    last), through the model's slot 0: the model's cache must hold T positions."""
    with torch.no_grad():
        x = model.hidden(tokens, torch.tensor([0]), torch.tensor([0]), tokens.shape[1])
        return model.output(model.norm(x[0])).float()


def llama_perplexity(build: dict, gguf: Path, ctx: int, tmp: Path) -> tuple[float, Path]:
    """llama.cpp's final perplexity estimate on TEXT, and the file of its tokens and log-probabilities."""
    saved = tmp / f"{gguf.stem}.kld"
    cmd = [build["binaries"]["llama-perplexity"], "-m", str(gguf), "-f", str(TEXT), "-c", str(ctx), "-b", str(ctx),
           "-t", str(torch.get_num_threads()), "--kl-divergence-base", str(saved)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", run.stdout + run.stderr)
    if run.returncode or not found:
        raise SystemExit(f"llama-perplexity failed ({run.returncode}):\n{run.stderr[-3000:]}")
    return float(found.group(1)), saved


class Saved:
    """llama-perplexity's saved chunks: tokens [chunks, n_ctx] and, per scored position, its
    log-probabilities as uint16 codes (higher = likelier) after the row's scale and minimum as two
    float32s: log p = minimum + scale * code, over a window of e^16 below the most likely token."""

    def __init__(self, path: Path):
        data = np.memmap(path, dtype=np.uint8, mode="r")
        assert bytes(data[:8]) == b"_logits_", path
        self.n_ctx, self.n_vocab, chunks = (int(v) for v in np.frombuffer(bytes(data[8:20]), dtype="<i4"))
        at = 20 + 4 * chunks * self.n_ctx
        self.tokens = torch.from_numpy(data[20:at].view(np.int32).reshape(chunks, self.n_ctx).astype(np.int64))
        self.first = self.n_ctx // 2  # the first scored position's logits predict token first + 1
        self.scored = self.n_ctx - 1 - self.first
        width = 2 * ((self.n_vocab + 1) // 2) + 4
        self._rows = data[at:at + 2 * chunks * self.scored * width].view(np.uint16).reshape(chunks, self.scored, width)

    def targets(self, chunk: int) -> torch.Tensor:
        return self.tokens[chunk, self.first + 1:]

    def codes(self, chunk: int) -> torch.Tensor:
        """[scored, V] int32."""
        return torch.from_numpy(self._rows[chunk, :, 4:4 + self.n_vocab].astype(np.int32))

    def is_top(self, chunk: int, tokens: torch.Tensor) -> torch.Tensor:
        """[scored] bool: whether tokens [scored] are llama.cpp's most likely there (a tie at its
        16-bit resolution counts)."""
        codes = self.codes(chunk)
        return codes.gather(1, tokens[:, None])[:, 0] == codes.max(-1).values

    def log_probs(self, chunk: int) -> torch.Tensor:
        """[scored, V] float32; tokens below the window get its floor."""
        head = torch.from_numpy(np.ascontiguousarray(self._rows[chunk, :, :4]).view(np.float32).copy())  # [scored, 2]
        return head[:, 1:] + head[:, :1] * self.codes(chunk).float()


def first_token(gguf: Path) -> int | None:
    """The BOS llama-perplexity puts first in every chunk, or None when the file adds none."""
    from handler.engine.quant.gguf_file import read_directory

    meta = read_directory(gguf).metadata
    return int(meta["tokenizer.ggml.bos_token_id"]) if meta.get("tokenizer.ggml.add_bos_token", True) else None


def chunk_logits(model, saved: Saved, bos: int | None) -> list[torch.Tensor]:
    """Per chunk, our next-token logits [scored, V] at llama-perplexity's scored positions."""
    out = []
    for ids in saved.tokens:
        ids = ids.clone()
        if bos is not None:  # llama-perplexity starts every chunk with BOS
            ids[0] = bos
        out.append(all_logits(model, ids[None])[saved.first:saved.n_ctx - 1])
    return out
