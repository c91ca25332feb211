"""Spot-termination sidecar for TorchServe: notice, drain, publish, stop.

The spot path, in the order it runs:

    1. notice/       a watcher (notice/imds.py, gcp.py, azure.py, signals.py) or POST /drain
                     (drain/control.py) posts a TerminationNotice on the NoticeBoard
                     (notice/board.py); /ready turns 503 at once
    2. drain/plan.py the deadline split into budgets (DrainPlan)
    3. drain/run.py  run_drain: close admission (drain/admission.py), deregister and ask for
                     capacity (drain/capacity.py), wait for in-flight requests
                     (drain/in_flight.py), publish the compile cache (drain/publish.py, with
                     app/cache_sync.py's Publisher)
    4. stop          TorchServe stopped (handler/torchserve/stop.py, or app/entrypoint.py's child); the
                     DrainReport (drain/report.py) logged and returned

app/sidecar.py runs it all (app/wiring.py builds the pieces from config.py), endpoints/ serves
/ready /live /metrics /drain, and app/cli.py and app/entrypoint.py are the two commands.

Public API (everything else is internal):

    SidecarConfig, load_config          config.py
    Sidecar, Hooks                      app/sidecar.py  (the `watch` loop)
    run_drain                           drain/run.py
    DrainDeps                           drain/deps.py
    DrainReport                         drain/report.py
    DrainPlan, DrainPolicy, plan_drain  drain/plan.py
    TerminationNotice, NoticeKind       notice/termination.py
    request_drain                       drain/client.py (`ts-llm-sidecar drain`)

TorchServe itself is driven through handler.torchserve (its management API client, stopping it).
The metadata emulator for tests and the chaos run is handler.testing.metadata_emulator.

HTTP (port listen_port): /ready, /live, /metrics (incl. ts_llm_requests_waiting and
ts_llm_requests_in_flight, endpoints/replica_load.py), /drain (drain/control.py; POST from
loopback only).
"""

from handler.sidecar.app.sidecar import Hooks, Sidecar
from handler.sidecar.config import SidecarConfig, load_config
from handler.sidecar.drain.client import request_drain
from handler.sidecar.drain.deps import DrainDeps
from handler.sidecar.drain.plan import DrainPlan, DrainPolicy, plan_drain
from handler.sidecar.drain.report import DrainReport
from handler.sidecar.drain.run import run_drain
from handler.sidecar.notice.termination import NoticeKind, TerminationNotice

__all__ = [
    "DrainDeps", "DrainPlan", "DrainPolicy", "DrainReport", "Hooks", "NoticeKind", "Sidecar",
    "SidecarConfig", "TerminationNotice", "load_config",
    "plan_drain", "request_drain", "run_drain",
]
