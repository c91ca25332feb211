"""Helpers shared by the benchmarks: versions, results files, the docs section writer."""
from __future__ import annotations

import json
import platform
import re
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
BENCHMARKS_MD = REPO / "docs" / "benchmarks.md"


def versions() -> dict:
    import torch

    from handler.engine.platform import detect

    plat = detect()
    out = {"python": platform.python_version(), "torch": torch.__version__, "machine": _cpu_name(),
           "threads": torch.get_num_threads(), "cpu_profile": plat.profile.name, "cpu_profile_forced": plat.forced,
           "aten_capability": torch.backends.cpu.get_cpu_capability()}
    for pkg in ("transformers", "torchserve"):
        try:
            from importlib.metadata import version

            out[pkg] = version(pkg)
        except Exception:  # not installed: the field is simply absent
            pass
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    return out


def _cpu_name() -> str:
    """The CPU's model name, with its family and model where /proc/cpuinfo has them: a cloud
    vCPU's name ("AMD EPYC") alone does not tell a Zen 4 (family 25) from a Zen 5 (family 26)."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
                      if ":" in line)
    except OSError:
        fields = {}
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    if "model name" not in fields:
        return platform.processor() or platform.machine()
    if "cpu family" not in fields:
        return fields["model name"]
    return f"{fields['model name']} (family {fields['cpu family']}, model {fields.get('model', '?')})"


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def best_seconds(fn, device: str, repeats: int) -> float:
    """The fastest of `repeats` calls of fn, in seconds (device work included)."""
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def previous_profiles(results_file: Path) -> dict:
    """The `profiles` object of a results file (the latest run of each CPU profile), if any."""
    return json.loads(results_file.read_text()).get("profiles", {}) if results_file.exists() else {}


def profile_heading(name: str, run: dict) -> str:
    """The heading of one CPU profile's latest run in a per-profile section (bench.paths, bench.kernels)."""
    forced = " (forced on a CPU that has more)" if run["forced"] else ""
    return f"### {name}{forced}: {run['versions']['machine']}, {run['date']}"


def write_json(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def write_section(key: str, markdown: str) -> None:
    """Replace this benchmark's section of docs/benchmarks.md (between its markers), or append it."""
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else (
        "# Benchmarks\n\nEvery number here was measured by the command shown with it; ratios are measured side by side"
        " in one run.\n")
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    BENCHMARKS_MD.write_text(text)
