"""Compiled graphs on disk: each step's graphs saved with their example shapes, an artifact's index
(graphs.json: the format, the graph files, the C++ kernels and headers that travel with them) and
loading it back into serving steps, every path in the index checked to stay inside the artifact."""
from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from handler.engine.compiled import cpp_cache
from handler.engine.compiled.aot import FORMAT, STEPS, AotError, AotSteps, CompiledStep
from handler.engine.compiled.shapes import Shape, StepName
from handler.engine.model.transformer import Transformer

log = logging.getLogger(__name__)

INDEX_FILE = "graphs.json"


@dataclass
class SavedGraphs:
    """Graphs of one step saved as files and loaded back from them once: each is then known to
    load before an artifact is made of its file, and serves from what was loaded."""
    graphs: list[Any]
    files: list[Path]
    examples: list[Shape]  # each graph's example shape

    def __add__(self, other: SavedGraphs) -> SavedGraphs:
        return SavedGraphs(self.graphs + other.graphs, self.files + other.files, self.examples + other.examples)


def save_and_reload(graphs: list[Any], examples: list[Shape], name: StepName, folder: Path) -> SavedGraphs:
    return reload(save_graphs(graphs, examples, name, folder), folder)


def save_graphs(graphs: list[Any], examples: list[Shape], name: StepName, out_dir: Path) -> list[dict[str, Any]]:
    """Each graph as <name>-<i>.bin in out_dir; returns their index entries (file and example shape)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, (graph, shape) in enumerate(zip(graphs, examples, strict=True)):
        path = out_dir / _graph_file(name, i)
        graph.save_compiled_function(str(path))
        entries.append(shape.entry(path.name))
    return entries


def _graph_file(name: StepName, i: int) -> str:
    return f"{name}-{i}.bin"


def reload(entries: list[dict[str, Any]], folder: Path) -> SavedGraphs:
    """The graphs save_graphs wrote in `folder` (their kernels where this process builds them)."""
    files = [folder / e["file"] for e in entries]
    return SavedGraphs([load_graph(f) for f in files], files, [Shape.of_entry(e) for e in entries])


def serving_steps(model: Transformer, saved: dict[StepName, SavedGraphs]) -> AotSteps:
    prefill, decode = (CompiledStep(model, name, saved[name].graphs) for name in STEPS)
    return AotSteps(prefill, decode, {name: saved[name].examples for name in STEPS})


def save_artifacts(saved: dict[StepName, SavedGraphs], out_dir: Path, build_dir: Path | None) -> list[Path]:
    """Write each step's graph files, what was built under `build_dir` (cpp_cache.private_build_dirs)
    and an index into out_dir (which must be empty or absent). Returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if any(out_dir.iterdir()):
        raise AotError(f"{out_dir} is not empty; artifacts go into a fresh directory")
    index: dict[str, Any] = {"format": FORMAT, "steps": {}, "cpp": {"kernels": [], "headers": []}}
    for name in STEPS:
        index["steps"][name] = []
        for i, (src, shape) in enumerate(zip(saved[name].files, saved[name].examples, strict=True)):
            shutil.copyfile(src, out_dir / _graph_file(name, i))
            index["steps"][name].append(shape.entry(_graph_file(name, i)))
    if build_dir is not None:
        index["cpp"] = cpp_cache.pack(build_dir, out_dir)
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=1, sort_keys=True))
    return sorted(p for p in out_dir.rglob("*") if p.is_file())


def load_artifacts(model: Transformer, art_dir: Path) -> AotSteps:
    """Load verified artifacts (the caller checked them against their manifest) onto `model`."""
    index = read_index(art_dir)
    installed = cpp_cache.install_kernels(art_dir, index["cpp"])
    before = cpp_cache.compiled_libraries()
    steps = serving_steps(model, {name: reload(index["steps"][name], art_dir) for name in STEPS})
    built = len(cpp_cache.compiled_libraries() - before)
    if built:
        # Inductor's kernel key includes the compiler command line (include paths of this Python
        # and torch): an artifact built under another install path misses and compiles here.
        log.warning("aot: %d C++ libraries the artifact did not carry were compiled at load (it was built "
                    "under another Python/torch install path, or in a process that had compiled before); "
                    "build it where it is served to load in seconds", built)
    log.info("aot: loaded %s from %s (%d C++ files installed)",
             ", ".join(f"{len(steps.step(n).graphs)} {n} graphs" for n in STEPS), art_dir, installed)
    return steps


def read_index(art_dir: Path) -> dict[str, Any]:
    try:
        index = json.loads((art_dir / INDEX_FILE).read_text())
    except (OSError, ValueError) as err:
        raise AotError(f"{art_dir / INDEX_FILE}: cannot read the artifact index ({err})") from err
    if index.get("format") != FORMAT:
        raise AotError(f"{art_dir / INDEX_FILE}: format {index.get('format')!r}, this build reads {FORMAT}")
    names = [e["file"] for n in STEPS for e in index["steps"][n]] + index["cpp"]["kernels"] + index["cpp"]["headers"]
    for name in names:
        if not _inside(name):
            raise AotError(f"{art_dir / INDEX_FILE}: {name!r} is not a relative path inside the artifact")
    return index


def _inside(rel: str) -> bool:
    parts = Path(rel).parts
    return bool(parts) and not Path(rel).is_absolute() and ".." not in parts


def load_graph(path: Path) -> Any:
    with open(path, "rb") as f:
        return torch.compiler.load_compiled_function(f)
