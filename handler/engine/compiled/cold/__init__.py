"""The cold compile: no artifact fits this worker's cache key, so every serving shape's graphs are
compiled, saved with the C++ they built and installed as a verified artifact. In the order it runs:

    in_background.py  where a worker runs it by default: a process of its own, started by the artifact
                      lookup, while the worker serves eager steps; the worker waits for the artifact
                      and loads it in the background (a blocking cold start and archive.sh --aot call
                      compile_all.py straight away)
    compile_all.py    the compile itself: every graph compiled, saved, installed for the key, loaded back
    side_by_side.py   its graphs side by side: prefill's and decode's general graph each in a child
                      process, decode's batch-1 graph in this one, joined in one artifact
    compile_times.py  what the graphs side by side took before, for the time estimate of their progress
    child.py          what every process a compile starts does: stop when its parent is gone, exit at once
"""
