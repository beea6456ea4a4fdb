"""The `[network]` and `[http]` tables of `oploop.toml`: where the host listens.

`[network]` adds TCP to the bus (`bus.endpoints.Network`), with the worker keys
that may serve as the host's own; `[http]` is the gateway's address and TLS files.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bus.endpoints import EndpointError, Network, PlainTcpRefused

from .checks import ConfigError, as_table, checked, no_unknown

#: Where the gateway listens unless `[http] listen` (or `OPLOOP_HTTP_LISTEN`) says.
DEFAULT_HTTP_LISTEN = "127.0.0.1:7480"


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """The gateway actor (`actors.gateway`): the web view, the JSON + SSE API, /metrics.

    `explicit`: `listen` was configured (a busy port then fails the start; the
    default port, when busy, gives way to a free one). `cert` and `key`: PEM files
    for HTTPS, required to listen off loopback.
    """

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 7480
    explicit: bool = False
    cert: str = ""
    key: str = ""

    @property
    def listen(self) -> str:
        """`HOST:PORT` as configured."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def tls(self) -> bool:
        """Whether the gateway serves HTTPS."""
        return bool(self.cert and self.key)

    @property
    def loopback(self) -> bool:
        """Whether it listens on a loopback address only."""
        return loopback(self.host)


def parse_http_listen(listen: str, tls: bool = False) -> tuple[str, int]:
    """`HOST:PORT` (port 0: any free one) as (host, port); off loopback only with `tls`
    (the token would cross the network in clear otherwise: ValueError says so)."""
    host, sep, port_s = listen.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_s.isdigit() or not 0 <= int(port_s) <= 65535:
        raise ValueError(f"expected HOST:PORT (127.0.0.1:7480), got {listen!r}")
    if not tls and not loopback(host):
        raise ValueError(f"{listen!r}: off loopback is refused without TLS (set http.cert "
                         "and http.key), or use 127.0.0.1")
    return host, int(port_s)


def loopback(host: str) -> bool:
    """Whether `host` is `localhost` or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False



def parse_network_table(raw: Any, source: str) -> Network | None:
    """`[network]`: TCP besides ipc (None: ipc only)."""
    if raw is None:
        return None
    table = as_table(raw, source, "network")
    no_unknown(table, {"listen", "curve", "local_worker_keys"}, source, "network")
    if "listen" not in table:
        raise ConfigError(f"{source}: network.listen: required (tcp://HOST:PORT)")
    listen = checked(str, table["listen"], source, "network.listen")
    curve = checked(bool, table.get("curve", True), source, "network.curve")
    try:
        return Network.parse(listen, curve)
    except EndpointError as exc:
        key = "network.curve" if isinstance(exc, PlainTcpRefused) else "network.listen"
        raise ConfigError(f"{source}: {key}: {exc}") from exc


def parse_local_worker_keys(raw: Any, source: str) -> frozenset[str]:
    """`[network] local_worker_keys`: names of worker keys (`oploop keys add NAME --role
    worker`) allowed to serve without `--machine`, as the host's own executors do."""
    names = as_table(raw, source, "network").get("local_worker_keys", []) if raw else []
    where = f"{source}: network.local_worker_keys"
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"{where}: expected a list of key names")
    return frozenset(names)


def parse_http(raw: Any, source: str) -> HttpConfig:
    """`[http]`: the gateway; `cert` and `key` together, off loopback only with them."""
    table = as_table(raw, source, "http")
    no_unknown(table, {"enabled", "listen", "cert", "key"}, source, "http")
    enabled = checked(bool, table.get("enabled", True), source, "http.enabled")
    cert = checked(str, table.get("cert", ""), source, "http.cert")
    key = checked(str, table.get("key", ""), source, "http.key")
    if bool(cert) != bool(key):
        raise ConfigError(f"{source}: http.{'key' if cert else 'cert'}: required with "
                          f"http.{'cert' if cert else 'key'} (HTTPS needs both)")
    for name, path in (("cert", cert), ("key", key)):
        if path and not Path(path).expanduser().is_file():
            raise ConfigError(f"{source}: http.{name}: no such file {path!r}")
    cert, key = (str(Path(p).expanduser()) if p else "" for p in (cert, key))
    if "listen" not in table:
        return HttpConfig(enabled=enabled, cert=cert, key=key)
    try:
        host, port = parse_http_listen(checked(str, table["listen"], source, "http.listen"),
                                       tls=bool(cert))
    except ValueError as exc:
        raise ConfigError(f"{source}: http.listen: {exc}") from None
    return HttpConfig(enabled, host, port, explicit=True, cert=cert, key=key)
