"""Agents: what model a session talks to, with which limits, seeing which tools."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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

    def model_id(self, aliases: Mapping[str, str] = MODEL_ALIASES) -> str:
        """The concrete model id (an alias resolved, a concrete id as is)."""
        return aliases.get(self.model, self.model)


DEFAULT_AGENT = Agent()
