"""Steps 2 to 4 of the spot path: plan the drain, run its steps, report.

    plan.py        DrainPlan, DrainPolicy, plan_drain: the deadline split into budgets, and
                   which steps run (budget_warning: a notice too short for the reserves)
    deps.py        DrainDeps: each step's dependency, injected (None: the step is left out)
    run.py         run_drain: the steps, in the order they run:
                     not_ready         /ready turns 503 (the board is already draining)
                     close_admission   admission.py: the drain flag file
                     deregister        capacity.py: ELBv2 deregister_targets
                     request_capacity  capacity.py: ASG desired+1, or the webhook
                     wait_in_flight    in_flight.py: until nothing is in flight, or the budget ends
                     publish           publish.py: waits for the cache publish started with the
                                       drain (beside the wait), at most until publish_by
                     stop              TorchServe stopped (process.py, or the entrypoint's child)
                     acknowledge       Azure: the event may start now (notice/azure.py)
    report.py      DrainReport, StepRecord: what the drain did, and its exit code
    metrics.py     DrainMetrics: the drain's Prometheus counters
    control.py     DrainControl: the /drain endpoint's model (ask for a drain, see its state)
    client.py      request_drain: `ts-llm-sidecar drain [--wait]`, the preStop hook
"""
