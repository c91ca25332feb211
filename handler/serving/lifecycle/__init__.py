"""A request's life in a service, one stage a module, in the order it lives them:

    admit.py    Admission: what came in becomes a request waiting to start (Live), or is answered
                at once (a refusal, a models route, a resume that cannot be served)
    start.py    Starts: waiting requests go into the engine in arrival order while they fit (slots,
                KV pages); the engine prefills their prompts at its next step
    step.py     Steps: one engine step, its outputs recorded into each request (text, tool calls,
                finish, metrics) as pieces not yet sent
    reply.py    Replies: a request's pieces, its last reply (whole, or a stream's end) and how it
                ends when cut; a finished request leaves the table here
    end.py      Ending: requests ended before they finish: gone clients, a server fault, the
                drain's cut
    resume.py   Resumption: resumable streams, hooked in at admission (a resume, a stream's key)
                and at the cut (its record)
    stages.py   Stages: one replica's table of requests (request id -> Live) and its stages

The batching modes (handler.serving.continuous_service, dynamic_service, loop_service) drive the
stages each its own way; nothing here imports TorchServe."""
