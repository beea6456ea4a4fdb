"""Which calls the sandbox refuses: a layer a policy requires that this machine (or
this launch) lacks, and what the bubblewrap backend cannot do.

Pure checks over a policy, the machine's layers (`layers.machine_layers`: name ->
"" when present, else why not) and the call's view; `Sandbox.check` and
`Sandbox.launch` raise what they find before anything is started.
"""

from __future__ import annotations

import os
from pathlib import Path

from actors.tools.process import ToolRefused

from . import bwrap, modes
from .policy import LAYERS, Policy

BWRAP_REPLACES = frozenset({"namespaces", "landlock"})
"""The layers bubblewrap stands in for when it is the backend."""


class SandboxRefused(ToolRefused):
    """A policy requires a layer this machine (or this launch) does not have."""

    def __init__(self, tool: str, layer: str, reason: str) -> None:
        super().__init__(
            f"{tool}: refused: sandbox layer '{layer}' is missing ({reason}); "
            f"lower the policy in sandbox.toml to run without it"
        )
        self.tool = tool
        self.layer = layer


def uses_bwrap(policy: Policy, writing: bool) -> bool:
    """Whether a call runs under bubblewrap (never a file operation)."""
    # The file operations run Python code after the lockdown: always in the launcher itself.
    return policy.backend == "bwrap" and not writing


def check_layers(tool: str, policy: Policy, layers: dict[str, str], *, writing: bool = False,
                 view: modes.WorkView | None = None) -> None:
    """Raise SandboxRefused if `policy` requires a layer missing from `layers` (or, for
    a `view` on the user's files, one that view stands on)."""
    replaced: frozenset[str] = frozenset()
    if view is not None and not view.confined:
        if uses_bwrap(policy, writing):
            raise SandboxRefused(tool, "bubblewrap", f"the bubblewrap backend runs only "
                                 f"sandbox mode scratch, not {view.mode}")
        for layer in ("namespaces", "landlock", "uid"):
            # The whole tree is readable and the tool runs as the user (even root,
            # without capabilities): these are what keep the rest out of reach.
            if layers.get(layer) or not policy.applies(layer):
                raise SandboxRefused(tool, layer, layers.get(layer) or "lowered "
                                     f"in sandbox.toml; sandbox mode {view.mode} needs it")
    if uses_bwrap(policy, writing):
        path, why = bwrap.find()
        if not path:
            raise SandboxRefused(tool, "bubblewrap", why)
        if not (policy.applies("uid") and not layers.get("uid")):
            # bwrap started by root maps the tool to host root: never that.
            raise SandboxRefused(
                tool, "uid", "the bubblewrap backend runs bwrap as the tool uid only"
            )
        replaced = BWRAP_REPLACES
    for layer in LAYERS:
        reason = layers.get(layer, "unknown layer")
        if reason and policy.requires(layer) and layer not in replaced:
            raise SandboxRefused(tool, layer, reason)


def check_reachable(tool: str, path: Path, uid: int) -> None:
    """bwrap runs as the tool uid, so every parent of the workspace must let it pass."""
    for parent in path.parents:
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            continue  # not made yet: `workspace` makes the parents 0755
        if st.st_mode & 0o001 or (st.st_uid == uid and st.st_mode & 0o100):
            continue
        raise SandboxRefused(
            tool, "bubblewrap",
            f"uid {uid} cannot reach the workspace {path}: {parent} is not traversable "
            f"(use the launcher backend, or an OPLOOP_HOME the tool uid can pass through)",
        )
