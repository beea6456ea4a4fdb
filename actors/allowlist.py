"""Network settings (`network = "none" | "all" | [hosts...]`) and the allowlist's rules.

Pure: no sockets, no resolving. The configuration parses a setting here (an
agent's `network`, an MCP server's), the executor and the proxy name the
proxy's socket of each allowlist the same way (`socket_name`), and the proxy
asks `Allowlist.allows(host, port)` for every request. It stands beside the
configuration, not in `netproxy/`: the config, the sandbox and the MCP servers
read settings here, and none of them needs the proxy.

An entry is a host name (`pypi.org`), a wildcard over its subdomains
(`*.corp.example`: `a.corp.example`, `b.a.corp.example`, not `corp.example`
itself) or an IP literal (`127.0.0.1`, `::1`), each optionally with a port
(`127.0.0.1:8080`, `[::1]:8080`); without one, any port. Names are compared
lower-case, without a trailing dot, in their IDNA (ASCII) form; an IP literal
matches only an entry that is that address (a name never matches an address,
nor an address a name).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from actors.digests import sha256

NONE = "none"
ALL = "all"
NetworkSetting = str | tuple[str, ...]
"""`"none"`, `"all"`, or the normalised entries of an allowlist."""

_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class BadEntry(ValueError):
    """An allowlist entry or a requested host that is not a host name, wildcard or IP."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One allowlist entry: `host` normalised; `wildcard`: its subdomains; `port`: 0 = any."""

    host: str
    wildcard: bool = False
    port: int = 0

    def matches(self, host: str, port: int) -> bool:
        """Whether a request for `host` (normalised) on `port` is allowed by this entry."""
        if self.port and port != self.port:
            return False
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host

    def __str__(self) -> str:
        host = f"*.{self.host}" if self.wildcard else self.host
        if not self.port:
            return host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"


def normal_host(host: str) -> str:
    """`host` as compared: an IP literal in its canonical form, a name lower-case in
    IDNA form without a trailing dot. Raises BadEntry for anything else."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    name = text.rstrip(".").lower() if text != "." else ""
    try:
        name = name.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise BadEntry(f"not a host name: {host!r}") from exc
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise BadEntry(f"not a host name: {host!r}")
    if all(label.isdigit() for label in labels) or labels[-1].isdigit():
        # `127.1`, `2130706433`: resolvers read these as addresses; an address is
        # allowed only as the literal it is (`127.0.0.1`), never as a name.
        raise BadEntry(f"not a host name nor a canonical IP address: {host!r}")
    return name


def split_host_port(text: str) -> tuple[str, int]:
    """(`host`, port or 0) from `host`, `host:port`, `[v6]:port` or a bare IPv6 address."""
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise BadEntry(f"bad address {text!r}")
        return host, _port(rest[1:], text) if rest else 0
    if text.count(":") > 1:  # a bare IPv6 address: no port
        return text, 0
    host, sep, port = text.partition(":")
    return host, _port(port, text) if sep else 0


def _port(text: str, whole: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise BadEntry(f"bad port in {whole!r} (1-65535)")
    return int(text)


def parse_entry(text: str) -> Entry:
    """One entry of a `network` list, normalised (raises BadEntry naming what is wrong)."""
    host, port = split_host_port(text)
    wildcard = host.startswith("*.")
    if wildcard:
        host = host[2:]
    if "*" in host:
        raise BadEntry(f"{text!r}: a wildcard is only a leading '*.' (use \"all\" for "
                       "every host)")
    host = normal_host(host)
    if wildcard and _is_ip(host):
        raise BadEntry(f"{text!r}: a wildcard over an IP address")
    return Entry(host, wildcard, port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def parse_network(value: object) -> NetworkSetting:
    """A `network` setting from TOML: "none", "all", or a list of entries (each
    normalised, duplicates dropped). Raises ValueError saying what is accepted."""
    if isinstance(value, str):
        if value in (NONE, ALL):
            return value
        raise ValueError(f'expected "none", "all" or a list of hosts, got {value!r}')
    if not isinstance(value, list | tuple) or isinstance(value, bool):
        raise ValueError(f'expected "none", "all" or a list of hosts, got '
                         f"{type(value).__name__} {value!r}")
    if not value:
        raise ValueError('an empty list allows nothing: write "none"')
    out: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ValueError(f"[{i}]: expected a host (string), got {item!r}")
        try:
            entry = str(parse_entry(item))
        except BadEntry as exc:
            raise ValueError(f"[{i}]: {exc}") from None
        if entry not in out:
            out.append(entry)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Allowlist:
    """The hosts one agent (or MCP server) may reach, and how to name the setting."""

    entries: tuple[Entry, ...]
    #: Whose list it is, as the refusal names it: `agent ops`, `MCP server time`.
    owner: str
    #: The key to change, as the refusal names it: `network`, `mcp.time.network`.
    key: str

    @classmethod
    def of(cls, setting: tuple[str, ...], owner: str, key: str) -> Allowlist:
        """The allowlist of a parsed `network` list."""
        return cls(tuple(parse_entry(e) for e in setting), owner, key)

    def allows(self, host: str, port: int) -> bool:
        """Whether `host` (normalised: `normal_host`) on `port` may be reached."""
        return any(entry.matches(host, port) for entry in self.entries)

    def refusal(self, host: str, port: int) -> str:
        """The one-line reason a request is refused, naming the host and the setting."""
        listed = ", ".join(f'"{e}"' for e in self.entries)
        shown = f"[{host}]" if ":" in host else host
        return (f"oploop: host {shown} (port {port}) is not in {self.owner}'s network "
                f"allowlist ({self.key} = [{listed}] in oploop.toml)")


def socket_name(kind: str, name: str) -> str:
    """The proxy's socket (a file name in `run/net/`) for the allowlist of agent or MCP
    server `name` (`kind` "agent" or "mcp"): plain names as they are, others by a digest."""
    if not _SAFE.match(name):
        name = "x" + sha256(name.encode()).hexdigest()[:24]
    return f"{kind}-{name}.sock"


class _Networked(Protocol):
    """An agent's configuration, as far as its network goes (`actors.config.Agent`)."""

    @property
    def network(self) -> NetworkSetting: ...


class _Sandboxed(Protocol):
    """An MCP server's configuration, as far as its network goes."""

    @property
    def sandbox(self) -> _Networked: ...


class Configured(Protocol):
    """What `allowlists` reads of an `actors.config.Config` (which imports this module:
    named by its shape here, not imported)."""

    @property
    def agents(self) -> Mapping[str, _Networked]: ...

    @property
    def mcp(self) -> Mapping[str, _Sandboxed]: ...


def allowlists(config: Configured) -> dict[str, Allowlist]:
    """Every allowlist `config` sets, by the name of its socket: agents' `network`
    lists and MCP servers' (none: the host runs no proxy)."""
    out: dict[str, Allowlist] = {}
    for name, agent in config.agents.items():
        if isinstance(agent.network, tuple):
            out[socket_name("agent", name)] = Allowlist.of(
                agent.network, f"agent {name}", f"agents.{name}.network")
    for name, server in config.mcp.items():
        if isinstance(server.sandbox.network, tuple):
            out[socket_name("mcp", name)] = Allowlist.of(
                server.sandbox.network, f"MCP server {name}", f"mcp.{name}.network")
    return out
