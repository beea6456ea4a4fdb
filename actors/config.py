"""`oploop.toml`: agents, model aliases, hidden tool sets, the intent router, limits.

The file is looked for in `$OPLOOP_CONFIG` (a path), then `$OPLOOP_HOME/oploop.toml`,
then `./oploop.toml`; none at all means the built-in defaults (`actors.settings`
reads the environment and calls `load_config`). It is checked
in full when a host starts (`oploop up`, or the embedded host of `oploop run`),
so a typo fails there with a message naming the key, never mid-session::

    [models]                      # aliases: short name -> concrete model id
    sonnet = "claude-sonnet-4-5"

    [hidden.local]                # tools hidden per platform, then per mode
    readonly = ["shell", "write_file"]

    [router]                      # the intent router (OPLOOP_INTENT_ROUTER=on|off overrides)
    enabled = false
    model = "haiku"
    max_tokens = 8
    attempts = 2                  # at most one retry ...
    timeout_s = 10.0              # ... within this long; then AGENT, the ROUTE says why

    [limits]
    max_prompt_chars = 1000000
    max_running_sessions = 1000
    journal_reserve_mb = 64       # below this much free disk, new runs are refused
    compact_every_kb = 256        # a session's log is compacted every this many KB
    max_result_chars = 262144     # an MCP result's text, an ask_machine answer (actors.bounds)
    max_tools = 200               # MCP tools an executor offers; the rest are left out
    max_tool_description_chars = 2048
    max_tool_schema_chars = 16384 # a tool whose input schema (JSON) is longer is left out

    [retention]                   # finished sessions deleted (0: no limit); see Retention
    max_age = "30d"
    max_sessions = 1000
    max_bytes = "1GiB"
    every = "1m"

    [network]                     # also serve on TCP (workers, clients elsewhere)
    listen = "tcp://0.0.0.0:7400" # five consecutive ports: api, control, work, events, replay
    curve = true                  # required off loopback; keys in $OPLOOP_HOME/keys
    local_worker_keys = []        # worker keys that may serve unnamed, as the host's own

    [mcp.time]                    # an MCP tool server (actors/mcp/config.py, docs/mcp.md)
    command = ["mcp-server-time"]

    [store]                       # the session log (actors/configparts/store.py)
    url = ""                      # "postgresql://..." : shared by hosts (docs/sessions.md)
    lease_s = 5                   # a dead host's sessions are taken over after this

    [http]                        # the gateway: web view, JSON + SSE API, /metrics
    enabled = true
    listen = "127.0.0.1:7480"     # off loopback only with cert and key (HTTPS)
    cert = ""                     # PEM certificate and key files

    [peers.b]                     # another host this one may ask (ask_machine)
    connect = "tcp://10.0.0.2:7400"
    keys = "keys/b"               # issued by b: oploop keys add A --role peer
    agent = ""                    # b's agent (default: b's default agent): the one
                                  # b bound the key to (keys add A --role peer --agent)
    timeout_s = 600

    [prices."claude-sonnet-4-5"]  # USD per million tokens (defaults: actors.usage)
    input = 3.0                   # a model with no shipped price needs all four
    output = 15.0
    cache_write = 3.75
    cache_read = 0.30

    [agents.ops]                  # any field of `Agent`
    model = "sonnet"
    sandbox = "workspace-write"   # or "read-only", "scratch" (actors/sandbox/modes.py)
    write_paths = ["~/notes"]     # writable besides the working directory
    deny_read = ["~/private"]     # hidden from tools (credential folders always are)
    max_turns = 30
    category_allowlist = ["files"]
    approval_timeout_s = 600      # a call under "ask" is denied after this long
    network = ["pypi.org", "*.corp.example", "127.0.0.1:8080"]  # or "none" (default), "all"

    [agents.ops.permissions]      # first match wins; a key is TOOL or TOOL(GLOB)
    "shell(ls *)" = "allow"       # (see actors.permissions)
    "write_file(/tmp/*)" = "allow"
    shell = "ask"
    write_file = "deny"
    default = "allow"

Each part is read in `actors.configparts` (the checks, agents, limits, listen
addresses); this module assembles the whole `Config` and re-exports their names.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.ask.peers import Peer, PeerConfigError, parse_peers
from actors.configparts.agents import (
    CACHE_BOUNDARY,
    DEFAULT_AGENT,
    DEFAULT_SYSTEM,
    MODEL_ALIASES,
    Agent,
    parse_agent,
)
from actors.configparts.checks import (
    BadDuration,
    BadSize,
    ConfigError,
    as_table,
    checked,
    no_unknown,
    parse_duration,
    parse_size,
    record,
    str_map,
)
from actors.configparts.limits import (
    Limits,
    Retention,
    RouterConfig,
    parse_limits,
    parse_retention,
)
from actors.configparts.listen import (
    DEFAULT_HTTP_LISTEN,
    HttpConfig,
    parse_http,
    parse_http_listen,
    parse_local_worker_keys,
    parse_network_table,
)
from actors.configparts.store import StoreConfig, parse_store
from actors.mcp.config import McpConfigError, McpServerConfig, parse_servers
from actors.mcp.installed import NotRunnable, runnable
from actors.usage import DEFAULT_PRICES, Price
from bus.endpoints import Network

__all__ = [
    "CACHE_BOUNDARY",
    "CONFIG_NAME",
    "DEFAULT_AGENT",
    "DEFAULT_HTTP_LISTEN",
    "DEFAULT_SYSTEM",
    "MODEL_ALIASES",
    "Agent",
    "BadDuration",
    "BadSize",
    "Config",
    "ConfigError",
    "StoreConfig",
    "HttpConfig",
    "Limits",
    "Retention",
    "RouterConfig",
    "config_path",
    "load_config",
    "parse_config",
    "parse_duration",
    "parse_http_listen",
    "parse_size",
]

# -- the file ------------------------------------------------------------------------

CONFIG_NAME = "oploop.toml"

_TOP_KEYS = frozenset({"models", "hidden", "router", "limits", "retention", "network", "http",
                       "agents", "prices", "peers", "mcp", "store"})


@dataclass(frozen=True, slots=True)
class Config:
    """Everything `oploop.toml` can set, defaults filled in."""

    agents: Mapping[str, Agent] = field(default_factory=lambda: {"default": DEFAULT_AGENT})
    aliases: Mapping[str, str] = field(default_factory=lambda: dict(MODEL_ALIASES))
    hidden: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    router: RouterConfig = RouterConfig()
    limits: Limits = Limits()
    retention: Retention = Retention()
    #: TCP besides ipc (None: ipc only, the default).
    network: Network | None = None
    #: Worker keys that may serve unnamed, as the host's own machine (`[network]
    #: local_worker_keys`); every other worker key serves only the machine it names.
    local_worker_keys: frozenset[str] = frozenset()
    http: HttpConfig = HttpConfig()
    #: USD per million tokens, by model id (`actors.usage.price_for` looks models up).
    prices: Mapping[str, Price] = field(default_factory=lambda: dict(DEFAULT_PRICES))
    #: Other hosts this one may ask (`[peers.NAME]`, `actors/ask/`): none by default.
    peers: Mapping[str, Peer] = field(default_factory=dict)
    #: MCP tool servers by name (`[mcp.NAME]`, `actors/mcp/config.py`).
    mcp: Mapping[str, McpServerConfig] = field(default_factory=dict)
    #: Where the session log is (`[store]`; `OPLOOP_STORE` overrides its url).
    store: StoreConfig = StoreConfig()
    source: str = "<defaults>"

    def agent(self, name: str) -> Agent | None:
        """The agent called `name` (`""` is the default agent), or None."""
        return self.agents.get(name or "default")


def config_path(home: Path, explicit: Path | None = None, cwd: Path | None = None) -> Path | None:
    """Which file configures the host in `home` (`explicit`: `$OPLOOP_CONFIG`), or None
    for the defaults."""
    if explicit is not None:
        return explicit
    for candidate in (home / CONFIG_NAME, (cwd or Path.cwd()) / CONFIG_NAME):
        if candidate.is_file():
            return candidate
    return None


def load_config(path: Path | None) -> Config:
    """Read and check the configuration file at `path` (None: the defaults)."""
    if path is None:
        return Config()
    source = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
    return parse_config(data, source)


def parse_config(data: Mapping[str, Any], source: str = "<config>") -> Config:
    """Check parsed TOML and build a `Config`; `ConfigError` names the bad key."""
    no_unknown(data, _TOP_KEYS, source, "")
    aliases = dict(MODEL_ALIASES)
    aliases.update(str_map(data.get("models", {}), source, "models"))
    agents = {"default": DEFAULT_AGENT}
    raw_agents = as_table(data.get("agents", {}), source, "agents")
    for name, raw in raw_agents.items():
        agents[name] = parse_agent(name, as_table(raw, source, f"agents.{name}"), source)
    return Config(
        agents=agents,
        aliases=aliases,
        hidden=_hidden(data.get("hidden", {}), source),
        router=record(RouterConfig, data.get("router", {}), source, "router"),
        limits=parse_limits(data.get("limits", {}), source),
        retention=parse_retention(data.get("retention", {}), source),
        network=parse_network_table(data.get("network"), source),
        local_worker_keys=parse_local_worker_keys(data.get("network"), source),
        http=parse_http(data.get("http", {}), source),
        prices=_prices(data.get("prices", {}), source),
        peers=_peers(data.get("peers", {}), source),
        mcp=_mcp(data.get("mcp", {}), source),
        store=parse_store(data.get("store", {}), source),
        source=source,
    )


def _peers(raw: Any, source: str) -> dict[str, Peer]:
    base = Path(source).parent if not source.startswith("<") else None
    try:
        return parse_peers(raw, base)
    except PeerConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _mcp(raw: Any, source: str) -> dict[str, McpServerConfig]:
    try:
        servers = parse_servers(raw, source)
    except McpConfigError as exc:
        raise ConfigError(str(exc)) from exc
    for name, server in servers.items():
        if not server.command:
            continue
        # shutil here, not at the top: every actor reads the configuration, and shutil
        # loads zlib, bz2 and lzma (~0.45 MiB resident); only a stdio server needs it.
        import shutil
        # Found now, at `oploop up`, rather than at the first call of a session.
        try:  # (npx of an installed package: its program; what fetches packages: refused)
            command = runnable(server.command, server.cwd)
        except NotRunnable as exc:
            raise ConfigError(f"{source}: mcp.{name}.command: {exc}") from None
        if shutil.which(command[0]) is None:
            raise ConfigError(f"{source}: mcp.{name}.command[0]: {server.command[0]!r} "
                              f"is not an executable on PATH")
        if command != server.command:
            servers[name] = dataclasses.replace(server, command=command)
    return servers


def _prices(raw: Any, source: str) -> dict[str, Price]:
    """The shipped prices with the file's `[prices."MODEL"]` tables over them: a shipped
    model's missing keys keep its shipped price; another model needs all four."""
    prices = dict(DEFAULT_PRICES)
    fields = [f.name for f in dataclasses.fields(Price)]
    for model, table in as_table(raw, source, "prices").items():
        where = f'prices."{model}"'
        table = as_table(table, source, where)
        no_unknown(table, set(fields), source, where)
        shipped = DEFAULT_PRICES.get(model)
        values: dict[str, float] = {}
        for name in fields:
            if name not in table and shipped is None:
                raise ConfigError(f"{source}: {where}.{name}: required for a model with no "
                                  "shipped price (USD per million tokens)")
            value = checked(float, table[name], source, f"{where}.{name}") if name in table \
                else getattr(shipped, name)
            if not 0 <= value < float("inf"):  # (NaN fails too)
                raise ConfigError(f"{source}: {where}.{name}: must be a number >= 0, "
                                  f"got {value!r}")
            values[name] = value
        prices[model] = Price(**values)
    return prices


def _hidden(raw: Any, source: str) -> dict[tuple[str, str], frozenset[str]]:
    out: dict[tuple[str, str], frozenset[str]] = {}
    for platform, modes in as_table(raw, source, "hidden").items():
        for mode, names in as_table(modes, source, f"hidden.{platform}").items():
            where = f"hidden.{platform}.{mode}"
            out[(platform, mode)] = frozenset(checked(tuple[str, ...], names, source, where))
    return out
