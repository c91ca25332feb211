"""Step 1 of the spot path: a termination notice arrives and is posted on the board.

    termination.py  TerminationNotice, NoticeKind: what a notice is, and whether it drains
    board.py        NoticeBoard: the first draining notice starts the drain; later ones can
                    only pull its deadline in
    watcher.py      the Watcher protocol and run_watcher, the poll loop of each cloud watcher
    imds.py         AWS IMDSv2: spot interruption and rebalance
    gcp.py          GCP metadata: instance/preempted, long-polled
    azure.py        Azure Scheduled Events: Preempt/Terminate, acknowledged after the drain
    signals.py      SIGTERM/SIGINT as notices (a kubelet's SIGTERM drains the same way)
    retry.py        backoff with full jitter for the metadata services' transient failures

A drain request over HTTP (POST /drain) is a notice too: drain/control.py posts it.
"""
