"""The chaos run: a spot interruption, a killed worker and a replica behind HAProxy, each under
load (`python -m bench.chaos`; run.py is the drill, one module per part beside it)."""
