"""Compiled prefill and decode steps: compiled ahead of time over every serving shape, saved as a
verified artifact, loaded (by default in the background while eager steps serve) and switched to.

    steps.py             which steps a worker serves: eager, an artifact loaded (now or in the background),
                         a cold compile (here or in a process of its own), or torch.compile'd
    aot.py               the graphs: compiled over every serving shape, saved, loaded, picked by their guards
    shapes.py            the shapes the Engine calls its steps with, which the graphs must cover
    prepare.py           the model the steps are compiled for and called with
    cold_compile.py      the cold compile: every graph compiled, saved and installed as a verified artifact
    parallel_compile.py  the cold compile's graphs side by side, in processes of their own
    compile_process.py   the cold compile in a process of its own, while the worker serves eager steps
    child_process.py     what a compile's child process does: stop with its parent, exit at once
    compile_progress.py  what a cold compile logs: which graph, how many are left, about how long
    compile_times.py     what a side-by-side compile took before, for its time estimate
    cpp_cache.py         the C++ kernels and precompiled header an artifact carries
    artifacts.py         the artifact's cache key, its verification against the manifest, its install
    artifact_lookup.py   which artifact a worker wants, where it looks, the compile process started in the background
    warm_start.py        an artifact loaded in a background thread, switched to between two steps
    errors.py            CompileError, and how a failed compile or load is reported
"""
