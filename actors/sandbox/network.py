"""A call's network, as the executor decides it: none, all, or through the host's proxy.

`Sandbox.launch(..., net=...)` takes one of these: "none" (the policy's own
setting: by default a private network namespace and no socket() at all), "all"
(the host's network namespace: the policy lowered to `network = "host"`), or a
`Proxied`: the private namespace still, with the launcher's forwarder
(`netbridge.py`) to the proxy's socket for one allowlist. `apply_network` turns
an offline launch spec into that one; everything it changes is here, and
`network_policy` the policy a command runs under given its network.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.allowlist import ALL, NONE, NetworkSetting, socket_name
from actors.tools.process import ToolRefused

from . import seccomp
from .netbridge import PORT
from .policy import Policy

PROXY_URL = f"http://127.0.0.1:{PORT}"
"""The proxy as a tool sees it."""


@dataclass(frozen=True, slots=True)
class Proxied:
    """Network through the host's filtering proxy: its socket for one allowlist
    (`socket_dir/socket_name`, hidden from the tool)."""

    socket_dir: str
    socket_name: str


NetAccess = str | Proxied
"""A call's network: "none", "all", or `Proxied`."""


def access(setting: NetworkSetting, run_dir: Path, kind: str, name: str) -> NetAccess:
    """The network of a call by agent (`kind` "agent") or MCP server ("mcp") `name`
    whose setting is `setting`; the proxy's sockets are in `run_dir/net`."""
    if setting in (NONE, ALL):
        return str(setting)
    return Proxied(str(run_dir / "net"), socket_name(kind, name))


def proxy_env() -> dict[str, str]:
    """What the tool's environment says about the proxy. ALL_PROXY stays unset: the
    proxy speaks HTTP only, and many clients read ALL_PROXY as a SOCKS address; a
    client that ignores these fails to connect (no route), never gets through."""
    env = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY"):
        env[name] = env[name.lower()] = PROXY_URL
    env["NO_PROXY"] = env["no_proxy"] = ""
    return env


def apply_network(spec: dict[str, Any], net: Proxied, policy: Policy) -> None:
    """Change the spec of an offline command launch (private network namespace, no
    socket) so the command reaches the proxy and nothing else: the forwarder, the
    proxy's variables, seccomp allowing TCP sockets only, Landlock TCP connect to the
    forwarder's port only (where the kernel has Landlock ABI >= 4)."""
    spec["netbridge"] = {"dir": net.socket_dir, "name": net.socket_name, "port": PORT}
    spec["env"] = {**spec["env"], **proxy_env()}
    if spec.get("seccomp"):
        spec["seccomp"] = seccomp.build(network=False, unix=policy.unix_sockets, proxied=True)
    landlock = spec.get("landlock")
    if landlock:
        landlock["tcp_connect"] = [PORT]


def network_policy(tool: str, policy: Policy, net: NetAccess, op: object) -> Policy:
    """The policy a command runs under given its network: "all" opens the host's
    network; a `Proxied` one starts from the offline policy (`apply_network` then adds
    the way to the proxy), and needs the launcher's own namespaces."""
    if op is not None or net == "none":
        return policy
    if net == "all":
        return policy.lowered(network="host")
    if policy.backend == "bwrap":
        raise ToolRefused(f"{tool}: refused: a network allowlist needs the launcher "
                          f"backend (backend = \"launcher\" in sandbox.toml): bubblewrap "
                          f"gives no way to the network proxy")
    return policy.lowered(network="none")
