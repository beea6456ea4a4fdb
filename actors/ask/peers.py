"""`[peers.NAME]`: the other hosts this one may ask (`ask_machine`), checked at start.

    [peers.b]
    connect = "tcp://10.0.0.2:7400"   # the other host's [network] listen
    keys = "keys/b"                   # a folder `oploop keys add A --role peer` made on b
    agent = "ops"                     # b's agent to ask (default: b's default agent);
                                      # b answers only for the agent it bound the key to
                                      # (oploop keys add A --role peer --agent ops)
    timeout_s = 600                   # an ask that has not ended by then is cancelled

`keys` is relative to the configuration file's folder (or absolute, or `~/...`).
A mistake stops `oploop up` naming the key, e.g. `peers.b.keys: no server.key in ...`.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bus.endpoints import EndpointError, Network

#: A peer's name: what the model passes as `machine` and what viewers see in `[NAME]`.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

_KEYS = frozenset({"connect", "keys", "agent", "timeout_s"})


class PeerConfigError(ValueError):
    """A `[peers]` table that cannot be used; the message names the key."""


@dataclass(frozen=True, slots=True)
class Peer:
    """Another host this one may ask: where it listens, the key it issued us, its agent."""

    name: str
    connect: str
    #: The key folder (`server.key`, `client.key_secret`); None: plain TCP (loopback).
    keys: Path | None
    agent: str = ""
    timeout_s: float = 600.0


def parse_peers(raw: Any, base: Path | None) -> dict[str, Peer]:
    """Check the `[peers]` table; `base` is the folder relative `keys` paths start from."""
    if not isinstance(raw, Mapping):
        raise PeerConfigError(f"peers: expected a table, got {type(raw).__name__}")
    peers = {}
    for name, table in raw.items():
        where = f"peers.{name}"
        if not _NAME.fullmatch(str(name)):
            raise PeerConfigError(f"{where}: a peer's name is letters, digits, '_', '.', '-'")
        if not isinstance(table, Mapping):
            raise PeerConfigError(f"{where}: expected a table, got {type(table).__name__}")
        extra = sorted(set(table) - _KEYS)
        if extra:
            raise PeerConfigError(f"{where}.{extra[0]}: unknown key (known: "
                                  f"{', '.join(sorted(_KEYS))})")
        peers[name] = _peer(name, table, base)
    return peers


def _peer(name: str, table: Mapping[str, Any], base: Path | None) -> Peer:
    where = f"peers.{name}"
    connect = table.get("connect")
    if not isinstance(connect, str):
        raise PeerConfigError(f"{where}.connect: required, a string tcp://HOST:PORT")
    raw_keys = table.get("keys", "")
    if not isinstance(raw_keys, str):
        raise PeerConfigError(f"{where}.keys: expected a string (a folder), "
                              f"got {type(raw_keys).__name__}")
    keys = _keys_folder(raw_keys, base, f"{where}.keys") if raw_keys else None
    try:
        Network.parse(connect, curve=keys is not None)
    except EndpointError as exc:
        hint = " (without keys, only a loopback address)" if keys is None else ""
        raise PeerConfigError(f"{where}.connect: {exc}{hint}") from None
    agent = table.get("agent", "")
    if not isinstance(agent, str):
        raise PeerConfigError(f"{where}.agent: expected a string, got {type(agent).__name__}")
    timeout = table.get("timeout_s", 600.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise PeerConfigError(f"{where}.timeout_s: expected a number of seconds > 0, "
                              f"got {timeout!r}")
    return Peer(name, connect, keys, agent, float(timeout))


def _keys_folder(raw: str, base: Path | None, where: str) -> Path:
    """The key folder, checked the way the client will use it (without loading libzmq,
    which the host process never does): both files there, the secret closed to others."""
    folder = Path(raw).expanduser()
    if not folder.is_absolute():
        folder = (base or Path.cwd()) / folder
    if not folder.is_dir():
        raise PeerConfigError(f"{where}: no such folder {str(folder)!r} (copy there the "
                              "folder `oploop keys add NAME --role peer` made on that host)")
    for file in ("server.key", "client.key_secret"):
        path = folder / file
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
            with open(path, "rb") as f:
                text = f.read(64 * 1024)
        except OSError as exc:
            raise PeerConfigError(f"{where}: cannot read {path}: "
                                  f"{exc.strerror or exc}") from None
        if b"public-key" not in text:
            raise PeerConfigError(f"{where}: {path} is not a key file")
        if file.endswith("_secret"):
            if b"secret-key" not in text:
                raise PeerConfigError(f"{where}: {path} holds no secret key")
            if mode & 0o077:
                raise PeerConfigError(f"{where}: {path} is open to others (mode {mode:o}); "
                                      "chmod 600 it")
    return folder


def describe(peers: Mapping[str, Peer]) -> str:
    """The configured peers for an error message: "a, b" or "none"."""
    return ", ".join(sorted(peers)) or "none"


__all__ = ["Peer", "PeerConfigError", "describe", "parse_peers"]
