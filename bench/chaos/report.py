"""The chaos run's results: docs/results/chaos.json, the timeline plot, and docs/chaos.md."""

from __future__ import annotations

import argparse
import json
import platform
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.chaos.lb import LB_BATCH_SIZE
from bench.chaos.outcomes import LOST, REFUSED, outcome_counts
from bench.chaos.resume import summary as resume_summary
from bench.chaos.timeline import Sample, client_curves
from bench.common import REPO, RESULTS
from bench.load import Record

if TYPE_CHECKING:
    from matplotlib.axes import Axes

COMMAND = ".venv/bin/python -m bench.chaos"


def write_outputs(args: argparse.Namespace, spot: Any, kill: Any, lb: Any) -> dict[str, Any]:
    results = {"command": COMMAND, **spot_summary(args, spot), "worker_kill": kill_summary(kill),
               "lb": lb_summary(lb), "resume": resume_summary(lb.long_streams, lb.reference),
               "security": security_summary(lb.security), "setup": setup(args)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "chaos.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(spot, kill, lb, results, RESULTS / "chaos.png")
    (REPO / "docs" / "chaos.md").write_text(markdown(results))
    return results


# ---- phase 1

def spot_summary(args: argparse.Namespace, spot: Any) -> dict[str, Any]:
    counts = outcome_counts(spot.records)
    report = spot.report or {}
    steps = {s["name"]: s for s in report.get("steps", [])}
    drain_seconds = report.get("drain_seconds")
    deadline_seconds = round(spot.deadline_at - spot.notice_at, 2)
    return {
        "clients": args.clients,
        "requests_sent": len(spot.records),
        "requests_completed": counts["completed"],
        "requests_refused": {k: counts[k] for k in REFUSED},
        "requests_lost": sum(counts[k] for k in LOST),
        "lost_by_kind": {k: counts[k] for k in LOST},
        # Connected after the drain's stop step began, reset by TorchServe's frontend as it shut
        # down: clients that ignore readiness and the load balancer's deregistration.
        "lost_connected_after_stop_began": sum(
            1 for r in spot.records if r.outcome in LOST and "started_epoch" in steps.get("stop", {})
            and r.start >= steps["stop"]["started_epoch"]),
        "requests_sent_after_notice": sum(1 for r in spot.records if r.start >= spot.notice_at),
        "accepted_in_flight_at_notice": _accepted_at(spot.records, spot.notice_at),
        "completed_after_notice": sum(1 for r in spot.records if r.outcome == "completed"
                                      and r.end >= spot.notice_at),
        "drain_seconds": None if drain_seconds is None else round(float(drain_seconds), 2),
        "notice_to_stopped_seconds": round(spot.sidecar_exit_at - spot.notice_at, 2),
        "deadline_seconds": deadline_seconds,
        "drain_within_deadline": _drain_within_deadline(report, spot),
        "drain_steps": _step_offsets(steps, spot.notice_at),
        "in_flight_at_notice": report.get("in_flight_at_notice"),
        "in_flight_at_stop": report.get("in_flight_at_stop"),
        "listeners_closed": report.get("listeners_closed"),
        "drain_errors": report.get("errors"),
        "cache_published": _cache_published(report, steps, spot),
        "cache_objects": len(spot.s3_objects),
        "cache_key_digest": spot.cache_key.get("digest"),
        "torchserve_exit_code": spot.torchserve_exit_code,
        "torchserve_exited_cleanly": spot.torchserve_exit_code == 0
        and bool(steps.get("stop", {}).get("ok")) and bool(report.get("stopped")),
        "sidecar_exit_code": spot.sidecar_exit_code,
    }


def _accepted_at(records: list[Record], t: float) -> int:
    return sum(1 for r in records if r.status == 200 and r.status_at is not None
               and r.status_at <= t < r.end)


def _drain_within_deadline(report: dict[str, Any], spot: Any) -> bool:
    plan = report.get("plan") or {}
    ended = report.get("drain_seconds")
    if ended is None or not plan:
        return False
    return float(plan["started_epoch"]) + float(ended) < spot.deadline_at


def _step_offsets(steps: dict[str, dict[str, Any]], t0: float) -> dict[str, list[float]]:
    """Each drain step's [start, end] in seconds after the notice was raised."""
    return {name: [round(s["started_epoch"] - t0, 2), round((s["ended_epoch"] or 0) - t0, 2)]
            for name, s in steps.items()}


def _cache_published(report: dict[str, Any], steps: dict[str, Any], spot: Any) -> bool:
    publish = steps.get("publish")
    in_s3 = any(o["key"].endswith("/manifest.json") for o in spot.s3_objects)
    before_deadline = bool(publish and publish["ok"] and publish["ended_epoch"] < spot.deadline_at)
    return bool(report.get("published")) and in_s3 and before_deadline


# ---- phase 2

def kill_summary(kill: Any) -> dict[str, Any]:
    at_kill = [r for r in kill.records if r.start <= kill.kill_at < r.end]
    recovered = max(t for t in (kill.ready_at, kill.first_success_at) if t is not None) \
        if kill.ready_at and kill.first_success_at else None
    outage = [r for r in kill.records
              if kill.kill_at < r.start < (recovered or kill.end)]
    errors = {k: v for k, v in outcome_counts(at_kill + outage).items() if k != "completed"}
    return {
        "requests_sent": len(kill.records),
        "in_flight_at_kill": len(at_kill),
        "in_flight_at_kill_outcomes": outcome_counts(at_kill),
        "sent_during_recovery_outcomes": outcome_counts(outage),
        "client_errors": sum(errors.values()),
        "client_errors_by_kind": errors,
        "error_samples": sorted({r.error[:120] for r in at_kill + outage if r.error})[:5],
        "worker_ready_seconds": _after(kill.ready_at, kill.kill_at),
        "first_success_seconds": _after(kill.first_success_at, kill.kill_at),
        "recovery_seconds": _after(recovered, kill.kill_at),
        "outcomes": outcome_counts(kill.records),
        "torchserve_exit_code": kill.torchserve_exit_code,
    }


# ---- phase 3

def lb_summary(lb: Any) -> dict[str, Any]:
    counts = outcome_counts(lb.records)
    report = lb.report or {}
    servers = lb.servers
    return {
        "requests_sent": len(lb.records),
        "requests_completed": counts["completed"],
        # The clients send through HAProxy and never retry: whatever did not complete, they saw.
        # The long streams' clients reconnect with the resume id a cut gives them: one that then
        # finished is not a failure; one that did not finish is.
        "client_visible_failures": len(lb.records) - counts["completed"] + sum(not s.finished for s in lb.long_streams),
        "failures_by_kind": {k: n for k, n in counts.items() if k != "completed" and n},
        "error_samples": sorted({r.error[:120] for r in lb.records if r.error})[:5],
        "requests_sent_after_notice": sum(1 for r in lb.records if r.start >= lb.notice_at),
        "completed_after_notice": sum(1 for r in lb.records if r.outcome == "completed" and r.end >= lb.notice_at),
        "haproxy_retries": _total(servers, "wretr"),
        "haproxy_redispatches": _total(servers, "wredis"),
        # the non_streaming requests' (HAProxy's `pinned` frontend): cut, or refused, and sent again
        "pinned_retries": _total(lb.pinned, "wretr"),
        "pinned_redispatches": _total(lb.pinned, "wredis"),
        "sent_to_server": {name: int(s.get("stot") or 0) for name, s in servers.items()},
        "noticed_down_after_notice_seconds": _after(lb.down_at, lb.notice_at),
        "notice_to_stopped_seconds": round(lb.stopped_at - lb.notice_at, 2),
        "deadline_seconds": round(lb.deadline_at - lb.notice_at, 2),
        "drain_seconds": None if report.get("drain_seconds") is None else round(float(report["drain_seconds"]), 2),
        "noticed_torchserve_exit_code": lb.torchserve_exit_code,
        "haproxy": lb.haproxy_version,
    }


def _total(servers: dict[str, dict[str, str]], column: str) -> int:
    """A column of HAProxy's stats CSV summed over a backend's servers (an empty cell is 0)."""
    return sum(int(s.get(column) or 0) for s in servers.values())


def security_summary(checks: dict[str, Any]) -> dict[str, Any]:
    """The deployment's configuration (records sealed with the fleet's secret): an edited record
    accepted, and the resume key found in a stream's public id (bench/chaos/security.py)."""
    edited, public = checks.get("edited_record", {}), checks.get("public_id", {})
    return {"edited_record_accepted": edited.get("accepted") if edited.get("checked") else None,
            "edited_record_status": edited.get("status"),
            "resume_token_in_public_id": public.get("in_public_id"),
            "checks": checks}


def _accepted(sec: dict[str, Any]) -> str:
    if sec["edited_record_accepted"] is None:
        return "not checked (nothing was cut)"
    return ("**accepted**" if sec["edited_record_accepted"] else "refused") + f" (HTTP {sec['edited_record_status']})"


def _after(t: float | None, t0: float) -> float | None:
    return None if t is None else round(t - t0, 2)


def setup(args: argparse.Namespace) -> dict[str, Any]:
    import os

    return {"model": "SmolLM2-135M-Instruct as served by default (its GGUF file), " + args.compile + ", 1 torch thread",
            "batching": f"continuous, batchSize {args.batch_size} (phase 3: {max(args.batch_size, LB_BATCH_SIZE)})",
            "max_new_tokens": list(args.tokens), "streaming_share": 0.5,
            "python": platform.python_version(), "torch": version("torch"),
            "torchserve": version("torchserve"), "cpus": os.cpu_count(),
            "note": "CPU only; other heavy jobs shared the machine during the run"}


# ---- plot

def plot(spot: Any, kill: Any, lb: Any, results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom, third) = plt.subplots(3, 1, figsize=(11, 12))
    _panel(top, spot.records, spot.samples, spot.start, spot.end,
           f"Spot interruption, {results['clients']} clients: "
           f"lost {results['requests_lost']} of {results['requests_sent']}")
    _mark(top, spot.notice_at - spot.start, "notice", "tab:orange")
    _mark(top, spot.deadline_at - spot.start, "deadline", "tab:red")
    _mark(top, spot.sidecar_exit_at - spot.start, "TorchServe stopped", "black")
    wk = results["worker_kill"]
    _panel(bottom, kill.records, kill.samples, kill.start, kill.end,
           f"Worker SIGKILL: recovery {wk['recovery_seconds']} s, "
           f"{wk['client_errors']} client errors")
    _mark(bottom, kill.kill_at - kill.start, "kill -9 worker", "tab:red")
    if kill.ready_at:
        _mark(bottom, kill.ready_at - kill.start, "worker READY", "tab:green")
    lr = results["lb"]
    _panel(third, lb.records, lb.samples, lb.start, lb.end,
           f"Two replicas behind HAProxy, notice on one: {lr['client_visible_failures']} client-visible "
           f"failures of {lr['requests_sent']}")
    _mark(third, lb.notice_at - lb.start, "notice (r0)", "tab:orange")
    if lb.down_at:
        _mark(third, lb.down_at - lb.start, "HAProxy: r0 down", "tab:green")
    _mark(third, lb.stopped_at - lb.start, "r0 stopped", "black")
    third.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _panel(ax: Axes, records: list[Record], samples: list[Sample], start: float, end: float,
           title: str) -> None:
    curves = client_curves(records, start, end)
    ax.plot(curves["t"], curves["open"], label="client requests open", color="tab:blue")
    ax.plot(curves["t"], curves["accepted"], label="accepted (200 received), not done",
            color="tab:purple")
    served = [(s.t - start, s.server_in_flight) for s in samples if s.server_in_flight is not None]
    if served:
        ax.plot(*zip(*served), label="TorchServe in flight (sidecar metric)", color="tab:cyan",
                linestyle="--")
    for begin, finish in _not_ready_spans(samples, start):
        ax.axvspan(begin, finish, color="tab:red", alpha=0.12, lw=0)
    ax.axvspan(0, 0, color="tab:red", alpha=0.12, label="sidecar /ready not 200")
    ax.set_ylabel("requests")
    ax.set_title(title)
    ax.legend(loc="lower left", fontsize=8, framealpha=0.9)


def _not_ready_spans(samples: list[Sample], start: float) -> list[tuple[float, float]]:
    """[begin, end) intervals, in seconds from `start`, where /ready did not answer 200."""
    spans: list[tuple[float, float]] = []
    begin: float | None = None
    for sample in samples:
        t = sample.t - start
        if sample.ready != 200 and begin is None:
            begin = t
        elif sample.ready == 200 and begin is not None:
            spans.append((begin, t))
            begin = None
    if begin is not None and samples:
        spans.append((begin, samples[-1].t - start))
    return spans


def _mark(ax: Axes, x: float, label: str, color: str) -> None:
    ax.axvline(x, color=color, linestyle=":")
    ax.text(x, ax.get_ylim()[1] * 0.95, f" {label}", color=color, fontsize=8, va="top")


# ---- docs/chaos.md

NAMES = {"completed": "completed", "refused_503": "refused with 503",
         "refused_connect": "connection refused", "failed_status": "failed with a status",
         "cut_off": "cut off after 200", "unanswered": "unanswered"}


def _counts(counts: dict[str, int]) -> str:
    text = ", ".join(f"{n} {NAMES.get(k, k)}" for k, n in counts.items() if n)
    return text or "none"


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("`", "'")


NON_STREAMING = ("A non-streaming request has no resume id to give: held until its end, its cut is a whole 503, which "
                 "HAProxy sent again to the survivor, where it ran anew (its `cut` counts 0: its client cannot see a "
                 "cut; HAProxy's `pinned` frontend retried {retries} and redispatched {redispatches}).")


def markdown(r: dict[str, Any]) -> str:
    wk, steps = r["worker_kill"], r["drain_steps"]

    def at(step: str, i: int = 1) -> str:
        return f"{steps[step][i]:.1f}" if step in steps else "n/a"

    errors = "\n".join(f"- `{_one_line(e)}`" for e in wk["error_samples"]) or "- none"
    lb, rs = r["lb"], r["resume"]
    lb_errors = "\n".join(f"- `{_one_line(e)}`" for e in lb["error_samples"]) or "- none"
    setup = "; ".join(f"{k}: {v}" for k, v in r["setup"].items())
    kinds = "\n".join(f"| `{kind}` | {k['streams']} | {k['cut']} | **{k['resumed']}** | {k['finished_uncut']} | "
                      f"**{k['fresh_replica_token_mismatch']}** | **{k['failures']}** |"
                      for kind, k in [*rs["kinds"].items(), ("all", rs)])
    failures = "\n".join(f"- `{kind}`: {_one_line(e)}" for kind, k in rs["kinds"].items() for e in k["error_samples"])
    failures = f"Why the ones that did not finish did not:\n\n{failures}" if failures else "Every one finished."
    if "non_streaming" in rs["kinds"]:
        failures += "\n\n" + NON_STREAMING.format(retries=lb.get("pinned_retries"), redispatches=lb.get("pinned_redispatches"))
    return f"""# Chaos run: a spot interruption under load, a killed worker, and a load balancer

One command, about twenty minutes on a 2-core CPU machine (most of it the long requests:
resumed on the loaded survivor, then run again on a fresh replica for their reference):

    {r['command']}

It builds an eager `.mar` of the default model with a drain flag, starts a real TorchServe
(token auth on) with `handler.torchserve.launch`, runs `ts-llm-sidecar watch` as its own process against
the metadata emulator (IMDSv2, polled every 2 s), with moto's S3 server as the compile-cache
store, and drives {r['clients']} closed-loop clients (half streaming, half not; a refused request
is retried after 0.5 s, against the same replica: the worst case, since a load balancer would
stop sending once `/ready` says 503). Every request is recorded by its client. Results:
`docs/results/chaos.json`; the plot: `docs/results/chaos.png` (the shaded spans are where the
sidecar's `/ready` did not answer 200).

![timeline](results/chaos.png)

## Phase 1: spot interruption with a {r['deadline_seconds']:.0f} s deadline

| | |
| --- | --- |
| requests sent | {r['requests_sent']} ({r['requests_sent_after_notice']} after the notice) |
| completed (200 and the whole answer) | {r['requests_completed']} ({r['completed_after_notice']} finished after the notice) |
| refused before acceptance (retryable) | {r['requests_refused']['refused_503']} with 503, \
{r['requests_refused']['refused_connect']} connection refused |
| **lost** (accepted, then failed, cut off or unanswered) | **{r['requests_lost']}** \
({r['lost_connected_after_stop_began']} of them connected after the stop step began and were reset by the stopping \
frontend) |
| accepted and generating at the notice (client view) | {r['accepted_in_flight_at_notice']} |
| in flight at drain start / at stop (sidecar's view: queue + running) | {r['in_flight_at_notice']} / {r['in_flight_at_stop']} |
| drain (sidecar sees the notice to TorchServe stopped) | {r['drain_seconds']} s |
| notice raised to TorchServe stopped | {r['notice_to_stopped_seconds']} s, deadline {r['deadline_seconds']} s |
| compile cache published to S3 before the deadline | {r['cache_published']} ({r['cache_objects']} objects under key \
{r['cache_key_digest']}) |
| TorchServe exit | code {r['torchserve_exit_code']}, clean: {r['torchserve_exited_cleanly']} |

Timeline, seconds after the emulator raised the notice:

| step | done at |
| --- | --- |
| sidecar sees the notice (next IMDS poll), `/ready` turns 503 | {at('not_ready', 0)} |
| drain flag created: new requests get 503 before acceptance | {at('close_admission')} |
| TorchServe's queue and the handler's running gauge read 0 on two polls | {at('wait_in_flight')} |
| compile cache published to S3 | {at('publish')} |
| TorchServe's listeners shut from outside the JVM (ports {r['listeners_closed']}): a connect is refused from here | \
{at('close_listeners', 0)} |
| TorchServe stopped (SIGTERM to the JVM, its shutdown hook) | {at('stop')} |
| deadline | {r['deadline_seconds']} |

What happened: the watcher saw `spot/instance-action` on its next poll and the drain started.
From the flag on, every new request was answered 503 by the handler before it was accepted,
and so was every request still waiting in TorchServe's queue once a slot freed; requests
already generating ran to their end. Once TorchServe's `pendingRequests` and the handler's
`ts_llm_requests_running` (summed over workers) read 0 on two consecutive polls (the backend
gauge reaches the frontend through the worker's log, a moment late), the sidecar uploaded the
compile cache, shut TorchServe's listening sockets (from outside the JVM, which keeps serving the
connections it already accepted: they get their 503) and SIGTERMed the JVM half a second later.
Clients that kept sending got connection refused from the listener shutdown on. (Without that
step, the JVM's own shutdown closes its listener ~30 ms after SIGTERM and every open connection
~20 ms later: a request that connected in between was accepted and then reset, 2-9 a run.)

## Phase 2: the model worker killed mid-load

| | |
| --- | --- |
| requests open at the kill | {wk['in_flight_at_kill']}: {_counts(wk['in_flight_at_kill_outcomes'])} |
| requests sent until recovery | {_counts(wk['sent_during_recovery_outcomes'])} |
| client errors (kill to recovery) | {wk['client_errors']}: {_counts(wk['client_errors_by_kind'])} |
| worker READY again after | {wk['worker_ready_seconds']} s |
| first request completed after | {wk['first_success_seconds']} s |
| **recovery** (READY and a request served) | **{wk['recovery_seconds']} s** |

A crashed worker takes its batch with it. TorchServe restarts the worker and reloads the model;
the requests that were generating in it fail (a 507 "Worker died." before their first byte, a
reset connection after it), and nothing in front of TorchServe can replay them. Requests still
waiting in TorchServe's queue survive and are served by the new worker. The sidecar's `/ready`
says 503 from the crash until a worker is READY again, so a load balancer stops sending to the
replica for the outage. (The sidecar's in-flight metric reads high during the outage: the queue
grows, and the dead worker's last `ts_llm_requests_running` value stays on TorchServe's metrics
endpoint until the new worker reports.) Errors the clients saw:

{errors}

## Phase 3: two replicas behind HAProxy, a spot notice on one

Two replicas, each a TorchServe with its own sidecar and metadata emulator (token auth off, as in
the Kubernetes config: a balancer cannot know each replica's random key), behind {lb['haproxy']}
(installed by the command when missing). HAProxy checks each sidecar's `/ready` every second
(`fall 1 rise 2`), balances by least connections, and retries only what provably never ran:
`retry-on conn-failure 503` with `option redispatch 1` (a refused connection, and the 503 the
drain flag answers before admission, go to the other replica) and `option http-buffer-request`
(HAProxy can only resend a request it still holds whole); a timeout or a broken answer is
never retried. The same {r['clients']} clients send through HAProxy and **never retry**:
whatever did not complete, they saw.

| | |
| --- | --- |
| requests sent | {lb['requests_sent']} ({lb['requests_sent_after_notice']} after the notice) |
| completed | {lb['requests_completed']} ({lb['completed_after_notice']} finished after the notice) |
| **client-visible failures** | **{lb['client_visible_failures']}** ({_counts(lb['failures_by_kind'])}) |
| HAProxy retries / redispatches (provably unexecuted, sent again) | {lb['haproxy_retries']} / {lb['haproxy_redispatches']} |
| sent to each replica (HAProxy's count, retries included) | {", ".join(f"{k}: {v}" for k, v in lb['sent_to_server'].items())} |
| notice to HAProxy marking r0 down | {lb['noticed_down_after_notice_seconds']} s |
| notice to r0's TorchServe stopped | {lb['notice_to_stopped_seconds']} s (drain {lb['drain_seconds']} s), deadline \
{lb['deadline_seconds']} s |
| r0's TorchServe exit code | {lb['noticed_torchserve_exit_code']} |

Errors the clients saw:

{lb_errors}

**Resumable streams.** Beside that load, {rs['streams']} long requests of {rs['tokens_each']} tokens, each
its own prompt, went to r0 3 s before the notice, long enough to outlive it; both replicas write
the records of cut streams to one store (`resume_store`). Five kinds: `native` greedy NDJSON
streams, `n2` seeded SSE completions with n = 2, `tools` greedy SSE chat completions with a tool
(the default model's generic format holds the answer whole until its end), `grpc` greedy gRPC
`Predictions` calls (answered whole at their end), and `non_streaming` greedy completions (sent
through HAProxy's `pinned` frontend: r0 while it is up, with the same retries). A cut stream's
client reconnects through HAProxy with the id its final line or event names (`{{"resume": id}}`,
or `Last-Event-ID`; a gRPC call's client calls the survivor with `{{"resume": id}}`), as the final
event tells it to, and is counted as a client-visible failure only if it then does not finish;
a non-streaming request's client never retries (`bench/chaos/resume.py`). Each
finished answer (every choice's text and the tool calls, joined) is compared with the same request
run uncut on a freshly started replica (r2), all of them at once: the engine's answers do not
depend on what else is batched with them (docs/benchmarks.md, "Batch invariance"), which is the
default, so there is no other mode to compare.

| kind | requests | cut (a record written, a resume id sent) | **resumed to the end** | finished uncut | \
**answer different from the fresh replica's** | **did not finish** |
| --- | --- | --- | --- | --- | --- | --- |
{kinds}

{failures}

**The resume capability** (records sealed with the fleet's resume secret, as the deployment has
them; `bench/chaos/security.py`): a cut stream's record edited in the shared store (a token id
changed, its seal kept) and resumed on the survivor was {_accepted(r['security'])}; a streamed chat
completion's chunk `id` holds its events' resume key: {r['security']['resume_token_in_public_id']}.

## When the drain cannot finish in time

The drain can only wait as long as the notice allows: with a 30 s notice, requests have to
finish in well under 15 s at the replica's slowest. During development, runs of this command
while two other CPU-bound jobs shared the 2 cores (and the worker used 2 torch threads) made
every decode step 15 to 20 times slower; 16 requests were still generating when the wait
budget ran out, the sidecar stopped TorchServe on schedule (before the deadline, cache
published), and those requests plus the ones queued behind them in TorchServe were lost (19 and
32 in two such runs). TorchServe only hands a queued request to the handler when a batch slot
frees, so under that load the queue could not even be refused in time. Size the notice budget,
`max_new_tokens` and the batch for the worst step time, not the typical one.

Setup: {setup}.
"""
