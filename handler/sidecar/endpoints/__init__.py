"""The sidecar's HTTP port: /ready, /live, /metrics and /drain.

    server.py           SidecarHttpServer: the routes (on handler/http_server.py)
    readiness.py        Readiness: /ready, 200 only with a READY worker and no notice pending
    sidecar_metrics.py  SidecarMetrics: the sidecar's own series (the drain's, and more)
    replica_load.py     LoadCollector: ts_llm_requests_waiting and ts_llm_requests_in_flight
"""
