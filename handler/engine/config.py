"""Engine configuration: what to load, where, in which dtype, and how to compile it."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
PACKINGS = ("auto", "off", "bfloat16", "float32")
QUANTIZATIONS = ("auto", "none", "int8", "int4", "gguf")
THREADINGS = ("pool", "openmp")
ACTIVATION_ROUNDS = {"fine": 2, "int8": 1}  # activations -> how often the quantized kernels round x (quantized.c)


def find_gguf(checkpoint_dir: Path) -> Path | None:
    """The checkpoint's GGUF file (its quantized form, kept beside the float weights), if any."""
    files = sorted(Path(checkpoint_dir).glob("*.gguf"))
    if len(files) > 1:
        raise ValueError(f"checkpoint {checkpoint_dir} has {len(files)} GGUF files ({', '.join(f.name for f in files)}); keep one")
    return files[0] if files else None


DtypeChoice = Literal["auto", "bfloat16", "float32"]
Quantization = Literal["auto", "none", "int8", "int4", "gguf"]


def auto_dtype(dtype: DtypeChoice, quantization: str, device_type: str) -> DtypeChoice:
    """`dtype: auto` with quantized weights on CPU is float32: their products are float32 whatever the
    dtype, and bf16 activations between them change answers (the default model: 13 of 21 greedy
    answers as unrounded, against 20 in float32; docs/benchmarks.md "Faithful answers"), and were
    no faster. Otherwise `auto` is left for platform.choose_path (the fastest path)."""
    return "float32" if dtype == "auto" and quantization != "none" and device_type == "cpu" else dtype


@dataclass(frozen=True)
class EngineConfig:
    checkpoint_dir: Path
    # "auto": what measured fastest on this CPU profile (handler.engine.platform.choose_path);
    # handler.engine.platform.resolve replaces it before anything is loaded, so a built engine's config is concrete.
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    device: str = "cpu"  # "cpu", "cuda" or "cuda:N"
    max_batch_size: int = 32  # slots: sequences decoded together
    max_seq_len: int = 2048  # prompt + generated tokens per sequence
    # The KV cache's positions, one pool every sequence takes pages of as it grows (handler.engine.kv.pages);
    # 0: max_batch_size x max_seq_len. At least max_seq_len: one request may fill the whole context.
    kv_tokens: int = 0
    compile: Literal["inductor", "eager"] = "inductor"
    on_compile_error: Literal["raise", "eager"] = "raise"
    # A verified AOT artifact: "background" serves eager steps while it loads (~2-3 s) and then
    # switches (handler.engine.compiled.warm_start); "blocking" loads it before the engine is returned.
    warm_start: Literal["background", "blocking"] = "background"
    # Inductor constant-folds and prepacks weights (oneDNN on CPU). Off: measured no faster for
    # decode here (bf16, batch 1/8/16), and frozen graphs cannot be saved as AOT artifacts.
    freezing: bool = False
    max_autotune: bool = False  # Inductor benchmarks GEMM kernels (C++ templates on CPU): faster decode, slower compile
    # oneDNN-packed copies of the projection weights for calls with several rows (CPU;
    # handler.engine.model.packed), in bf16 or float32: faster GEMMs, one more copy in memory.
    packed_weights: Literal["auto", "off", "bfloat16", "float32"] = "auto"
    # Weight-only quantized projections (handler.engine.quant): "none", "int8" (per output channel),
    # "int4" (asymmetric, per group of group_size), "gguf" (the checkpoint's GGUF file as stored:
    # Q8_0 / Q4_0 / Q4_1); "auto" is gguf when the checkpoint has one, else none.
    quantization: Quantization = "auto"
    group_size: int = 32  # int4 weights per scale and minimum: a multiple of 32
    # How the quantized products take x: "fine" rounds it to int8 per block of 32 and then its rounding
    # error the same way (~15 bits: the default model answers as it does unrounded, docs/benchmarks.md
    # "Faithful answers"); "int8" rounds it once, as llama.cpp's Q8 activations do (fewer integer products).
    activations: Literal["fine", "int8"] = "fine"
    # Who runs the quantized products' threads on CPU (handler.engine.kernels.threads): "pool", the
    # kernels' own (a thread that lost its core to another process holds nobody up; torch's own ops
    # then run on one thread), or "openmp", torch's libgomp team for everything, as before issue 58.
    threading: Literal["pool", "openmp"] = "pool"
    cuda_graphs: bool = True  # decode under CUDA graphs on CUDA devices
    threads: int | None = None  # the products' threads on CPU (threading); None: torch's default (the cores)
    # Padded prompt tokens prefilled per step, all new sequences together (a multiple of 16):
    # longer prompts are prefilled in chunks between decode steps, so running streams keep going.
    prefill_chunk: int = 512
    # While sequences decode, a step prefills only as many prompt tokens as fit this long at the
    # measured prefill speed (handler.engine.prefill_pace): their gap between tokens stays bounded
    # whatever the model's size. 0: always prefill_chunk. CPU only (a CUDA step is not timed).
    prefill_stall_ms: float = 500.0
    # Keep each slot's KV after its sequence ends, and start a prompt that shares a prefix with
    # what a slot holds after that prefix (handler.engine.kv.prefix_cache). Changes no graph.
    prefix_caching: bool = True

    def __post_init__(self):
        if self.dtype not in ("auto", *DTYPES):
            raise ValueError(f"dtype must be auto or one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.packed_weights not in PACKINGS:
            raise ValueError(f"packed_weights must be one of {', '.join(PACKINGS)}, got {self.packed_weights!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.activations not in ACTIVATION_ROUNDS:
            raise ValueError(f"activations must be one of {', '.join(ACTIVATION_ROUNDS)}, got {self.activations!r}")
        if self.threading not in THREADINGS:
            raise ValueError(f"threading must be one of {', '.join(THREADINGS)}, got {self.threading!r}")
        if self.group_size < 32 or self.group_size % 32:
            raise ValueError(f"group_size must be a positive multiple of 32, got {self.group_size}")
        if self.compile not in ("inductor", "eager"):
            raise ValueError(f"compile must be 'inductor' or 'eager', got {self.compile!r}")
        if self.on_compile_error not in ("raise", "eager"):
            raise ValueError(f"on_compile_error must be 'raise' or 'eager', got {self.on_compile_error!r}")
        if self.warm_start not in ("background", "blocking"):
            raise ValueError(f"warm_start must be 'background' or 'blocking', got {self.warm_start!r}")
        if not self.device.startswith(("cpu", "cuda")):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.prefill_stall_ms < 0:
            raise ValueError(f"prefill_stall_ms must be 0 (off) or positive, got {self.prefill_stall_ms}")
        if self.prefill_chunk < 16 or self.prefill_chunk % 16:
            raise ValueError(f"prefill_chunk must be a positive multiple of 16, got {self.prefill_chunk}")
        if self.max_batch_size < 1 or self.max_seq_len < 32:
            raise ValueError(f"need max_batch_size >= 1 and max_seq_len >= 32, got {self.max_batch_size}, {self.max_seq_len}")
        if self.kv_tokens and self.kv_tokens < self.max_seq_len:
            raise ValueError(f"kv_tokens must be 0 (max_batch_size x max_seq_len) or at least max_seq_len "
                             f"({self.max_seq_len}), got {self.kv_tokens}")

    @property
    def kv_budget(self) -> int:
        """The KV cache's positions, shared by every sequence."""
        return self.kv_tokens or self.max_batch_size * self.max_seq_len

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            raise ValueError("dtype 'auto' is resolved by handler.engine.platform.resolve before the model is loaded")
        return DTYPES[self.dtype]

    def compile_signature(self) -> dict:
        """What a compiled artifact depends on (the checkpoint path does not matter, its weights do)."""
        if "auto" in (self.dtype, self.packed_weights, self.quantization):
            raise ValueError("compile_signature of an unresolved config (auto): resolve it first (handler.engine.platform.resolve)")
        d = asdict(self)
        d.pop("checkpoint_dir")
        d.pop("on_compile_error")
        d.pop("warm_start")
        d.pop("prefix_caching")
        d.pop("prefill_stall_ms")
        d["device"] = torch.device(self.device).type
        return d


def to_json(cfg: EngineConfig) -> str:
    """A resolved config as another process (handler.engine.compiled.cold.in_background) reads it back."""
    return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()})


def from_json(text: str) -> EngineConfig:
    values = json.loads(text)
    return EngineConfig(**{**values, "checkpoint_dir": Path(values["checkpoint_dir"])})
