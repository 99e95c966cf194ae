"""How a service is served: everything between a bound socket and the ASGI app.

    serve.py        options every `deepdive serve SERVICE` takes, binding, `serve()` for a
                    process of its own and `start_server_thread()` for an in-process server
    connections.py  the limits uvicorn lacks: header and body timeouts, a connection cap
    workers.py      one service as several worker processes, one port each, under a supervisor
    heap.py         a service process's garbage-collector settings and pause metrics
    accepting.py    the accept loop (every pending connection per loop pass)

The app itself (routes, auth, probes) is services/web.py; nothing here knows a service's routes.
"""
