"""Spot-termination sidecar for TorchServe: watch, drain, publish, stop.

Public API (everything else is internal):

    SidecarConfig, load_config          config.py
    Sidecar, Hooks                      watch.py   (the `watch` loop)
    run_drain, DrainDeps, DrainReport   drain.py
    DrainPlan, DrainPolicy, plan_drain  drain_plan.py
    TerminationNotice, NoticeKind       notice.py
    TorchServeClient, running_reader    torchserve_client.py
    request_drain                       drain_client.py (`ts-llm-sidecar drain`)
    MetadataEmulator                    emulator.py (tests and the chaos run)

HTTP (port listen_port): /ready, /live, /metrics (incl. ts_llm_requests_waiting and
ts_llm_requests_in_flight, load_metrics.py), /drain (drain_control.py; POST from loopback only).
"""

from handler.sidecar.config import SidecarConfig, load_config
from handler.sidecar.drain import DrainDeps, DrainReport, run_drain
from handler.sidecar.drain_client import request_drain
from handler.sidecar.drain_plan import DrainPlan, DrainPolicy, plan_drain
from handler.sidecar.notice import NoticeKind, TerminationNotice
from handler.torchserve.client import TorchServeClient, running_reader
from handler.sidecar.watch import Hooks, Sidecar

__all__ = [
    "DrainDeps", "DrainPlan", "DrainPolicy", "DrainReport", "Hooks", "NoticeKind", "Sidecar",
    "SidecarConfig", "TerminationNotice", "TorchServeClient", "running_reader", "load_config",
    "plan_drain", "request_drain", "run_drain",
]
