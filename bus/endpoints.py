"""Where sockets live: a private runtime directory of `ipc://` endpoints, and
optionally TCP for workers and clients on other machines.

The runtime dir is `$OPLOOP_HOME/run` (mode 0700, so only this user can reach
the sockets); each endpoint is a socket file in it (mode 0600 once bound).

A host configured to listen on TCP (`[network]` in `oploop.toml`) also binds
its five public endpoints on consecutive ports from `listen` (api, control,
work, events, replay; `ingest` never leaves the machine) and, with CURVE (the
default, and the only choice off loopback), every public socket requires an
authorised key (`bus.security`). The host writes `run/network.json`, so that
its actors and local clients find out without reading the configuration.
A program elsewhere reaches it with `OPLOOP_CONNECT=tcp://HOST:PORT` and
`OPLOOP_KEYS=<folder from oploop keys add>`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from bus.security import ClientKeys, Gate, Keyring

#: The sockets of a host, by name (see `bus.messages` for who binds what).
ENDPOINT_NAMES = ("api", "control", "work", "ingest", "events", "replay")

#: The endpoints a host may serve on TCP, in the order of their ports.
PUBLIC_ENDPOINTS = ("api", "control", "work", "events", "replay")

NETWORK_FILE = "network.json"

#: What points a client or worker at a host elsewhere (see `Endpoints.from_env`).
REMOTE_ENV = ("OPLOOP_CONNECT", "OPLOOP_KEYS")

if TYPE_CHECKING:
    import zmq

#: Applies socket options (CURVE) to a socket before it binds or connects.
Secure = Callable[["zmq.Socket[Any]"], None]

# sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_IPC_PATH = 107


class EndpointError(Exception):
    """The runtime dir or a TCP address cannot be used (path too long, wrong owner
    or mode, plain TCP off loopback, a malformed address)."""


class PlainTcpRefused(EndpointError):
    """TCP without CURVE on an address other machines may reach."""


@dataclass(frozen=True, slots=True)
class Network:
    """Where a host also listens on TCP: five consecutive ports from `port`."""

    host: str
    port: int
    curve: bool = True

    @classmethod
    def parse(cls, listen: str, curve: bool = True) -> Network:
        """Check `tcp://HOST:PORT`; plain TCP (`curve` False) only on a loopback address."""
        parts = urlsplit(listen)
        try:
            port = parts.port
        except ValueError:
            port = None
        host = parts.hostname or ""
        if parts.scheme != "tcp" or not host or port is None or parts.path or parts.query:
            raise EndpointError(f"{listen!r}: expected tcp://HOST:PORT")
        if not 1 <= port <= 65535 - len(PUBLIC_ENDPOINTS) + 1:
            raise EndpointError(f"{listen!r}: the port must leave room for "
                                f"{len(PUBLIC_ENDPOINTS)} consecutive ports")
        if not curve and not _is_loopback(host):
            raise PlainTcpRefused(f"{listen!r}: plain TCP on a non-loopback address is refused; "
                                "keep CURVE on (curve = true) or listen on 127.0.0.1")
        return cls(host, port, curve)

    def address(self, name: str) -> str:
        """The tcp address of public endpoint `name`."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port + PUBLIC_ENDPOINTS.index(name)}"

    @property
    def listen(self) -> str:
        """The first address, as configured."""
        return self.address(PUBLIC_ENDPOINTS[0])


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name or "*": it may reach other machines


@dataclass(frozen=True, slots=True)
class Place:
    """Where a process finds its host, as the environment says: `OPLOOP_HOME` (default
    `~/.oploop`), and `OPLOOP_CONNECT` with `OPLOOP_KEYS` for a host elsewhere.

    The one reader of those three variables (`place_of`): `actors.settings` takes
    them from here, and a bare `Client.connect()` follows them (bus imports nothing
    from actors)."""

    home: Path
    connect: str = ""
    keys: str = ""


def place_of(environ: Mapping[str, str] | None = None) -> Place:
    """The `Place` `environ` (default `os.environ`) says."""
    env = os.environ if environ is None else environ
    home = Path(env.get("OPLOOP_HOME") or Path.home() / ".oploop").absolute()
    return Place(home, env.get("OPLOOP_CONNECT", ""), env.get("OPLOOP_KEYS", ""))


def oploop_home() -> Path:
    """`$OPLOOP_HOME`, default `~/.oploop`."""
    return place_of().home


@dataclass(frozen=True, slots=True)
class Endpoints:
    """The endpoint addresses of one host, derived from its runtime dir (and its
    network file), or of a host elsewhere (`remote`)."""

    run_dir: Path
    network: Network | None = None
    #: Reached over `network` from another machine (connect only, never bind).
    remote: bool = False
    #: The key folder: the home's `keys` (local) or an `OPLOOP_KEYS` folder (remote).
    keys: Path | None = None

    @classmethod
    def for_home(cls, home: Path | None = None) -> Endpoints:
        """Endpoints of the host whose home is `home` (default `oploop_home()`)."""
        home = home or oploop_home()
        run_dir = home / "run"
        return cls(run_dir, read_network(run_dir), keys=home / "keys")

    @classmethod
    def elsewhere(cls, address: str, keys: Path | None) -> Endpoints:
        """Endpoints of a host on another machine, listening at `address`; `keys` is an
        `OPLOOP_KEYS` folder, None for plain TCP (loopback only)."""
        network = Network.parse(address, curve=keys is not None)
        return cls(oploop_home() / "run", network, remote=True, keys=keys)

    @classmethod
    def from_env(cls) -> Endpoints:
        """`OPLOOP_CONNECT` (+ `OPLOOP_KEYS`) when set, else the host of `$OPLOOP_HOME`."""
        return cls.of_place(place_of())

    @classmethod
    def of_place(cls, place: Place) -> Endpoints:
        """`place.connect` (+ `place.keys`) when set, else the host of `place.home`."""
        if not place.connect:
            return cls.for_home(place.home)
        keys = Path(place.keys).expanduser() if place.keys else None
        return cls.elsewhere(place.connect, keys)

    @property
    def curve(self) -> bool:
        """Whether the public endpoints require CURVE."""
        return self.network is not None and self.network.curve

    def path(self, name: str) -> Path:
        """The socket file of endpoint `name`."""
        if name not in ENDPOINT_NAMES:
            raise KeyError(name)
        return self.run_dir / f"{name}.sock"

    def address(self, name: str) -> str:
        """The zmq address to connect to endpoint `name`."""
        if self.remote:
            assert self.network is not None
            if name not in PUBLIC_ENDPOINTS:
                raise EndpointError(f"endpoint {name!r} is not served to other machines")
            return self.network.address(name)
        return f"ipc://{self.path(name)}"

    def binds(self, name: str) -> list[str]:
        """Every address endpoint `name` is bound at: its socket file, and TCP if public."""
        out = [f"ipc://{self.path(name)}"]
        if self.network is not None and name in PUBLIC_ENDPOINTS:
            out.append(self.network.address(name))
        return out

    def server_side(self, name: str) -> Secure | None:
        """What makes the socket bound at `name` a CURVE server, or None (no CURVE)."""
        if not self.curve or name not in PUBLIC_ENDPOINTS:
            return None
        assert self.keys is not None
        server = Keyring(self.keys).server()
        return lambda sock: server.apply(sock, name)

    def client_side(self, name: str) -> Secure | None:
        """What makes a socket connecting to `name` a CURVE client, or None."""
        if not self.curve or name not in PUBLIC_ENDPOINTS:
            return None
        assert self.keys is not None
        return ClientKeys.load(self.keys).apply

    def gate(self, ctx: zmq.Context[Any]) -> Gate | None:
        """A started ZAP handler for an actor that binds CURVE sockets in `ctx`, or None."""
        if not self.curve or self.remote:
            return None
        assert self.keys is not None
        gate = Gate(Keyring(self.keys), ctx)
        gate.start()
        return gate

    def socket_files(self) -> list[Path]:
        """Socket files present in the runtime dir now."""
        return [self.path(n) for n in ENDPOINT_NAMES if self.path(n).exists()]

    def prepare(self) -> None:
        """Create the runtime dir 0700 (or check an existing one) for binding.

        Refuses a dir owned by someone else or open to others, and paths too
        long for a unix socket address.
        """
        longest = max(len(str(self.path(n))) for n in ENDPOINT_NAMES)
        if longest > _MAX_IPC_PATH:
            raise EndpointError(
                f"runtime dir {self.run_dir} is too deep for unix sockets "
                f"({longest} > {_MAX_IPC_PATH} bytes); set OPLOOP_HOME to a shorter path"
            )
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = self.run_dir.stat()
        if st.st_uid != os.getuid():
            raise EndpointError(f"runtime dir {self.run_dir} is owned by uid {st.st_uid}")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(self.run_dir, 0o700)

    def remove_stale(self) -> list[Path]:
        """Delete socket files left by a host that died; returns what was removed."""
        removed = []
        for p in self.socket_files():
            p.unlink(missing_ok=True)
            removed.append(p)
        return removed


def read_network(run_dir: Path) -> Network | None:
    """The network file a running host wrote in `run_dir`, or None (ipc only)."""
    try:
        data = json.loads((run_dir / NETWORK_FILE).read_text())
        return Network(str(data["host"]), int(data["port"]), bool(data["curve"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_network(run_dir: Path, network: Network | None) -> None:
    """Record (or, for None, remove) the host's network in `run_dir` (0600)."""
    path = run_dir / NETWORK_FILE
    if network is None:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"host": network.host, "port": network.port, "curve": network.curve}, f)
    os.replace(tmp, path)
