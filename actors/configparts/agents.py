"""The `[agents.NAME]` tables of `oploop.toml`: `Agent`, model aliases, and their checks.

Here, not in the supervisor: the runner and the config use agents too.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from actors.allowlist import NONE, NetworkSetting, parse_network

from .checks import ConfigError, as_table, record

#: Split point of a system prompt: what precedes it is the static, cacheable prefix.
CACHE_BOUNDARY = "<<cache-boundary>>"

#: Short names for concrete model ids.
MODEL_ALIASES: dict[str, str] = {
    "sonnet": "claude-sonnet-4-5",
    "opus": "claude-opus-4-1",
    "haiku": "claude-haiku-4-5",
}

#: Context windows (tokens) of current Claude models, by id prefix (a dated id such as
#: `claude-sonnet-4-5-20250929` matches its family). Another model or server: set the
#: agent's `context_window`.
MODEL_WINDOWS: dict[str, int] = {
    "claude-opus-4": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-haiku-4": 200_000,
    "claude-3-7-sonnet": 200_000,
    "claude-3-5-sonnet": 200_000,
    "claude-3-5-haiku": 200_000,
    "offline": 200_000,
}
#: The window assumed for a model the table does not know.
DEFAULT_WINDOW = 200_000
#: The smallest window an agent may state (a system prompt and one turn must fit).
MIN_WINDOW = 4_096

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
    #: a tuple of allowed hosts (`actors.allowlist`), reached through the host's
    #: filtering proxy (docs/sandbox.md, "Network").
    network: NetworkSetting = NONE
    #: The memory folder this agent's `memory` tool works in (`$OPLOOP_HOME/memory/NAME`,
    #: shared by every agent naming it); "" : no memory tool.
    memory: str = ""
    #: The model's context window in tokens (0: the known window of `model`,
    #: `MODEL_WINDOWS`, else `DEFAULT_WINDOW`), and the fraction of it at which the
    #: session's request is compacted (`actors/core/context.py`).
    context_window: int = 0
    compact_at: float = 0.8
    #: The model that writes a compaction's summary ("": the agent's own).
    compact_model: str = ""

    @property
    def sandbox_mode(self) -> str:
        """The sandbox mode this agent's tools run in (`sandbox`, or the default)."""
        return self.sandbox or "workspace-write"

    def model_id(self, aliases: Mapping[str, str] = MODEL_ALIASES) -> str:
        """The concrete model id (an alias resolved, a concrete id as is)."""
        return aliases.get(self.model, self.model)

    def window(self, aliases: Mapping[str, str] = MODEL_ALIASES) -> int:
        """The context window this agent's requests must fit, in tokens."""
        if self.context_window > 0:
            return self.context_window
        model = self.model_id(aliases)
        return next((w for prefix, w in MODEL_WINDOWS.items() if model.startswith(prefix)),
                    DEFAULT_WINDOW)


DEFAULT_AGENT = Agent()


def parse_agent(name: str, raw: Mapping[str, Any], source: str) -> Agent:
    """The agent `name` from its `[agents.NAME]` table; `ConfigError` names the bad key."""
    if "name" in raw:
        raise ConfigError(f"{source}: agents.{name}.name: the table name is the agent's name")
    raw = dict(raw)
    rules: tuple[Any, ...] = ()
    if "permissions" in raw:  # a table, in order (not a field `_record` can check)
        from actors.permissions import BadRule, parse_rules

        where = f"agents.{name}.permissions"
        try:
            rules = parse_rules(as_table(raw.pop("permissions"), source, where))
        except BadRule as exc:
            raise ConfigError(f"{source}: {where}.{exc}") from None
    network: NetworkSetting = NONE
    if "network" in raw:  # "none", "all" or a list (not a field `_record` can check)
        try:
            network = parse_network(raw.pop("network"))
        except ValueError as exc:
            raise ConfigError(f"{source}: agents.{name}.network: {exc}") from None
    agent: Agent = record(Agent, {**raw, "name": name}, source, f"agents.{name}")
    agent = dataclasses.replace(agent, permissions=rules, network=network)
    if agent.approval_timeout_s <= 0:
        raise ConfigError(f"{source}: agents.{name}.approval_timeout_s: must be more than 0")
    if agent.max_turns < 1:
        raise ConfigError(f"{source}: agents.{name}.max_turns: must be at least 1")
    if agent.max_tokens < 1:
        raise ConfigError(f"{source}: agents.{name}.max_tokens: must be at least 1")
    if agent.context_window < 0 or 0 < agent.context_window < MIN_WINDOW:
        raise ConfigError(f"{source}: agents.{name}.context_window: 0 (the model's) or at "
                          f"least {MIN_WINDOW} tokens")
    if not 0.0 < agent.compact_at <= 1.0:
        raise ConfigError(f"{source}: agents.{name}.compact_at: a fraction within 0..1 "
                          "(default 0.8)")
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
    if agent.memory:
        from actors.memorytool import folder_name_error

        problem = folder_name_error(agent.memory)
        if problem is not None:
            raise ConfigError(f"{source}: agents.{name}.memory: {problem}")
    if agent.target_machine:
        from actors.machines import LOCAL, machine_name_error

        problem = machine_name_error(agent.target_machine)
        if problem is None and agent.target_machine == LOCAL:
            problem = f"{LOCAL!r} is the host's own machine: leave target_machine empty"
        if problem is not None:
            raise ConfigError(f"{source}: agents.{name}.target_machine: {problem}")
    return agent
