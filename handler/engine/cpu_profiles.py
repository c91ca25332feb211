"""The CPU profiles, best first: named levels of the instruction set (`avx2`, `avx2_vnni`, `avx512`,
`avx512_bf16`, `avx512_amx`, `aarch64`, `aarch64_sve_bf16`, `x86_64`) and what each lets ATen,
oneDNN, MKL, Inductor's -march and our own kernels use. Compiled code built under one profile runs
on every CPU that has that profile's features, and its cache key names the profile
(artifacts.artifact_config). platform.py detects which one a CPU has and applies it."""
from __future__ import annotations

from dataclasses import dataclass

PROFILE_ENV = "TS_LLM_CPU_PROFILE"  # force a profile (one this CPU has); unset: the best one


@dataclass(frozen=True)
class Profile:
    name: str
    arch: str  # platform.machine() it belongs to: "x86_64" | "aarch64"
    requires: frozenset[str]  # CPU feature flags (as /proc/cpuinfo spells them) its code may use
    aten_capability: str  # ATEN_CPU_CAPABILITY: the ATen kernels (and Inductor's vector ISA)
    onednn_max_isa: str | None  # ONEDNN_MAX_CPU_ISA; None: oneDNN's default
    march: str  # -march for Inductor's C++ kernels: no instruction beyond `requires`
    onednn_bf16: bool  # oneDNN has bf16 GEMM kernels here (its bf16 weight reorder accepts bf16)
    # MKL_ENABLE_INSTRUCTIONS (ATen's float32 GEMM on x86 wheels): the highest MKL code path that
    # stays within `requires`; None: MKL's own choice (the top profile, or no MKL)
    mkl_max_isa: str | None = None
    # (CPU flag, GCC target): instructions our own kernels (handler/engine/kernels) add beyond
    # -march where this CPU has them; a forced lower profile lists none, so it runs that ISA alone
    kernel_extras: tuple[tuple[str, str], ...] = ()

    def environment(self) -> dict[str, str]:
        """Variables that make a child process (a TorchServe worker, a test run) use this profile:
        ATen reads ATEN_CPU_CAPABILITY, oneDNN ONEDNN_MAX_CPU_ISA and MKL MKL_ENABLE_INSTRUCTIONS
        once, when torch starts."""
        env = {PROFILE_ENV: self.name, "ATEN_CPU_CAPABILITY": self.aten_capability, "TORCHINDUCTOR_CPP_MARCH": self.march}
        if self.onednn_max_isa is not None:
            env["ONEDNN_MAX_CPU_ISA"] = self.onednn_max_isa
        if self.mkl_max_isa is not None:
            env["MKL_ENABLE_INSTRUCTIONS"] = self.mkl_max_isa
        return env


# The features each -march level assumes (as /proc/cpuinfo names them; "abm" is LZCNT).
_V3 = frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"})
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
# int8 dot products in one instruction (vpdpbusd): Cascade Lake, Ice Lake, Zen 4, Sapphire Rapids
_VNNI = (("avx512_vnni", "avx512vnni"),)
# the same in VEX encoding, 256-bit only: AVX2 CPUs without AVX-512 (Alder Lake, Sierra Forest)
_AVX_VNNI = (("avx_vnni", "avxvnni"),)
# int8 tile products (kernels/amx.c): Sapphire Rapids and later
_AMX_INT8 = (("amx_tile", "amx-tile"), ("amx_int8", "amx-int8"))
TILE_FLAGS = frozenset({"amx_tile", "amx_int8", "amx_bf16"})  # what a process may be refused (platform._tiles_granted)
# Best first: a CPU gets the first profile whose features it has.
PROFILES: tuple[Profile, ...] = (
    Profile("avx512_amx", "x86_64", _V4 | {"avx512_bf16", "amx_tile", "amx_bf16"}, "avx512", "AVX512_CORE_AMX",
            "x86-64-v4", True, kernel_extras=_VNNI + _AMX_INT8),
    Profile("avx512_bf16", "x86_64", _V4 | {"avx512_bf16"}, "avx512", "AVX512_CORE_BF16", "x86-64-v4", True, "AVX512",
            _VNNI),
    Profile("avx512", "x86_64", _V4, "avx512", "AVX512_CORE", "x86-64-v4", True, "AVX512", _VNNI),
    # avx2 with our kernels' int8 dot products in one instruction; ATen, oneDNN and MKL as avx2
    Profile("avx2_vnni", "x86_64", _V3 | {"avx_vnni"}, "avx2", "AVX2", "x86-64-v3", False, "AVX2", _AVX_VNNI),
    Profile("avx2", "x86_64", _V3, "avx2", "AVX2", "x86-64-v3", False, "AVX2"),
    Profile("x86_64", "x86_64", frozenset(), "default", "SSE41", "x86-64", False, "SSE4_2"),
    Profile("aarch64_sve_bf16", "aarch64", frozenset({"asimd", "sve", "bf16"}), "sve256", None,
            "armv8.6-a+sve+bf16", False),  # the -march Inductor itself uses for SVE+BF16 with gcc < 13
    Profile("aarch64", "aarch64", frozenset(), "default", None, "armv8-a", False),  # NEON is part of armv8-a
)
BY_NAME = {p.name: p for p in PROFILES}
