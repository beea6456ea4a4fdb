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
    compact_every_kb = 4096       # a running session's log is compacted every this many KB
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
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import shutil
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors import bounds
from actors.ask.peers import Peer, PeerConfigError, parse_peers
from actors.mcp.config import McpConfigError, McpServerConfig, parse_servers
from actors.netproxy.allowlist import NONE, NetworkSetting, parse_network
from actors.usage import DEFAULT_PRICES, Price
from bus.endpoints import EndpointError, Network, PlainTcpRefused

# -- agents (here, not in the supervisor: the runner and the config use them too) ----

#: Split point of a system prompt: what precedes it is the static, cacheable prefix.
CACHE_BOUNDARY = "<<cache-boundary>>"

#: Short names for concrete model ids.
MODEL_ALIASES: dict[str, str] = {
    "sonnet": "claude-sonnet-4-5",
    "opus": "claude-opus-4-1",
    "haiku": "claude-haiku-4-5",
}

DEFAULT_SYSTEM = (
    "You are an operator: you carry out the user's requests on their machine with the "
    "tools you are given, and you report what the tools actually returned. Be brief."
)


@dataclass(frozen=True, slots=True)
class Agent:
    """One agent's configuration (defaults are the reference loop's)."""

    name: str = "default"
    model: str = "sonnet"
    system: str = DEFAULT_SYSTEM
    max_turns: int = 16
    temperature: float = 0.3
    max_tokens: int = 4096
    streaming: bool = True
    parallel_tools: bool = True
    max_parallel_tools: int = 8
    category_allowlist: tuple[str, ...] = ()
    platform: str = "local"
    mode: str = "default"
    tool_timeout_s: float = 120.0
    #: Seconds a run may take before it is cancelled with mode "deadline" (0: none).
    deadline_s: float = 0.0
    #: Set when the session acts on another machine: environment reminders are suppressed.
    target_machine: str = ""
    #: Paths the confined `read_file`/`list_dir` may read besides the system's files
    #: (/etc, /usr, /opt, /proc, ...), the session's cwd and its workspace. One that is
    #: or contains a hidden path (/, /root, /home, /tmp) or lies in an oploop home or key
    #: folder is ignored; one under /root or /home is shown alone.
    read_paths: tuple[str, ...] = ()
    #: Where and how the tools act (`actors/sandbox/modes.py`): "workspace-write" (the
    #: session's working directory and `write_paths` writable, the rest readable but
    #: what is hidden), "read-only" (nothing writable but a private /tmp), "scratch"
    #: (an empty per-session workspace, only the system's files readable).
    #: "" : the host's default (`OPLOOP_SANDBOX`, else "workspace-write").
    sandbox: str = ""
    #: The working directory of this agent's sessions, whatever directory they were
    #: started in ("" : that directory, or `oploop run --cwd`).
    cwd: str = ""
    #: Directories writable besides the working directory (workspace-write).
    write_paths: tuple[str, ...] = ()
    #: Paths hidden from the tools in every mode, besides the oploop home, key and
    #: credential folders.
    deny_read: tuple[str, ...] = ()
    #: Permission rules, `[agents.NAME.permissions]` in order (`actors.permissions`):
    #: none means every call is allowed, as it always was.
    permissions: tuple[tuple[str, str, str | None, str], ...] = ()
    #: Seconds a call under `ask` waits for a decision before it is denied.
    approval_timeout_s: float = 600.0
    #: What `shell` may reach: "none" (no socket at all), "all" (the host's network), or
    #: a tuple of allowed hosts (`actors.netproxy.allowlist`), reached through the host's
    #: filtering proxy (docs/sandbox.md, "Network").
    network: NetworkSetting = NONE

    @property
    def sandbox_mode(self) -> str:
        """The sandbox mode this agent's tools run in (`sandbox`, or the default)."""
        return self.sandbox or "workspace-write"

    def model_id(self, aliases: Mapping[str, str] = MODEL_ALIASES) -> str:
        """The concrete model id (an alias resolved, a concrete id as is)."""
        return aliases.get(self.model, self.model)


DEFAULT_AGENT = Agent()


# -- the file ------------------------------------------------------------------------

CONFIG_NAME = "oploop.toml"

_TOP_KEYS = frozenset({"models", "hidden", "router", "limits", "retention", "network", "http",
                       "agents", "prices", "peers", "mcp"})


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file and key."""


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """The intent router's cheap classification call."""

    enabled: bool = False
    model: str = "haiku"
    max_tokens: int = 8
    #: The classifier fails fast: this many attempts (one retry) within this long,
    #: then the run goes on as AGENT (the ROUTE event says why).
    attempts: int = 2
    timeout_s: float = 10.0


@dataclass(frozen=True, slots=True)
class Limits:
    """What the api refuses up front, with a clear error, and what is cut where it enters."""

    max_prompt_chars: int = 1_000_000
    max_running_sessions: int = 1_000
    #: Disk space (MB) the session log keeps for itself: new runs are refused below
    #: it, and a reserve file of this size is given up to journal the ends of the
    #: runs under way when the disk fills (0: no reserve).
    journal_reserve_mb: int = 64
    #: A session's state is written whole (a compaction) at each run's end and, in a
    #: long run, once this many KB of records were logged since the last one: a
    #: restart folds at most this much (0: only at a run's end).
    compact_every_kb: int = 4096
    #: What enters a history from outside the built-ins is cut to these, with a note
    #: saying how much was cut (`actors.bounds`): an MCP result's text and an
    #: `ask_machine` answer (characters; the host also cuts every tool result it takes
    #: to this, and 1 KiB of the tools' own notes); the MCP tools one executor offers, each
    #: description (characters), each input schema (characters of JSON; a tool over it
    #: is left out, and its server's status says so).
    max_result_chars: int = bounds.MAX_RESULT_CHARS
    max_tools: int = bounds.MAX_TOOLS
    max_tool_description_chars: int = bounds.MAX_TOOL_DESCRIPTION_CHARS
    max_tool_schema_chars: int = bounds.MAX_TOOL_SCHEMA_CHARS


@dataclass(frozen=True, slots=True)
class Retention:
    """Which finished sessions the host deletes, log and all (0: no limit on that rule).

    The defaults keep a busy host's disk bounded without losing what a person
    still looks at: a month of history, the 1,000 most recent sessions (at the
    ~5 KB of a short session, 5 MB; at the several MB of a long tool-heavy one, a
    few GB), and whatever those are, never more than 1 GiB on disk, which a
    laptop's disk takes without notice. Checked every minute: a host starting
    100 sessions a second overshoots `max_sessions` by at most a minute's worth.
    A running session is never deleted.
    """

    max_age_s: float = 30 * 86_400.0
    max_sessions: int = 1_000
    max_bytes: int = 1 << 30
    every_s: float = 60.0


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
        return _loopback(self.host)


def parse_http_listen(listen: str, tls: bool = False) -> tuple[str, int]:
    """`HOST:PORT` (port 0: any free one) as (host, port); off loopback only with `tls`
    (the token would cross the network in clear otherwise: ValueError says so)."""
    host, sep, port_s = listen.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_s.isdigit() or not 0 <= int(port_s) <= 65535:
        raise ValueError(f"expected HOST:PORT (127.0.0.1:7480), got {listen!r}")
    if not tls and not _loopback(host):
        raise ValueError(f"{listen!r}: off loopback is refused without TLS (set http.cert "
                         "and http.key), or use 127.0.0.1")
    return host, int(port_s)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    _no_unknown(data, _TOP_KEYS, source, "")
    aliases = dict(MODEL_ALIASES)
    aliases.update(_str_map(data.get("models", {}), source, "models"))
    agents = {"default": DEFAULT_AGENT}
    raw_agents = _table(data.get("agents", {}), source, "agents")
    for name, raw in raw_agents.items():
        agents[name] = _agent(name, _table(raw, source, f"agents.{name}"), source)
    return Config(
        agents=agents,
        aliases=aliases,
        hidden=_hidden(data.get("hidden", {}), source),
        router=_record(RouterConfig, data.get("router", {}), source, "router"),
        limits=_limits(data.get("limits", {}), source),
        retention=_retention(data.get("retention", {}), source),
        network=_network(data.get("network"), source),
        local_worker_keys=_local_worker_keys(data.get("network"), source),
        http=_http(data.get("http", {}), source),
        prices=_prices(data.get("prices", {}), source),
        peers=_peers(data.get("peers", {}), source),
        mcp=_mcp(data.get("mcp", {}), source),
        source=source,
    )


def _limits(raw: Any, source: str) -> Limits:
    limits: Limits = _record(Limits, raw, source, "limits")
    for name in ("max_result_chars", "max_tools", "max_tool_description_chars",
                 "max_tool_schema_chars"):
        if getattr(limits, name) < 1:
            raise ConfigError(f"{source}: limits.{name}: must be at least 1")
    return limits


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
        # Found now, at `oploop up`, rather than at the first call of a session.
        if server.command and shutil.which(server.command[0]) is None:
            raise ConfigError(f"{source}: mcp.{name}.command[0]: {server.command[0]!r} "
                              f"is not an executable on PATH")
    return servers


def _prices(raw: Any, source: str) -> dict[str, Price]:
    """The shipped prices with the file's `[prices."MODEL"]` tables over them: a shipped
    model's missing keys keep its shipped price; another model needs all four."""
    prices = dict(DEFAULT_PRICES)
    fields = [f.name for f in dataclasses.fields(Price)]
    for model, table in _table(raw, source, "prices").items():
        where = f'prices."{model}"'
        table = _table(table, source, where)
        _no_unknown(table, set(fields), source, where)
        shipped = DEFAULT_PRICES.get(model)
        values: dict[str, float] = {}
        for name in fields:
            if name not in table and shipped is None:
                raise ConfigError(f"{source}: {where}.{name}: required for a model with no "
                                  "shipped price (USD per million tokens)")
            value = _check(float, table[name], source, f"{where}.{name}") if name in table \
                else getattr(shipped, name)
            if not 0 <= value < float("inf"):  # (NaN fails too)
                raise ConfigError(f"{source}: {where}.{name}: must be a number >= 0, "
                                  f"got {value!r}")
            values[name] = value
        prices[model] = Price(**values)
    return prices


def _network(raw: Any, source: str) -> Network | None:
    if raw is None:
        return None
    table = _table(raw, source, "network")
    _no_unknown(table, {"listen", "curve", "local_worker_keys"}, source, "network")
    if "listen" not in table:
        raise ConfigError(f"{source}: network.listen: required (tcp://HOST:PORT)")
    listen = _check(str, table["listen"], source, "network.listen")
    curve = _check(bool, table.get("curve", True), source, "network.curve")
    try:
        return Network.parse(listen, curve)
    except EndpointError as exc:
        key = "network.curve" if isinstance(exc, PlainTcpRefused) else "network.listen"
        raise ConfigError(f"{source}: {key}: {exc}") from exc


def _local_worker_keys(raw: Any, source: str) -> frozenset[str]:
    """`[network] local_worker_keys`: names of worker keys (`oploop keys add NAME --role
    worker`) allowed to serve without `--machine`, as the host's own executors do."""
    names = _table(raw, source, "network").get("local_worker_keys", []) if raw else []
    where = f"{source}: network.local_worker_keys"
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"{where}: expected a list of key names")
    return frozenset(names)


def _http(raw: Any, source: str) -> HttpConfig:
    table = _table(raw, source, "http")
    _no_unknown(table, {"enabled", "listen", "cert", "key"}, source, "http")
    enabled = _check(bool, table.get("enabled", True), source, "http.enabled")
    cert = _check(str, table.get("cert", ""), source, "http.cert")
    key = _check(str, table.get("key", ""), source, "http.key")
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
        host, port = parse_http_listen(_check(str, table["listen"], source, "http.listen"),
                                       tls=bool(cert))
    except ValueError as exc:
        raise ConfigError(f"{source}: http.listen: {exc}") from None
    return HttpConfig(enabled, host, port, explicit=True, cert=cert, key=key)


def _retention(raw: Any, source: str) -> Retention:
    table = _table(raw, source, "retention")
    _no_unknown(table, {"max_age", "max_sessions", "max_bytes", "every"}, source, "retention")
    default = Retention()

    def read(key: str, parse: Any, fallback: Any) -> Any:
        try:
            return parse(table.get(key, fallback))
        except ValueError as exc:
            raise ConfigError(f"{source}: retention.{key}: {exc}") from None

    out = Retention(
        max_age_s=read("max_age", parse_duration, default.max_age_s),
        max_sessions=_check(int, table.get("max_sessions", default.max_sessions), source,
                            "retention.max_sessions"),
        max_bytes=read("max_bytes", parse_size, default.max_bytes),
        every_s=read("every", parse_duration, default.every_s),
    )
    if out.max_sessions < 0:
        raise ConfigError(f"{source}: retention.max_sessions: must be at least 0")
    if out.every_s <= 0:
        raise ConfigError(f"{source}: retention.every: must be more than 0 s")
    return out


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$")
_SECONDS = {"s": 1.0, "m": 60.0, "h": 3_600.0, "d": 86_400.0, "w": 604_800.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_BYTES = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


class BadDuration(ValueError):
    """Not a duration: a number of seconds, or `90s`, `15m`, `12h`, `30d`, `2w`."""


class BadSize(ValueError):
    """Not a size: a number of bytes, or `500MB`, `1GiB`, `20k`, ..."""


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string like `30d` (raises `BadDuration`)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    match = _DURATION.match(value) if isinstance(value, str) else None
    if match is None:
        raise BadDuration(f"expected a duration (30d, 12h, 15m, 90s), got {value!r}")
    return float(match[1]) * _SECONDS[match[2] or "s"]


def parse_size(value: Any) -> int:
    """Bytes from a number or a string like `1GiB`, `500MB` (raises `BadSize`)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None:
        raise BadSize(f"expected a size (1GiB, 500MB, bytes), got {value!r}")
    unit = (match[2] or "").lower().removesuffix("b")
    return int(float(match[1]) * _BYTES[unit])


def _agent(name: str, raw: Mapping[str, Any], source: str) -> Agent:
    if "name" in raw:
        raise ConfigError(f"{source}: agents.{name}.name: the table name is the agent's name")
    raw = dict(raw)
    rules: tuple[Any, ...] = ()
    if "permissions" in raw:  # a table, in order (not a field `_record` can check)
        from actors.permissions import BadRule, parse_rules

        where = f"agents.{name}.permissions"
        try:
            rules = parse_rules(_table(raw.pop("permissions"), source, where))
        except BadRule as exc:
            raise ConfigError(f"{source}: {where}.{exc}") from None
    network: NetworkSetting = NONE
    if "network" in raw:  # "none", "all" or a list (not a field `_record` can check)
        try:
            network = parse_network(raw.pop("network"))
        except ValueError as exc:
            raise ConfigError(f"{source}: agents.{name}.network: {exc}") from None
    agent: Agent = _record(Agent, {**raw, "name": name}, source, f"agents.{name}")
    agent = dataclasses.replace(agent, permissions=rules, network=network)
    if agent.approval_timeout_s <= 0:
        raise ConfigError(f"{source}: agents.{name}.approval_timeout_s: must be more than 0")
    if agent.max_turns < 1:
        raise ConfigError(f"{source}: agents.{name}.max_turns: must be at least 1")
    if agent.max_tokens < 1:
        raise ConfigError(f"{source}: agents.{name}.max_tokens: must be at least 1")
    if not 0.0 <= agent.temperature <= 1.0:
        raise ConfigError(f"{source}: agents.{name}.temperature: must be within 0..1")
    from actors.sandbox.modes import MODES, not_writable

    if agent.sandbox and agent.sandbox not in MODES:
        raise ConfigError(f"{source}: agents.{name}.sandbox: expected one of "
                          f"{', '.join(repr(m) for m in MODES)}, got {agent.sandbox!r}")
    for key in ("cwd", *(f"{k}[{i}]" for k in ("write_paths", "deny_read")
                         for i in range(len(getattr(agent, k))))):
        base, _, index = key.partition("[")
        value = getattr(agent, base) if not index else getattr(agent, base)[int(index[:-1])]
        if value and not value.startswith(("/", "~")):
            raise ConfigError(f"{source}: agents.{name}.{key}: expected an absolute path, "
                              f"got {value!r}")
        why = not_writable(os.path.normpath(value)) if base == "write_paths" else ""
        if why:
            raise ConfigError(f"{source}: agents.{name}.{key}: {value}: {why}")
    if agent.deadline_s < 0 or agent.tool_timeout_s <= 0:
        raise ConfigError(f"{source}: agents.{name}: deadline_s >= 0 and tool_timeout_s > 0")
    if agent.target_machine:
        from actors.machines import LOCAL, machine_name_error

        problem = machine_name_error(agent.target_machine)
        if problem is None and agent.target_machine == LOCAL:
            problem = f"{LOCAL!r} is the host's own machine: leave target_machine empty"
        if problem is not None:
            raise ConfigError(f"{source}: agents.{name}.target_machine: {problem}")
    return agent


def _hidden(raw: Any, source: str) -> dict[tuple[str, str], frozenset[str]]:
    out: dict[tuple[str, str], frozenset[str]] = {}
    for platform, modes in _table(raw, source, "hidden").items():
        for mode, names in _table(modes, source, f"hidden.{platform}").items():
            where = f"hidden.{platform}.{mode}"
            out[(platform, mode)] = frozenset(_check(tuple[str, ...], names, source, where))
    return out


def _record(cls: type[Any], raw: Any, source: str, where: str) -> Any:
    """An instance of dataclass `cls` from a TOML table, every field type-checked."""
    table = _table(raw, source, where)
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    _no_unknown(table, fields, source, where)
    values = {k: _check(hints[k], v, source, f"{where}.{k}") for k, v in table.items()}
    return cls(**values)


def _check(hint: Any, value: Any, source: str, where: str) -> Any:
    """`value` if it has the type `hint` (int accepted for float, lists for tuples)."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{source}: {where}: expected a list, got {type(value).__name__}")
        item = typing.get_args(hint)[0]
        return tuple(_check(item, v, source, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (typing.Union, types.UnionType):
        raise ConfigError(f"{source}: {where}: unsupported field type")  # none exist today
    ok = isinstance(value, hint) and not (hint is int and isinstance(value, bool))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise ConfigError(
            f"{source}: {where}: expected {hint.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


def _table(raw: Any, source: str, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: {where}: expected a table, got {type(raw).__name__}")
    return raw


def _str_map(raw: Any, source: str, where: str) -> dict[str, str]:
    table = _table(raw, source, where)
    return {k: _check(str, v, source, f"{where}.{k}") for k, v in table.items()}


def _no_unknown(table: Mapping[str, Any], known: frozenset[str] | set[str], source: str,
                where: str) -> None:
    extra = sorted(set(table) - set(known))
    if extra:
        prefix = f"{where}." if where else ""
        raise ConfigError(
            f"{source}: {prefix}{extra[0]}: unknown key (known: {', '.join(sorted(known))})"
        )
