"""Where the other hosts of a shared store are reached, and how.

Each host publishes in its `hosts` row where its control socket is on its machine
(`control_address`: its home's ipc socket) and, when it listens on TCP with CURVE
(`[network] listen`), how hosts on other machines reach it (`pgleases.Reach`: its TCP
control and events addresses and its CURVE server key), with the public key it
connects to the others with (its home's local key). The store is the trust root:
whoever can write it can already own its sessions, so each host admits the keys of
the hosts heard on its store (`admitted`), to its control socket and its events only
(`bus.security.HOST_DOMAINS`).

A host on this machine whose home is visible here is reached over its ipc sockets
with its home's local key (as its own CLI would); any other over TCP, a CURVE client
with this host's local key.

Used by the supervisor (forwarding control requests, placing new sessions) and by the
broadcaster (following other hosts' live events), so in neither's package.
"""

from __future__ import annotations

import socket
from pathlib import Path

from actors.configparts.listen import loopback
from actors.pgleases import HostRow, Reach
from bus.endpoints import EndpointError, Endpoints, Secure
from bus.errors import BusError
from bus.security import ClientKeys, CredentialError

#: A host unheard for this long is not a placement target (several missed renewals),
#: nor followed, nor admitted.
HOST_FRESH_S = 3.0

#: What a host's `[network] listen` may say that other machines cannot connect to as
#: such: the machine's name is published instead.
_WILDCARDS = ("0.0.0.0", "::", "*")

#: What a host's row says when it cannot be reached from another machine.
_LISTEN_FIX = ('set `[network] listen = "tcp://ADDRESS:PORT"` (an address the other '
               "machines reach, CURVE on) in its oploop.toml and restart it")


def control_address(home: Path) -> str:
    """What a host publishes as its control address: its runtime dir's control socket."""
    return f"ipc://{home / 'run' / 'control.sock'}"


def home_of(control: str) -> Path | None:
    """The home whose control socket `control` is, or None (not one `control_address`
    makes)."""
    if not control.startswith("ipc://") or not control.endswith("/run/control.sock"):
        return None
    return Path(control[len("ipc://"):]).parent.parent


def reach_of(home: Path) -> Reach:
    """What the host of `home` publishes for hosts on other machines: its TCP control
    and events addresses and CURVE server key when it listens on TCP with CURVE off
    loopback (its network file, written by the host), and always its local public key
    (the keys are made at `oploop up` on a shared store)."""
    try:
        own = ClientKeys.load(home / "keys")
    except CredentialError:
        return Reach()
    client = own.public.decode()
    endpoints = Endpoints.for_home(home)
    network = endpoints.network
    if network is None or not network.curve or loopback(network.host):
        return Reach(client_key=client)
    host = network.host
    if host in _WILDCARDS:  # (listening everywhere: the machine's name is where)
        host = socket.getfqdn()
    named = type(network)(host, network.port, network.curve)
    return Reach(named.address("control"), named.address("events"),
                 own.server_public.decode(), client)


def _machine(row: HostRow) -> str:
    return row.name.split(":", 1)[0]


def local_home(row: HostRow) -> Path | None:
    """`row`'s home when its host is on this machine and its runtime dir is visible
    here (reached over ipc), else None."""
    home = home_of(row.control)
    if home is None or _machine(row) != socket.gethostname() or not (home / "run").is_dir():
        return None
    return home


def reach_problem(row: HostRow) -> str:
    """Why this host cannot reach `row`'s host, or "" (it can)."""
    if local_home(row) is not None:
        return ""
    r = row.reach
    if r.control_tcp and r.events_tcp and r.server_key:
        return ""
    if _machine(row) == socket.gethostname() and home_of(row.control) is None:
        return f"host {row.id} ({row.name}) has not said where it is reached (an older oploop?)"
    return (f"host {row.id} ({row.name}) is on another machine and does not listen on TCP: "
            f"{_LISTEN_FIX}")


def place_problem(row: HostRow) -> str:
    """Why this host cannot start a new session on `row`'s host, or "" (it can): the
    other hosts' api sockets are reached on this machine only (a host's key is admitted
    by the others to forward requests and follow events, never to start runs)."""
    if local_home(row) is not None:
        return ""
    return reach_problem(row) or (
        f"host {row.id} ({row.name}) is on another machine: start the session there "
        "(OPLOOP_CONNECT), or on a host of this machine")


def link(row: HostRow, name: str, own_home: Path) -> tuple[str, Secure | None]:
    """Where to connect to `row`'s socket `name` ("control", "events"; on this machine
    also "api") and what makes the connecting socket a CURVE client (None over plain
    ipc). Raises `BusError` when it cannot be used (`reach_problem` first)."""
    home = local_home(row)
    try:
        if home is not None:  # that home's own key when it listens with CURVE
            endpoints = Endpoints.for_home(home)
            return endpoints.address(name), endpoints.client_side(name)
        address = {"control": row.reach.control_tcp, "events": row.reach.events_tcp}.get(name)
        server = row.reach.server_key.encode()
        if not address or len(server) != 40:
            raise BusError(reach_problem(row) or
                           f"host {row.id} publishes no usable {name} address or key")
        own = ClientKeys.load(own_home / "keys")
    except (CredentialError, EndpointError, OSError) as exc:
        raise BusError(f"cannot reach host {row.id} ({row.name}): {exc}") from exc
    return address, ClientKeys(own.public, own.secret, server).apply


def admitted(rows: list[HostRow], own_client_key: str) -> dict[bytes, str]:
    """The keys a host admits from the other hosts of its store (`rows`, heard lately):
    public key (z85) -> host id (`bus.security.Keyring.hosts`)."""
    return {r.reach.client_key.encode(): r.id for r in rows
            if len(r.reach.client_key) == 40 and r.reach.client_key != own_client_key}
