"""The platform probe and the path it picks, for CPUs a spot fleet mixes (no such CPU needed)."""
from __future__ import annotations

import pytest

from handler.engine import cpu_profiles, platform
from handler.engine.platform import PROFILE_ENV, PlatformError, choose_path, cpu_features, detect

ZEN3 = "flags\t\t: fpu sse4_1 sse4_2 avx avx2 fma f16c bmi1 abm movbe xsave bmi2\n"
ICE_LAKE = ZEN3.replace("bmi2", "bmi2 avx512f avx512bw avx512vl avx512dq avx512cd avx512_vnni")
ZEN4 = ICE_LAKE.replace("avx512_vnni", "avx512_vnni avx512_bf16")
ALDER_LAKE = ZEN3.replace("bmi2", "bmi2 avx_vnni")  # AVX-VNNI without AVX-512 (Sierra Forest too)
SAPPHIRE_RAPIDS = ZEN4.replace("avx512_bf16", "avx512_bf16 amx_tile amx_bf16 amx_int8 avx_ne_convert")
OLD_X86 = "flags\t\t: fpu sse4_1 sse4_2 avx\n"
AVX2_WITHOUT_BMI = "flags\t\t: fpu sse4_1 sse4_2 avx avx2 fma f16c\n"  # a hypervisor hiding BMI: not x86-64-v3
GRAVITON2 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32 asimddp\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm svebf16\n"


def _profile(cpuinfo: str, machine: str = "x86_64", forced: str | None = None) -> str:
    environ = {PROFILE_ENV: forced} if forced else {}
    return detect(environ, cpuinfo, machine).profile.name


@pytest.mark.parametrize("cpuinfo,machine,name", [
    (ZEN3, "x86_64", "avx2"), (ALDER_LAKE, "x86_64", "avx2_vnni"), (ICE_LAKE, "x86_64", "avx512"), (ZEN4, "x86_64", "avx512_bf16"),
    (SAPPHIRE_RAPIDS, "x86_64", "avx512_amx"), (OLD_X86, "x86_64", "x86_64"), (AVX2_WITHOUT_BMI, "x86_64", "x86_64"),
    (ZEN4, "AMD64", "avx512_bf16"),
    (GRAVITON2, "aarch64", "aarch64"), (GRAVITON3, "aarch64", "aarch64_sve_bf16"), ("", "aarch64", "aarch64"),
])
def test_each_cpu_gets_the_best_profile_it_has(cpuinfo, machine, name):
    assert _profile(cpuinfo, machine) == name


def test_features_are_read_from_x86_flags_and_arm_features():
    assert {"avx2", "fma"} <= cpu_features(ZEN3)
    assert {"sve", "bf16"} <= cpu_features(GRAVITON3)
    assert cpu_features("model name: nothing here") == frozenset()


def test_a_lower_profile_can_be_forced():
    assert _profile(ZEN4, forced="avx2") == "avx2"
    assert detect({PROFILE_ENV: "avx2"}, ZEN4, "x86_64").forced


def test_a_profile_the_cpu_lacks_cannot_be_forced():
    with pytest.raises(PlatformError, match="it lacks avx512_bf16"):
        _profile(ICE_LAKE, forced="avx512_bf16")
    with pytest.raises(PlatformError, match="it is x86_64, not aarch64"):
        _profile(ZEN4, forced="aarch64")


def test_an_unknown_profile_name_lists_the_known_ones():
    with pytest.raises(PlatformError, match=r"use one of avx512_amx, .*avx2"):
        _profile(ZEN3, forced="avx3")


def test_an_unknown_architecture_is_refused():
    with pytest.raises(PlatformError, match="no CPU profile for 'riscv64'"):
        _profile("", "riscv64")


def test_forced_profile_sets_what_aten_onednn_and_inductor_read():
    env = platform.child_environment({PROFILE_ENV: "avx2", "HOME": "/h"})
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert env["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert env["TORCHINDUCTOR_CPP_MARCH"] == "x86-64-v3" and env["HOME"] == "/h"


def test_without_a_forced_profile_children_get_only_the_threads_bounded_wait():
    assert platform.child_environment({"HOME": "/h"}) == {"HOME": "/h", "GOMP_SPINCOUNT": "3000"}


def test_every_profile_names_a_march_no_wider_than_its_features():
    marches = {p.name: p.march for p in cpu_profiles.PROFILES}
    assert marches["avx2"] == "x86-64-v3" and marches["avx512"] == "x86-64-v4" and marches["x86_64"] == "x86-64"
    assert all("native" not in m for m in marches.values())


def _path(cpuinfo: str, machine: str = "x86_64", dtype: str = "auto", packed: str = "auto", device: str = "cpu"):
    chosen = choose_path(detect({}, cpuinfo, machine), device, dtype, packed)
    return chosen.dtype, chosen.packed


@pytest.mark.parametrize("cpuinfo,machine,want", [
    (ZEN3, "x86_64", ("bfloat16", "float32")),  # AVX2: no oneDNN bf16 kernels; a float32 copy for several rows
    (ICE_LAKE, "x86_64", ("bfloat16", "bfloat16")),
    (ZEN4, "x86_64", ("bfloat16", "bfloat16")),
    (SAPPHIRE_RAPIDS, "x86_64", ("bfloat16", "bfloat16")),
    (GRAVITON3, "aarch64", ("bfloat16", "off")),  # not measured on ARM: plain weights
])
def test_auto_takes_the_measured_path_of_each_profile(cpuinfo, machine, want):
    assert _path(cpuinfo, machine) == want


def test_float32_weights_get_a_float32_packing_even_where_bf16_is_fast():
    assert _path(ZEN4, dtype="float32") == ("float32", "float32")


def test_bf16_packing_is_refused_where_onednn_cannot_run_it():
    with pytest.raises(PlatformError, match="no bf16 GEMM kernels on profile avx2"):
        _path(ZEN3, packed="bfloat16")
    with pytest.raises(PlatformError, match="no bf16 GEMM kernels on profile avx2"):
        choose_path(detect({PROFILE_ENV: "avx2"}, ZEN4, "x86_64"), "cpu", "bfloat16", "bfloat16")


def test_bf16_packing_of_float32_weights_is_refused():
    with pytest.raises(PlatformError, match="would change results"):
        _path(ZEN4, dtype="float32", packed="bfloat16")


def test_explicit_choices_the_cpu_can_run_are_kept():
    assert _path(ZEN4, dtype="bfloat16", packed="float32") == ("bfloat16", "float32")
    assert _path(ZEN3, dtype="float32", packed="off") == ("float32", "off")


def test_float32_packing_is_refused_on_arm():
    with pytest.raises(PlatformError, match="measured on x86_64 only"):
        _path(GRAVITON3, "aarch64", packed="float32")


def test_cuda_has_no_packing_and_auto_dtype_follows_bf16_support():
    assert _path(ZEN3, device="cuda") == ("bfloat16", "off")
    assert choose_path(detect({}, ZEN3, "x86_64"), "cuda", "auto", "auto", cuda_bf16=False).dtype == "float32"
    with pytest.raises(PlatformError, match="is for CPU"):
        _path(ZEN3, device="cuda", packed="float32")


def test_the_path_label_names_profile_dtype_and_packing():
    chosen = choose_path(detect({}, ZEN3, "x86_64"), "cpu", "auto", "auto")
    assert chosen.label(cpu_profiles.BY_NAME["avx2"]) == "avx2/bfloat16/packed-float32"


def test_a_profile_torch_did_not_start_with_is_an_error_saying_how_to_start():
    import torch

    plat = platform.detect()
    running = torch.backends.cpu.get_cpu_capability().lower()
    other = next((p for p in plat.usable if p.aten_capability != running), None)
    if other is None:
        pytest.skip(f"{plat.describe()}: every profile this CPU runs uses ATen's {running} kernels")
    forced = platform.Platform(plat.machine, plat.features, other, forced=True)
    with pytest.raises(PlatformError, match=f"set {PROFILE_ENV}={other.name} .* before the process starts"):
        platform.check_torch(forced)


def test_this_machine_has_a_profile_and_torch_agrees_with_it():
    plat = platform.current()
    assert plat.profile.requires <= plat.features



@pytest.mark.parametrize("cpuinfo,forced,targets", [
    (ZEN4, None, ("avx512vnni",)), (ICE_LAKE, None, ("avx512vnni",)),
    (SAPPHIRE_RAPIDS, None, ("avx512vnni", "amx-tile", "amx-int8")),
    (SAPPHIRE_RAPIDS, "avx512_bf16", ("avx512vnni",)),  # tiles belong to the AMX profile alone
    (ICE_LAKE.replace(" avx512_vnni", ""), None, ()),  # Skylake-SP: AVX-512 without VNNI
    (ALDER_LAKE, None, ("avxvnni",)), (ALDER_LAKE, "avx2", ()),
    (SAPPHIRE_RAPIDS.replace("bmi2", "bmi2 avx_vnni"), "avx2_vnni", ("avxvnni",)),
    (ZEN4, "avx2", ()), (ZEN3, None, ()),  # a forced lower profile adds nothing its CPUs may lack
])
def test_the_kernels_take_vnni_and_tiles_where_the_cpu_has_them_and_the_profile_allows(cpuinfo, forced, targets):
    environ = {PROFILE_ENV: forced} if forced else {}
    assert detect(environ, cpuinfo, "x86_64").kernel_targets == targets


@pytest.mark.parametrize("granted,profile", [(True, "avx512_amx"), (False, "avx512_bf16")])
def test_amx_is_used_only_where_linux_grants_this_process_tiles(monkeypatch, granted, profile):
    # a kernel before 5.16 (or a hypervisor) can list the flags and still refuse the tile state
    monkeypatch.setattr(platform, "_read_cpuinfo", lambda: SAPPHIRE_RAPIDS)
    monkeypatch.setattr(platform, "_tiles_granted", lambda: granted)
    plat = detect({}, None, "x86_64")
    assert plat.profile.name == profile and ("amx-int8" in plat.kernel_targets) == granted
