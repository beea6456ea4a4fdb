"""Helpers of the ask_machine tests: hosts on their own loopback addresses (or in a
network namespace of their own), peer keys issued by one for another, scripts."""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hostkit import oploop, running_host
from ports import free_ports


def tool_use(name: str, **input: Any) -> dict[str, Any]:
    """A scripted model's tool call."""
    return {"type": "tool_use", "name": name, "input": input}


def ask(machine: str, prompt: str) -> dict[str, Any]:
    """A scripted `ask_machine` call."""
    return tool_use("ask_machine", machine=machine, prompt=prompt)


def write_home(home: str, scripts: dict[str, Any], config: str) -> dict[str, str]:
    """Write `home`'s scenario and oploop.toml; the host's environment."""
    scenario = Path(home, "scenario.json")
    scenario.write_text(json.dumps({"scripts": scripts}))
    Path(home, "oploop.toml").write_text(config)
    return {"OPLOOP_OFFLINE_SCENARIO": str(scenario), "OPLOOP_EXECUTORS": "1"}


def issue_peer_key(home: str, name: str, agent: str = "") -> Path:
    """`oploop keys add NAME --role peer [--agent AGENT]` on the host in `home`: the
    folder to give (the key starts runs on that agent only; default: the default one)."""
    out = oploop(home, "keys", "add", name, "--role", "peer",
                 *(("--agent", agent) if agent else ()))
    assert out.returncode == 0, out.stderr
    return Path(home) / "keys" / "issued" / name


def network_config(listen: str) -> str:
    """A host listening on TCP with CURVE."""
    return f'[network]\nlisten = "{listen}"\n'


def peer_config(name: str, listen: str, keys: Path, agent: str = "",
                timeout_s: float = 0) -> str:
    """One `[peers.NAME]` table."""
    extra = f'agent = "{agent}"\n' if agent else ""
    extra += f"timeout_s = {timeout_s}\n" if timeout_s else ""
    return f'\n[peers.{name}]\nconnect = "{listen}"\nkeys = "{keys}"\n{extra}'


def ip(*args: str) -> None:
    """Run `ip ARGS` (namespaces need root); raises on failure."""
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def namespaces_usable() -> str:
    """"" when this process may make network namespaces and veth pairs, else why not."""
    probe = f"opk{secrets.token_hex(3)}"
    try:
        ip("netns", "add", probe)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot make a network namespace here ({exc})"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        ip("netns", "del", probe)
    return ""


class Namespace:
    """A network namespace joined to this one by a veth pair: the host inside is
    reached at `inner`; `cut()` / `mend()` take the link down and up."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.name, self.outer_if, self.inner_if = f"opk{tag}", f"opo{tag}", f"opi{tag}"
        subnet = int(tag[:2], 16) % 250 + 1
        self.outer, self.inner = f"10.213.{subnet}.1", f"10.213.{subnet}.2"

    def __enter__(self) -> Namespace:
        ip("netns", "add", self.name)
        try:
            ip("link", "add", self.outer_if, "type", "veth", "peer", "name", self.inner_if)
            ip("link", "set", self.inner_if, "netns", self.name)
            ip("addr", "add", f"{self.outer}/30", "dev", self.outer_if)
            ip("link", "set", self.outer_if, "up")
            self.exec_ip("addr", "add", f"{self.inner}/30", "dev", self.inner_if)
            self.exec_ip("link", "set", self.inner_if, "up")
            self.exec_ip("link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def exec_ip(self, *args: str) -> None:
        """`ip ARGS` inside the namespace."""
        ip("netns", "exec", self.name, "ip", *args)

    def cut(self) -> None:
        """The link goes silent: its far end (inside) goes down, so both ends lose
        carrier and what is sent to `inner` is dropped, with no RST and no ICMP.

        Not the near end: taking `outer_if` down deletes this namespace's route to
        `inner`, so packets for it take the default route off the box instead, and
        what answers there depends on the box (a sandbox's egress proxy answered any
        port outside 32768..60999 with "HTTP/1.1 400" and refused the rest), not on
        the link (`bench.netlink.Lab.cut` takes the machine's end down too)."""
        self.exec_ip("link", "set", self.inner_if, "down")

    def mend(self) -> None:
        """The link comes back."""
        self.exec_ip("link", "set", self.inner_if, "up")

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            ip("link", "del", self.outer_if)  # (deletes its peer too)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            ip("netns", "del", self.name)

    def oploop(self, home: str, *args: str, env: dict[str, str] | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """The CLI run inside the namespace (a host started so lives there). Through
        nsenter, which enters the network namespace alone: `ip netns exec` also mounts
        a /sys of its own, without the cgroup file system the sandbox needs."""
        return oploop(home, *args, env=env, timeout=timeout,
                      prefix=("nsenter", f"--net=/run/netns/{self.name}"))


@contextlib.contextmanager
def host_in(ns: Namespace, home: str, env: dict[str, str]) -> Iterator[str]:
    """A host started inside `ns` (its actors inherit the namespace); stopped over ipc."""
    import hostkit

    up = ns.oploop(home, "up", "--detach", env=env)
    assert up.returncode == 0, up.stderr + up.stdout
    pids = hostkit.host_pids(home)
    try:
        yield home
    finally:
        down = oploop(home, "down")
        assert down.returncode == 0, down.stderr
        import psutil

        alive = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"processes left after down: {alive}"


__all__ = ["Namespace", "ask", "free_ports", "host_in", "issue_peer_key", "namespaces_usable",
           "network_config", "peer_config", "running_host", "tool_use", "write_home"]
