"""Every setting of oploop, read once at start: `oploop.toml` and the environment.

An actor (`actors.runtime.run_actor`), the CLI and the embedded `Runner` call
`load_settings()` once and pass what each part needs down to it; nothing else
reads an `OPLOOP_*` variable. A bad value fails at start, naming the variable
as the config file names its key: `OPLOOP_RETRY_ATTEMPTS: expected int, got 'x'`.

| variable | default | meaning |
|---|---|---|
| `OPLOOP_HOME` | `~/.oploop` | the host's home (read by `bus.endpoints.place_of`) |
| `OPLOOP_CONFIG` | | the `oploop.toml` (else `$OPLOOP_HOME/oploop.toml`, `./oploop.toml`) |
| `OPLOOP_CONNECT`, `OPLOOP_KEYS` | | a host elsewhere and its key folder (`place_of`) |
| `OPLOOP_MACHINE` | | the worker machine a worker says it runs on (`oploop worker --machine`) |
| `OPLOOP_LOG_LEVEL` | WARNING | DEBUG, INFO, WARNING, ERROR or CRITICAL |
| `OPLOOP_INTENT_ROUTER` | | `on` / `off` overrides `[router] enabled` |
| `OPLOOP_RETRY_ATTEMPTS` | 6 | model attempts per call |
| `OPLOOP_RETRY_BASE_S` | 0.5 | first backoff, doubling ... |
| `OPLOOP_RETRY_MAX_S` | 32 | ... up to this |
| `OPLOOP_RETRY_AFTER_MAX_S` | 120 | a server's `retry-after` honoured up to this, else fail |
| `OPLOOP_STREAM_IDLE_S` | 2 | a stream that sends nothing (not even a ping) this long is retried |
| `OPLOOP_STREAM_FIRST_S` | 60 | a stream with no content this long after the request is retried |
| `OPLOOP_STREAM_PAUSE_S` | 30 | no content this long since the last (pings only): retried |
| `OPLOOP_TOKEN_BATCH_MS` | 20 | streamed text batched this long (0..10000; 0: none) |
| `OPLOOP_LLM_BACKEND` | anthropic | `scripted`: the model runs inside the llm callers |
| `OPLOOP_LLM_SCRIPT` | | the scenario the scripted backend plays (none: rules only) |
| `OPLOOP_OFFLINE_SCENARIO` | | the scenario the offline model plays |
| `OPLOOP_OFFLINE_CONTEXT` | 200000 | the offline model's context window in tokens (0: none) |
| `OPLOOP_LLM_CALLERS` | 1 | llm caller processes of a host (at least 1) |
| `OPLOOP_EXECUTORS` | 1 | executor processes of a host (at least 1; each runs 32 calls at once) |
| `OPLOOP_MEMTRACE` | 0 | every N s, each actor logs its top memory growth (tracemalloc; 0: off) |
| `OPLOOP_VIEWER_QUEUE` | 100000 | live events queued per viewer (beyond: dropped, refetched) |
| `OPLOOP_EVENT_RETENTION_SESSIONS` | 1000 | overrides `[retention] max_sessions` (0: no limit) |
| `OPLOOP_EVENT_RETENTION_DAYS` | 30 | overrides `[retention] max_age`, in days (0: no limit) |
| `OPLOOP_HTTP_LISTEN` | 127.0.0.1:7480 | overrides `[http] listen` (port 0: any); `off`: none |
| `OPLOOP_DEBUG` | 0 | `1`: the CLI prints tracebacks (`debug_wanted`) |
| `ANTHROPIC_API_KEY`, `_BASE_URL` | | the model's endpoint: `model_choice` picks the model |
| `OPLOOP_SANDBOX` | workspace-write | the mode of agents naming no `sandbox` |
| `OPLOOP_STORE` | | overrides `[store] url`: `postgresql://...` (shared by hosts) |

`bus.endpoints.place_of` reads `OPLOOP_HOME`, `OPLOOP_CONNECT` and `OPLOOP_KEYS` (a
bare `Client.connect()` follows them, and bus imports no actors): `load_settings`
takes them from it. `OPLOOP_DEBUG` is read when an error is shown (the settings may
be what failed). The model is chosen here only (`model_choice`).

A few more are the host's handshake with the actors it starts, not settings a user
sets: `OPLOOP_READY_FD` (the pipe to say "ready" on), `OPLOOP_PARENT_PID`,
`OPLOOP_EMBEDDED=1` (a host `oploop run` started: its runs end with it, none is
resumed at its start) and `OPLOOP_RESTARTED=1` (this actor is a restart).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from actors.config import (
    Config,
    ConfigError,
    HttpConfig,
    config_path,
    load_config,
    parse_http_listen,
)
from actors.configparts.store import check_store_url
from actors.machines import LOCAL, machine_name_error
from bus.endpoints import Endpoints, Place, place_of

READY_FD_ENV = "OPLOOP_READY_FD"
PARENT_PID_ENV = "OPLOOP_PARENT_PID"
EMBEDDED_ENV = "OPLOOP_EMBEDDED"
RESTARTED_ENV = "OPLOOP_RESTARTED"
CONFIG_ENV = "OPLOOP_CONFIG"
MACHINE_ENV = "OPLOOP_MACHINE"

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LLM_BACKENDS = ("anthropic", "scripted")
#: Longest `OPLOOP_TOKEN_BATCH_MS` (a batch held longer would look like a stall).
MAX_TOKEN_BATCH_MS = 10_000.0

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetrySettings:
    """How hard an llm caller tries (`actors.llm_caller.policy.RetryPolicy` uses them);
    its defaults are the only ones (`RetryPolicy` and `load_settings` take them)."""

    attempts: int = 6
    base_s: float = 0.5
    cap_s: float = 32.0
    idle_s: float = 2.0
    first_s: float = 60.0
    pause_s: float = 30.0
    retry_after_cap_s: float = 120.0


#: The model's endpoint in the environment (the SDK's own variables).
MODEL_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """Which model runs: `scripted` (inside the llm callers, or the `Runner`), `api` (the
    Messages API at `endpoint`: the user's key and/or base URL), or `offline` (the
    offline model: a host starts its server; a `Runner` plays its rules in process)."""

    kind: str
    #: `api`: the `MODEL_ENV` variables set, by name (never printed: a key).
    endpoint: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def api_key(self) -> str | None:
        return self.endpoint.get("ANTHROPIC_API_KEY")

    @property
    def base_url(self) -> str | None:
        return self.endpoint.get("ANTHROPIC_BASE_URL")


def model_choice(llm_backend: str, environ: Mapping[str, str]) -> ModelChoice:
    """The one place the model is chosen: `OPLOOP_LLM_BACKEND=scripted`, else the API
    when `ANTHROPIC_API_KEY` or `ANTHROPIC_BASE_URL` is set, else the offline model."""
    if llm_backend == "scripted":
        return ModelChoice("scripted")
    endpoint = {name: environ[name] for name in MODEL_ENV if environ.get(name)}
    return ModelChoice("api", endpoint) if endpoint else ModelChoice("offline")


def debug_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether `OPLOOP_DEBUG=1` asks for tracebacks (read when an error is shown: the
    settings themselves may be what failed)."""
    env = os.environ if environ is None else environ
    return env.get("OPLOOP_DEBUG", "") not in ("", "0")


@dataclass(frozen=True, slots=True)
class TraceSettings:
    """OpenTelemetry traces (`actors/tracing.py`), on when an OTLP endpoint is set
    (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`; the SDK's
    exporter reads those and the other `OTEL_EXPORTER_OTLP_*` itself)."""

    #: `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`: prompts, replies,
    #: tool input and output are recorded on the spans.
    capture_content: bool = False


def trace_settings(env: Mapping[str, str]) -> TraceSettings | None:
    """The traces `env` asks for, or None (off: no endpoint, `OTEL_SDK_DISABLED=true`
    or `OTEL_TRACES_EXPORTER=none`)."""
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or \
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" \
            or env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    capture = env.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "")
    return TraceSettings(capture_content=capture.strip().lower() == "true")


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything configurable, checked, defaults filled in."""

    home: Path
    config: Config = Config()
    log_level: str = "WARNING"
    retry: RetrySettings = RetrySettings()
    token_batch_s: float = 0.02
    llm_backend: str = "anthropic"
    llm_script: str = ""
    offline_scenario: str = ""
    #: `OPLOOP_OFFLINE_CONTEXT`: the offline model's context window (tokens; 0: none).
    offline_context: int = 200_000
    llm_callers: int = 1
    executors: int = 1
    viewer_queue: int = 100_000
    #: `OPLOOP_MEMTRACE`: seconds between growth reports (`actors.memtrace`); 0: off.
    memtrace_s: float = 0.0
    #: Which model runs (`model_choice`).
    model: ModelChoice = ModelChoice("offline")
    #: `OPLOOP_CONNECT` / `OPLOOP_KEYS`: a host elsewhere ("" : this home's).
    connect: str = ""
    keys: str = ""
    #: `OPLOOP_MACHINE`: the worker machine this worker belongs to ("": the host's own).
    machine: str = ""
    ready_fd: int | None = None
    parent_pid: int | None = None
    #: Part of an embedded host (`oploop run` with no host up): runs end with the host.
    embedded: bool = False
    #: This actor is a restart by its host (not the host's first start of it).
    restarted: bool = False
    #: OpenTelemetry traces (`trace_settings`); None: off, the SDK never imported.
    traces: TraceSettings | None = None

    def endpoints(self) -> Endpoints:
        """The host to talk to: `connect` when set, else the one of `home`."""
        return Endpoints.of_place(Place(self.home, self.connect, self.keys))


def load_settings(environ: Mapping[str, str] | None = None, *,
                  config_file: Path | None = None) -> Settings:
    """Read and check `oploop.toml` and every `OPLOOP_*` variable of `environ`
    (default `os.environ`); `ConfigError` names the first bad one. `config_file`
    overrides where the file is looked for."""
    env = os.environ if environ is None else environ
    reader = _Reader(env)
    place = place_of(env)
    home = place.home
    explicit = env.get(CONFIG_ENV)
    path = config_file or config_path(home, Path(explicit) if explicit else None)
    config = _with_env(load_config(path), reader)
    d = RetrySettings()  # the defaults, in one place
    retry = RetrySettings(
        attempts=reader.get("OPLOOP_RETRY_ATTEMPTS", int, d.attempts, at_least=1),
        base_s=reader.get("OPLOOP_RETRY_BASE_S", float, d.base_s, at_least=0),
        cap_s=reader.get("OPLOOP_RETRY_MAX_S", float, d.cap_s, at_least=0),
        idle_s=reader.get("OPLOOP_STREAM_IDLE_S", float, d.idle_s, at_least=0),
        first_s=reader.get("OPLOOP_STREAM_FIRST_S", float, d.first_s, at_least=0),
        pause_s=reader.get("OPLOOP_STREAM_PAUSE_S", float, d.pause_s, at_least=0),
        retry_after_cap_s=reader.get("OPLOOP_RETRY_AFTER_MAX_S", float, d.retry_after_cap_s,
                                     at_least=0),
    )
    batch_ms = reader.get("OPLOOP_TOKEN_BATCH_MS", float, 20.0, at_least=0)
    llm_backend = reader.choice("OPLOOP_LLM_BACKEND", LLM_BACKENDS, "anthropic")
    if batch_ms > MAX_TOKEN_BATCH_MS:
        raise ConfigError(f"OPLOOP_TOKEN_BATCH_MS: must be within 0..{MAX_TOKEN_BATCH_MS:g}")
    return Settings(
        home=home,
        config=config,
        log_level=reader.choice("OPLOOP_LOG_LEVEL", LOG_LEVELS, "WARNING", upper=True),
        retry=retry,
        token_batch_s=batch_ms / 1000,
        llm_backend=llm_backend,
        llm_script=env.get("OPLOOP_LLM_SCRIPT", ""),
        model=model_choice(llm_backend, env),
        offline_scenario=env.get("OPLOOP_OFFLINE_SCENARIO", ""),
        offline_context=reader.get("OPLOOP_OFFLINE_CONTEXT", int, 200_000, at_least=0),
        llm_callers=reader.get("OPLOOP_LLM_CALLERS", int, 1, at_least=1),
        executors=reader.get("OPLOOP_EXECUTORS", int, 1, at_least=1),
        viewer_queue=reader.get("OPLOOP_VIEWER_QUEUE", int, 100_000, at_least=1),
        memtrace_s=reader.get("OPLOOP_MEMTRACE", float, 0.0, at_least=0),
        traces=trace_settings(env),
        connect=place.connect,
        keys=place.keys,
        machine=_machine(env.get(MACHINE_ENV, "")),
        ready_fd=reader.optional(READY_FD_ENV, int),
        parent_pid=reader.optional(PARENT_PID_ENV, int),
        embedded=env.get(EMBEDDED_ENV, "") == "1",
        restarted=env.get(RESTARTED_ENV, "") == "1",
    )


def _machine(name: str) -> str:
    """`OPLOOP_MACHINE`, checked: a worker machine's name, never `local`."""
    if not name:
        return ""
    problem = machine_name_error(name)
    if problem is None and name == LOCAL:
        problem = f"{LOCAL!r} is the host's own machine: name this one otherwise"
    if problem is not None:
        raise ConfigError(f"OPLOOP_MACHINE: {problem}")
    return name


def _with_env(config: Config, reader: _Reader) -> Config:
    """`config` with what the environment overrides: the router switch, retention."""
    flag = reader.choice("OPLOOP_INTENT_ROUTER", ("on", "off", ""), "", lower=True)
    if flag:
        config = dataclasses.replace(
            config, router=dataclasses.replace(config.router, enabled=flag == "on"))
    retention = config.retention
    sessions = reader.optional("OPLOOP_EVENT_RETENTION_SESSIONS", int, at_least=0)
    days = reader.optional("OPLOOP_EVENT_RETENTION_DAYS", float, at_least=0)
    if sessions is not None:
        retention = dataclasses.replace(retention, max_sessions=sessions)
    if days is not None:
        retention = dataclasses.replace(retention, max_age_s=days * 86_400.0)
    mode = reader.choice("OPLOOP_SANDBOX", ("workspace-write", "read-only", "scratch", ""), "")
    if mode:
        agents = {name: agent if agent.sandbox else dataclasses.replace(agent, sandbox=mode)
                  for name, agent in config.agents.items()}
        config = dataclasses.replace(config, agents=agents)
    store = config.store
    url = reader.env.get("OPLOOP_STORE")
    if url is not None:
        store = dataclasses.replace(store, url=check_store_url(url, "OPLOOP_STORE"))
    return dataclasses.replace(config, retention=retention, http=_http_env(config.http, reader),
                               store=store)


def _http_env(http: HttpConfig, reader: _Reader) -> HttpConfig:
    """`[http]` with `OPLOOP_HTTP_LISTEN` applied: `off`, or `HOST:PORT` (off loopback
    only with `[http]` cert and key)."""
    raw = reader.env.get("OPLOOP_HTTP_LISTEN", "").strip()
    if not raw:
        return http
    if raw.lower() == "off":
        return dataclasses.replace(http, enabled=False)
    try:
        host, port = parse_http_listen(raw, tls=http.tls)
    except ValueError as exc:
        raise ConfigError(f"OPLOOP_HTTP_LISTEN: {exc}") from None
    return dataclasses.replace(http, enabled=True, host=host, port=port, explicit=True)


class _Reader:
    """Typed reads of environment variables, failing as the config file does."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def optional(self, name: str, kind: Callable[[str], T], *,
                 at_least: float | None = None) -> T | None:
        raw = self.env.get(name, "").strip()
        if not raw:
            return None
        try:
            value = kind(raw)
        except ValueError:
            label = getattr(kind, "__name__", "value")
            raise ConfigError(f"{name}: expected {label}, got {raw!r}") from None
        if at_least is not None and value < at_least:  # type: ignore[operator]
            raise ConfigError(f"{name}: must be at least {at_least:g}, got {raw!r}")
        return value

    def get(self, name: str, kind: Callable[[str], T], default: T, *,
            at_least: float | None = None) -> T:
        value = self.optional(name, kind, at_least=at_least)
        return default if value is None else value

    def choice(self, name: str, allowed: tuple[str, ...], default: str, *,
               upper: bool = False, lower: bool = False) -> str:
        raw = self.env.get(name, "").strip()
        value = raw.upper() if upper else raw.lower() if lower else raw
        if not raw:
            return default
        if value not in allowed:
            shown = ", ".join(a for a in allowed if a)
            raise ConfigError(f"{name}: expected one of {shown}, got {raw!r}")
        return value
