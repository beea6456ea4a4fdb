"""`[mcp.NAME]` tables of `oploop.toml`: the MCP tool servers a host offers.

One table per server, checked in full when the host starts (a mistake names the
key). No part of the `mcp` SDK is imported here: every actor reads the
configuration, only the executors speak MCP::

    [mcp.time]                          # stdio: a program oploop starts, in the sandbox
    command = ["mcp-server-time", "--local-timezone", "UTC"]
    env = { TZ = "UTC" }                # added to the sandbox's small environment
    cwd = "/srv/data"                   # where it runs (default: a workspace of its own)
    tags = ["time"]                     # for an agent's turn-1 category allowlist
    risky = true                        # default: true for stdio, false for url
    timeout_s = 60                      # one call's bound (default 60)
    start_timeout_s = 60                # to answer initialize, then tools/list (default 60)
    network = ["pypi.org"]              # "none" (default), "all", or allowed hosts, through
                                        #   the host's filtering proxy (as an agent's)

    [mcp.time.sandbox]                  # what the server may do besides what shell may
    # network = true                    # (before `network` above: true is "all", false "none")
    read_paths = ["/srv/ref"]           # readable (bound into its view, read-only)
    write_paths = ["/srv/data"]         # writable

    [mcp.docs]                          # streamable HTTP: a server already running
    url = "http://127.0.0.1:8000/mcp"
    headers = { Authorization = "Bearer ..." }
    include_instructions = true         # its instructions (initialize) in the system prompt
    sampling = true                     # it may ask for model calls (approved: `ask` rule)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from actors.allowlist import ALL, NONE, NetworkSetting, parse_network

#: A server's name becomes part of every tool name it offers (`mcp__NAME__tool`), which
#: the Messages API limits to `[a-zA-Z0-9_-]{1,64}`: kept short and plain on purpose.
NAME_RE = re.compile(r"^[a-zA-Z0-9-]{1,32}$")
DEFAULT_TIMEOUT_S = 60.0
#: How long a server has to answer `initialize`, then `tools/list`. A minute: a Python
#: SDK server spends a second of CPU importing before it reads its stdin, which on a
#: machine whose cores are all busy (load 15-25 on 2 cores) took past 30 s; an `npx -y`
#: server's first start downloads its package. A server that hangs costs its first
#: call this long once, then backs off.
DEFAULT_START_TIMEOUT_S = 60.0

_KEYS = frozenset({"command", "env", "cwd", "url", "headers", "tags", "risky", "timeout_s",
                   "sandbox", "network", "start_timeout_s", "include_instructions",
                   "sampling"})
_SANDBOX_KEYS = frozenset({"network", "read_paths", "write_paths"})


class McpConfigError(ValueError):
    """A bad `[mcp.NAME]` table; the message names the key (`actors.config` re-raises it
    as its `ConfigError`)."""


@dataclass(frozen=True, slots=True)
class ServerSandbox:
    """What a stdio server may do beyond `shell`'s policy: the network ("none", "all"
    or allowed hosts, as an agent's `network`), more paths."""

    network: NetworkSetting = NONE
    read_paths: tuple[str, ...] = ()
    write_paths: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class McpServerConfig:
    """One MCP server: how to reach it (`command` for stdio, or `url`) and how to offer
    its tools."""

    name: str
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = ""
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    risky: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    sandbox: ServerSandbox = field(default_factory=ServerSandbox)
    #: Its instructions (from `initialize`) join the system prompt.
    include_instructions: bool = False
    #: It may ask for model calls (`sampling/createMessage`), made through the session.
    sampling: bool = False

    @property
    def transport(self) -> str:
        """"stdio" or "http"."""
        return "http" if self.url else "stdio"


def names_a_server_tool(tool: str, servers: Mapping[str, McpServerConfig]) -> bool:
    """Whether `tool` is named like a tool of a configured server (`mcp__NAME__...`): what
    a hidden set or a permission rule may name before the server has listed its tools."""
    return any(tool.startswith(f"mcp__{name}__") and len(tool) > len(name) + 7
               for name in servers)


def parse_servers(raw: Any, source: str) -> dict[str, McpServerConfig]:
    """Every `[mcp.NAME]` table of `raw` (the `mcp` table), checked in full."""
    table = _table(raw, source, "mcp")
    servers = {}
    for name, body in table.items():
        where = f"mcp.{name}"
        if not NAME_RE.match(name):
            raise McpConfigError(f"{source}: {where}: a server name must match "
                                 f"{NAME_RE.pattern} (it prefixes its tools' names)")
        servers[name] = _server(name, _table(body, source, where), source, where)
    return servers


def _server(name: str, table: Mapping[str, Any], source: str, where: str) -> McpServerConfig:
    extra = sorted(set(table) - _KEYS)
    if extra:
        raise McpConfigError(f"{source}: {where}.{extra[0]}: unknown key "
                             f"(known: {', '.join(sorted(_KEYS))})")
    has_cmd, has_url = "command" in table, "url" in table
    if has_cmd == has_url:
        raise McpConfigError(f"{source}: {where}: set exactly one of command (stdio) "
                             f"or url (streamable HTTP)")
    stdio_only = ("env", "cwd", "sandbox") if has_url else ("headers",)
    for key in stdio_only:
        if key in table:
            other = "url" if has_url else "command"
            raise McpConfigError(f"{source}: {where}.{key}: not for a server with {other}")
    command = _strings(table.get("command", []), source, f"{where}.command")
    if has_cmd and (not command or not all(command)):
        raise McpConfigError(f"{source}: {where}.command: expected a non-empty list of "
                             f"non-empty strings, e.g. [\"mcp-server-time\"]")
    url = _typed(table.get("url", ""), str, source, f"{where}.url")
    if has_url and not re.match(r"^https?://[^/\s]+", url):
        raise McpConfigError(f"{source}: {where}.url: expected an http:// or https:// URL, "
                             f"got {url!r}")
    cwd = _typed(table.get("cwd", ""), str, source, f"{where}.cwd")
    if cwd and not cwd.startswith("/"):
        raise McpConfigError(f"{source}: {where}.cwd: expected an absolute path, got {cwd!r}")
    timeout_s = _seconds(table, "timeout_s", DEFAULT_TIMEOUT_S, source, where)
    start_timeout_s = _seconds(table, "start_timeout_s", DEFAULT_START_TIMEOUT_S, source, where)
    return McpServerConfig(
        name=name,
        command=command,
        env=_str_map(table.get("env", {}), source, f"{where}.env"),
        cwd=cwd,
        url=url,
        headers=_str_map(table.get("headers", {}), source, f"{where}.headers"),
        tags=_strings(table.get("tags", []), source, f"{where}.tags"),
        risky=_typed(table.get("risky", has_cmd), bool, source, f"{where}.risky"),
        timeout_s=timeout_s,
        start_timeout_s=start_timeout_s,
        sandbox=_sandbox(table.get("sandbox", {}), source, f"{where}.sandbox",
                         table.get("network")),
        include_instructions=_typed(table.get("include_instructions", False), bool, source,
                                    f"{where}.include_instructions"),
        sampling=_typed(table.get("sampling", False), bool, source, f"{where}.sampling"),
    )


def _seconds(table: Mapping[str, Any], key: str, default: float, source: str,
             where: str) -> float:
    seconds: float = _typed(table.get(key, default), float, source, f"{where}.{key}")
    if not 0 < seconds <= 86_400:
        raise McpConfigError(f"{source}: {where}.{key}: expected 0 < seconds <= 86400, "
                             f"got {seconds!r}")
    return seconds


def _network(top: Any, old: Any, source: str, where: str) -> NetworkSetting:
    """`[mcp.NAME] network` ("none", "all", hosts), or the older `sandbox.network`
    (true: "all", false: "none"; the new forms too); not both."""
    if top is not None and old is not None:
        raise McpConfigError(f"{source}: {where}.network: give network or sandbox.network, "
                             f"not both")
    if top is None and isinstance(old, bool):
        return ALL if old else NONE
    key = f"{where}.network" if top is not None else f"{where}.sandbox.network"
    try:
        return parse_network(top if top is not None else (old or NONE))
    except ValueError as exc:
        raise McpConfigError(f"{source}: {key}: {exc}") from None


def _sandbox(raw: Any, source: str, where: str, network: Any = None) -> ServerSandbox:
    table = _table(raw, source, where)
    extra = sorted(set(table) - _SANDBOX_KEYS)
    if extra:
        raise McpConfigError(f"{source}: {where}.{extra[0]}: unknown key "
                             f"(known: {', '.join(sorted(_SANDBOX_KEYS))})")
    paths = {}
    for key in ("read_paths", "write_paths"):
        paths[key] = _strings(table.get(key, []), source, f"{where}.{key}")
        for i, path in enumerate(paths[key]):
            if not path.startswith("/"):
                raise McpConfigError(f"{source}: {where}.{key}[{i}]: expected an absolute "
                                     f"path, got {path!r}")
            if path.rstrip("/") == "":
                raise McpConfigError(f"{source}: {where}.{key}[{i}]: the whole file system "
                                     f"would undo the sandbox; name the paths it needs")
    server = where.removesuffix(".sandbox")
    return ServerSandbox(_network(network, table.get("network"), source, server),
                         paths["read_paths"], paths["write_paths"])


def _table(raw: Any, source: str, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise McpConfigError(f"{source}: {where}: expected a table, got {type(raw).__name__}")
    return raw


def _typed(value: Any, kind: type, source: str, where: str) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise McpConfigError(f"{source}: {where}: expected {kind.__name__}, got "
                             f"{type(value).__name__} {value!r}")
    return value


def _strings(raw: Any, source: str, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list):
        raise McpConfigError(f"{source}: {where}: expected a list, got {type(raw).__name__}")
    return tuple(_typed(v, str, source, f"{where}[{i}]") for i, v in enumerate(raw))


def _str_map(raw: Any, source: str, where: str) -> dict[str, str]:
    table = _table(raw, source, where)
    return {k: _typed(v, str, source, f"{where}.{k}") for k, v in table.items()}
