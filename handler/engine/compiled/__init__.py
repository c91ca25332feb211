"""Compiled prefill and decode steps: compiled ahead of time over every serving shape, saved as a
verified artifact, loaded (by default in the background while eager steps serve) and switched to.

    steps.py             which steps a worker serves: eager, an artifact loaded (now or in the background),
                         a cold compile (here or in a process of its own), or torch.compile'd
    aot.py               the graphs: compiled over every serving shape, saved, loaded, picked by their guards
    shapes.py            the shapes the Engine calls its steps with, which the graphs must cover
    prepare.py           the model the steps are compiled for and called with
    cold/                the cold compile, in the order it runs (its __init__ tells it): in a process of
                         its own beside a worker that serves eager steps, every graph compiled (side by
                         side in child processes), saved and installed as a verified artifact
    compile_progress.py  what a cold compile logs: which graph, how many are left, about how long
    cpp_cache.py         the C++ kernels and precompiled header an artifact carries
    artifacts.py         the artifact's cache key, its verification against the manifest, its install
    artifact_lookup.py   which artifact a worker wants, where it looks, the compile process started in the background
    warm_start.py        an artifact loaded in a background thread, switched to between two steps
    errors.py            CompileError, and how a failed compile or load is reported
"""
