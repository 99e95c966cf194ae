"""How a service is served: everything between a bound socket and the ASGI app.

    serve.py              options every `deepdive serve SERVICE` takes, binding, `serve()`
                          for a process of its own, `start_server_thread()` in-process
    connections.py        the limits uvicorn lacks: header and body timeouts, a connection cap
                          in all and per client address, refusals counted and batched
    uvicorn_internals.py  every subclass of uvicorn's internals, pinned to one minor version
    workers.py            one service as several worker processes, one port each, under a
                          supervisor that restarts a worker that dies or freezes
    supervision.py        the supervisor's decisions (restarts, backoff, frozen), on a clock
    heap.py               a service process's garbage-collector settings and pause metrics

The app itself (routes, auth, probes) is services/web.py; nothing here knows a service's routes.
docs/services.md says why each piece exists, with the measurements.
"""
