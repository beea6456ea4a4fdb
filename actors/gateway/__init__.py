"""The gateway actor (`python -m actors.gateway`): the host seen over HTTP.

A viewer and client of the bus like any other (the supervisor's api and control
sockets, the broadcaster's events and replay): it adds no path around either.
It serves the web view (static files from `static/`), a JSON + SSE API
(`api.py`) and Prometheus metrics (`metrics.py`) on `[http] listen`
(default 127.0.0.1:7480, loopback only).
"""
