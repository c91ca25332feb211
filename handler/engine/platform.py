"""The one place that knows the CPU: its features, the profile they make, and what each fast path
may use there.

A spot fleet hands a replica whatever the market has (Zen 3 with AVX2 only, Zen 4 with
AVX-512-BF16, Sapphire Rapids with AMX, Graviton). Libraries decide some of this themselves and
not always safely: oneDNN's bf16 reorder reads CPUID and raises on AVX2, Inductor builds kernels
with `-march=native`. So the project decides here, once per process, and every path asks:

- a **profile** (cpu_profiles.py) is a named level of the instruction set.
- the best profile this CPU has is taken, unless `TS_LLM_CPU_PROFILE` names a lower one (a
  developer on an AVX-512 machine runs the AVX2 path: `TS_LLM_CPU_PROFILE=avx2`). The variables
  ATen and oneDNN read are set for child processes by `Profile.environment()`; in this process they must
  have been set before torch started, which `check_torch` verifies.
- `resolve` turns `dtype: auto` and `packed_weights: auto` into what measured fastest on the
  profile (docs/benchmarks.md, "Per CPU profile"), and refuses an explicit choice the CPU cannot run.
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import functools
import os
import platform as _platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from handler.engine import EngineError
from handler.engine.cpu_profiles import BY_NAME, PROFILE_ENV, PROFILES, TILE_FLAGS, Profile
from handler.engine.kernels import threads

if TYPE_CHECKING:
    from handler.engine.config import EngineConfig

Dtype = Literal["bfloat16", "float32"]
Packing = Literal["bfloat16", "float32", "off"]



class PlatformError(EngineError, RuntimeError):
    """The requested profile or path cannot run on this CPU; the message says what to change."""


@dataclass(frozen=True)
class Platform:
    machine: str
    features: frozenset[str]
    profile: Profile
    forced: bool  # chosen by TS_LLM_CPU_PROFILE rather than detected

    @property
    def usable(self) -> list[Profile]:
        """Every profile this CPU can run, best first (its own, and any lower one to force)."""
        return usable_profiles(self.machine, self.features)

    @property
    def kernel_targets(self) -> tuple[str, ...]:
        """GCC target features our kernels are built with beyond the profile's -march."""
        return tuple(target for flag, target in self.profile.kernel_extras if flag in self.features)

    def describe(self) -> str:
        how = f"forced by {PROFILE_ENV}" if self.forced else "detected"
        return f"CPU profile {self.profile.name} ({how}; {self.machine}, march {self.profile.march})"


def cpu_features(cpuinfo: str) -> frozenset[str]:
    """Feature flags from /proc/cpuinfo text: x86's `flags`, aarch64's `Features`."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def detect(environ: Mapping[str, str] | None = None, cpuinfo: str | None = None,
           machine: str | None = None) -> Platform:
    """This CPU's platform; every argument defaults to the live machine (tests pass their own)."""
    environ = os.environ if environ is None else environ
    machine = _normalized_machine(machine or _platform.machine())
    features = cpu_features(_read_cpuinfo() if cpuinfo is None else cpuinfo)
    if cpuinfo is None and features & TILE_FLAGS and not _tiles_granted():
        features -= TILE_FLAGS  # the CPU has tiles but this process may not use them
    usable = usable_profiles(machine, features)
    if not usable:
        raise PlatformError(f"no CPU profile for {machine!r}: this package runs on x86_64 and aarch64")
    wanted = environ.get(PROFILE_ENV, "").strip()
    if not wanted:
        return Platform(machine, features, usable[0], forced=False)
    if wanted not in BY_NAME:
        raise PlatformError(f"{PROFILE_ENV}={wanted!r} is not a profile; use one of {', '.join(BY_NAME)}")
    profile = BY_NAME[wanted]
    if profile not in usable:
        lacks = f"is {machine}, not {profile.arch}" if profile.arch != machine else \
            f"lacks {', '.join(sorted(profile.requires - features))}"
        raise PlatformError(f"{PROFILE_ENV}={wanted}: this CPU cannot run it (it {lacks}); "
                            f"it can run {', '.join(p.name for p in usable)}")
    return Platform(machine, features, profile, forced=True)


def usable_profiles(machine: str, features: frozenset[str]) -> list[Profile]:
    return [p for p in PROFILES if p.arch == machine and p.requires <= features]


def _normalized_machine(machine: str) -> str:
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine.lower())


@functools.cache
def _tiles_granted() -> bool:
    """Ask Linux for AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA; since 5.16): a
    process that uses tiles without it is killed. Granted once, for every thread of the process."""
    if _normalized_machine(_platform.machine()) != "x86_64" or not sys.platform.startswith("linux"):
        return False
    sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    args = (ctypes.c_long(sys_arch_prctl), ctypes.c_long(arch_req_xcomp_perm), ctypes.c_long(xfeature_xtiledata))
    return ctypes.CDLL(None, use_errno=True).syscall(*args) == 0  # syscall(2) is variadic: longs, not ints


def _read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no flags, so the baseline profile of the architecture
        return ""


def child_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: this process's) plus, when TS_LLM_CPU_PROFILE forces a profile, what
    makes a child process honour it, and the threads' bounded wait (kernels/threads.py): pass it
    to anything that starts TorchServe workers."""
    env = dict(os.environ if environ is None else environ)
    if env.get(PROFILE_ENV, "").strip():
        env.update(detect(env).profile.environment())
    return {**env, **threads.environment(env)}


def reexec_under(profile_name: str | None) -> None:
    """Restart this command (same interpreter and arguments) with `profile_name` forced, since
    ATen and oneDNN read their variables only when torch starts; returns at once when there is
    nothing to force or it is already in force. For command lines: archive.sh, the benchmarks."""
    if not profile_name or os.environ.get(PROFILE_ENV) == profile_name:
        return
    env = child_environment({**os.environ, PROFILE_ENV: profile_name})  # raises if the CPU cannot run it
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


@functools.cache
def current() -> Platform:
    """The platform of this process, checked against the torch already loaded and applied to
    Inductor (its -march), once: ATen fixed its kernels at start, so the answer cannot change
    (resolve and every cache key ask again). Call it before compiling or packing anything."""
    plat = detect()
    check_torch(plat)
    import torch._inductor.config as inductor_config

    inductor_config.cpp.march = plat.profile.march
    # Inductor would test each vector ISA the CPU lists with a test compile and a dlopen in a
    # subprocess before its first build (seconds with an empty cache, in every worker, for the
    # quantized kernels and the cache key: docs/benchmarks.md, "Engine choices"). The profile has chosen from the same CPU
    # flags, and ATEN_CPU_CAPABILITY makes Inductor take that profile's ISA; a compiler that
    # cannot build it then fails the build loudly rather than falling back to a narrower ISA.
    inductor_config.cpp.vec_isa_ok = True
    # Inductor picks its vector ISA from this variable at compile time (ATen read it at start).
    os.environ["ATEN_CPU_CAPABILITY"] = plat.profile.aten_capability
    return plat


def check_torch(plat: Platform) -> None:
    """ATen chose its kernels when torch started; a forced profile it did not honour would mix
    paths, so that is an error that says how to start the process."""
    if plat.machine != "x86_64":
        return
    import torch

    running = torch.backends.cpu.get_cpu_capability().lower()
    expected = plat.profile.aten_capability
    if running != expected and not (expected == "default" and running in ("default", "no avx")):
        raise PlatformError(f"{plat.describe()} needs ATen's {expected} kernels but torch started with {running}: "
                            f"set {PROFILE_ENV}={plat.profile.name} (and what Profile.environment() "
                            "returns) in the environment before the process starts; the launcher and serve.sh do")


# ---- the path per profile ---------------------------------------------------------------------

@dataclass(frozen=True)
class EnginePath:
    """What `dtype: auto` and `packed_weights: auto` became (or what was asked, once checked)."""
    dtype: Dtype  # weights and activations
    packed: Packing  # oneDNN-packed copies for calls with several rows: "bfloat16" | "float32" | "off"

    def label(self, profile: Profile) -> str:
        return f"{profile.name}/{self.dtype}/packed-{self.packed}"


def choose_path(plat: Platform, device_type: str, dtype: Dtype | Literal["auto"], packed: Packing | Literal["auto"],
                cuda_bf16: bool = True) -> EnginePath:
    """The measured-fastest path for `auto`, or the requested one if this CPU can run it.

    Measured (docs/benchmarks.md): bf16 storage is fastest for batch-1 decode everywhere
    (half the bytes; Inductor's matrix-vector kernels). For several rows oneDNN's packed GEMM
    wins; in bf16 where oneDNN has bf16 kernels (AVX-512 BW/VL/DQ and up), in float32 on AVX2,
    whose bf16 GEMM (~19 GFLOP/s) is 2-6x slower than a packed float32 copy."""
    if dtype == "auto":
        dtype = "bfloat16" if device_type == "cpu" or cuda_bf16 else "float32"
    if device_type != "cpu":
        if packed not in ("auto", "off"):
            raise PlatformError(f"packed_weights: {packed} is for CPU; on {device_type} use auto or off")
        return EnginePath(dtype, "off")
    if packed == "auto":
        packed = _auto_packing(plat.profile, dtype)
    elif packed == "bfloat16" and not (plat.profile.onednn_bf16 and dtype == "bfloat16"):
        why = f"oneDNN has no bf16 GEMM kernels on profile {plat.profile.name}" if dtype == "bfloat16" \
            else "packing float32 weights in bf16 would change results"
        raise PlatformError(f"packed_weights: bfloat16 cannot be used here: {why}; use auto, float32 or off")
    elif packed == "float32" and plat.machine != "x86_64":
        raise PlatformError(f"packed_weights: float32 is measured on x86_64 only, not {plat.machine}; use auto or off")
    return EnginePath(dtype, packed)


def resolve(cfg: EngineConfig) -> tuple[EngineConfig, str]:
    """cfg with `auto` replaced by this machine's choice (idempotent; `quantization: auto` is gguf
    when the checkpoint has a GGUF file and this is an x86-64 CPU, else none; config.auto_dtype), and the path label
    "<profile>/<dtype>/packed-<packing>[/<quantization>]" the worker logs and exports. Raises PlatformError when
    an explicit choice cannot run here."""
    import torch

    from handler.engine.config import auto_dtype, find_gguf

    device_type = torch.device(cfg.device).type
    cuda_bf16 = device_type == "cuda" and torch.cuda.is_bf16_supported()
    plat = current() if device_type == "cpu" else detect()
    quantization = cfg.quantization
    if quantization == "auto":
        quantization = auto_quantization(device_type, find_gguf(cfg.checkpoint_dir) is not None)
    chosen = choose_path(plat, device_type, auto_dtype(cfg.dtype, quantization, device_type), cfg.packed_weights, cuda_bf16)
    resolved = dataclasses.replace(cfg, dtype=chosen.dtype, packed_weights=chosen.packed, quantization=quantization)
    label = chosen.label(plat.profile) if device_type == "cpu" else f"{device_type}/{chosen.dtype}"
    if quantization != "none":
        label += f"/{quantization}"
    return resolved, label


def auto_quantization(device_type: str, has_gguf: bool) -> Literal["gguf", "none"]:
    """`quantization: auto`: the source's precision (gguf when the checkpoint carries one) where
    the quantized kernels are vectorized (x86-64 CPUs), else none."""
    fast = device_type == "cpu" and current().profile.arch == "x86_64"
    return "gguf" if fast and has_gguf else "none"


def _auto_packing(profile: Profile, dtype: Dtype) -> Packing:
    if profile.arch != "x86_64":
        return "off"  # oneDNN packing on aarch64 is not measured: plain weights
    if profile.onednn_bf16 and dtype == "bfloat16":
        return "bfloat16"
    return "float32"


def main(argv: list[str] | None = None) -> int:
    """`python -m handler.engine.platform`: which profile and path this machine runs."""
    p = argparse.ArgumentParser(prog="python -m handler.engine.platform", description=main.__doc__)
    p.add_argument("--exports", action="store_true", help="print `export VAR=value` lines that make child processes "
                   f"use the profile (honours {PROFILE_ENV})")
    p.add_argument("--name", action="store_true", help="print only the profile's name")
    args = p.parse_args(argv)
    try:
        plat = detect()
    except PlatformError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.name:
        print(plat.profile.name)
        return 0
    if args.exports:
        print("\n".join(f"export {k}={v}" for k, v in plat.profile.environment().items()))
        return 0
    chosen = choose_path(plat, "cpu", "auto", "auto")
    usable = ", ".join(q.name for q in plat.usable)
    extras = ", ".join(plat.kernel_targets) or "none"
    print(f"{plat.describe()}\nauto path: {chosen.label(plat.profile)}\nprofiles this CPU can run: {usable}\n"
          f"quantized kernels add: {extras}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
