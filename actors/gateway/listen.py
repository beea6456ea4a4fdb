"""The gateway's listening socket, bound by the host (no HTTP stack loaded).

The host binds `[http] listen` when it starts and writes the address to
`run/web.url`; the gateway process starts at the first connection and serves
that socket, inherited (`--fd`). Until then no gateway runs: connections wait in
the socket's backlog, as they do while a gateway that died is restarted. Run alone
(`python -m actors.gateway`, benchmarks), the gateway binds it itself the same way.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from actors.configparts.listen import HttpConfig
from actors.gateway.urls import WEB_URL_FILE

if TYPE_CHECKING:
    import ssl

log = logging.getLogger("oploop.gateway")

#: Connections that may wait to be accepted (while the gateway starts, or restarts).
BACKLOG = 512


class ListenError(Exception):
    """`[http] listen` cannot be served: its port is taken, its cert cannot be loaded..."""


def bind(http: HttpConfig) -> socket.socket:
    """A socket listening on `[http] listen`. The default port, when taken (another
    host), gives way to a free one; a configured one fails (`ListenError`)."""
    family = socket.AF_INET6 if ":" in http.host else socket.AF_INET
    try:
        return socket.create_server((http.host, http.port), family=family, backlog=BACKLOG)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or http.explicit:
            raise ListenError(f"cannot listen on {http.listen} ([http] listen, "
                              f"OPLOOP_HTTP_LISTEN): {exc.strerror or exc}") from exc
    log.warning("port %d is taken: the gateway listens on a free one", http.port)
    try:
        return socket.create_server((http.host, 0), family=family, backlog=BACKLOG)
    except OSError as exc:
        raise ListenError(f"cannot listen on {http.host}: {exc.strerror or exc}") from exc


def ssl_context(http: HttpConfig) -> ssl.SSLContext | None:
    """HTTPS with `[http] cert` and `key`, else None."""
    if not http.tls:
        return None
    import ssl  # (only with TLS: the host keeps OpenSSL out, `actors.host.__main__`)

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(http.cert, http.key)
    except (OSError, ssl.SSLError) as exc:
        raise ListenError(f"cannot load [http] cert/key: {exc}") from exc
    return context


def check_tls(http: HttpConfig) -> None:
    """Raise `ListenError` if `[http] cert`/`key` cannot be loaded: checked by the host
    at start (`oploop up` fails), not by the gateway at a first request. The host runs
    without `ssl` (`actors.host.__main__`): then a short child process loads them."""
    if not http.tls:
        return
    try:
        import ssl  # noqa: F401 - only whether it can be
    except ImportError:
        done = subprocess.run(
            [sys.executable, "-c", "import ssl, sys; ssl.create_default_context("
             "ssl.Purpose.CLIENT_AUTH).load_cert_chain(sys.argv[1], sys.argv[2])",
             http.cert, http.key], capture_output=True, text=True, timeout=60, check=False)
        if done.returncode:
            why = (done.stderr.strip().splitlines() or ["?"])[-1]
            raise ListenError(f"cannot load [http] cert/key: {why}") from None
        return
    ssl_context(http)


def url_of(sock: socket.socket, tls: bool) -> str:
    """The URL `sock` serves: `http://127.0.0.1:7480/`."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}/"


def write_url(run_dir: Path, url: str) -> None:
    """Publish `url` as the web view's address (`run/web.url`, 0600, atomically)."""
    path = run_dir / WEB_URL_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(url + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
