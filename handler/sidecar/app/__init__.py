"""The sidecar assembled from its config, and the two ways to run it.

    sidecar.py     Sidecar, Hooks: watchers in threads, the HTTP port, one drain on notice
    wiring.py      from the config to the watchers and each drain step's dependency
    cache_sync.py  restore and publish the compile cache through handler.cache
    cli.py         `ts-llm-sidecar watch | drain | restore | publish`
    entrypoint.py  `python -m handler.sidecar.app.entrypoint ... -- torchserve ...`: PID 1
"""
