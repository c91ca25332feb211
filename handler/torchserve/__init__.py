"""TorchServe, seen from outside: the one adapter every other part uses to drive it.

    launch.py   start a TorchServe process, wait until a model's worker is READY
    stop.py     stop it: `torchserve --stop`, a pid, or a whole process tree
    client.py   its management API (workers, queue, token auth with key renewal) and metrics
    errors.py   TorchServeError, TorchServeAuthError

Used by serve.sh, the sidecar, the end-to-end tests and the benchmarks. The engine and the
service core never import it (TorchServe is in limited maintenance: it stays an adapter).
"""
