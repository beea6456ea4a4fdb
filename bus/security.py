"""CURVE for endpoints that leave the machine: the keys, and who may connect where.

Over `ipc://` the runtime dir's permissions (0700, sockets 0600) decide who may
connect. Once a host also listens on TCP, every public socket is a CURVE server
and a ZAP handler (`Gate`) admits a client only if its public key is authorised
for that socket's *domain*:

    domain   sockets         admits keys of role
    api      api             control, peer
    control  control         control, worker, peer
    work     work            worker
    view     events, replay  control, viewer, peer

So a viewer's key can watch and replay, never start or cancel; a worker's key
cannot start runs. The other hosts of a shared store (`Keyring.hosts`: their keys as
the store publishes them, set by the actor that reads it) are admitted to `control`
(forwarded requests) and `view` (following live events) only, as role `host`.
A peer's key (another host asking this one's agent, `ask_machine`) is admitted like
a control key, and the supervisor narrows what it may ask: new runs only, on the one
agent this host bound the key to when it issued it (`peer_agent`), in no directory of
its choosing, under this host's rules. The host's own actors and the local CLI use
the local key, admitted everywhere (reading it needs this user's file permissions).

The keys live in `$OPLOOP_HOME/keys` (0700), made at the first `oploop up` with
CURVE on (or the first `oploop keys`):

    server.key, server.key_secret     the host's keypair (secret never leaves it)
    client.key, client.key_secret     the local key
    authorized/<role>/<name>.key      public keys admitted per role; read again
                                      when the folder changes (a revoked key is
                                      refused at its next handshake)
    peer-agents/<name>                the one agent peer key <name> may start runs
                                      on (`--agent`; default: the default agent)
    issued/<name>/                    a key made by `oploop keys add`: copy the
                                      folder to the remote machine as `OPLOOP_KEYS`

A folder usable as `OPLOOP_KEYS` (the home's `keys`, or an issued one) holds
`server.key` and `client.key_secret`: what a connecting side needs.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bus.errors import BusError

# pyzmq is imported where keys are made or checked, not here: the host process,
# which only makes sure the keys exist, then never loads libzmq (~4 MiB of RSS).
if TYPE_CHECKING:
    import zmq

log = logging.getLogger("oploop.security")

ROLES = ("control", "worker", "viewer", "peer")

#: The role of another host of this host's shared store (its key read from the store,
#: never a file here), and the domains it is admitted to: what a host of the store
#: needs of another (sending on a request for a session the other runs; following
#: its live events), nothing more.
HOST = "host"
HOST_DOMAINS = frozenset({"control", "view"})

#: The ZAP domain of each public endpoint.
DOMAIN_OF = {"api": "api", "control": "control", "work": "work",
             "events": "view", "replay": "view"}

#: Which key roles each domain admits.
ADMITS = {"api": ("control", "peer"), "control": ("control", "worker", "peer"),
          "work": ("worker",), "view": ("control", "viewer", "peer")}

#: The folder (in the keys folder) saying which agent each peer key may use.
PEER_AGENTS = "peer-agents"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class CredentialError(BusError):
    """Keys that cannot be used: missing, unreadable, open to others, or a bad name."""


@dataclass(frozen=True, slots=True)
class ClientKeys:
    """What a connecting side needs: its own keypair and the server's public key (z85)."""

    public: bytes
    secret: bytes
    server_public: bytes

    @classmethod
    def load(cls, folder: Path) -> ClientKeys:
        """The keys of an `OPLOOP_KEYS` folder (`server.key`, `client.key_secret`)."""
        server, _ = _load(folder / "server.key")
        public, secret = _load(folder / "client.key_secret")
        if secret is None:
            raise CredentialError(f"{folder / 'client.key_secret'} holds no secret key")
        return cls(public, secret, server)

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make `sock` a CURVE client of the server (before it connects)."""
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


@dataclass(frozen=True, slots=True)
class ServerKeys:
    """The host's keypair, applied to each public socket with its ZAP domain."""

    public: bytes
    secret: bytes

    def apply(self, sock: zmq.Socket[Any], endpoint: str) -> None:
        """Make `sock` a CURVE server whose clients `Gate` checks for `endpoint`'s domain."""
        sock.curve_server = True
        sock.curve_secretkey = self.secret
        sock.zap_domain = DOMAIN_OF[endpoint].encode()


class Keyring:
    """The key folder of one host: create, issue, revoke, and check keys."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()  # the Gate's thread reads while the actor runs
        self._cache: dict[str, tuple[tuple[tuple[str, int], ...], frozenset[bytes]]] = {}
        #: The file name (without .key) of each authorised public key (z85): its name.
        self._names: dict[bytes, str] = {}
        self._local: bytes | None = None
        #: The other hosts of the shared store: public key (z85) -> host id. Replaced
        #: whole (never changed in place) by the actor reading the store; the ZAP thread
        #: reads it.
        self.hosts: dict[bytes, str] = {}

    @classmethod
    def for_home(cls, home: Path) -> Keyring:
        """The keyring in `home/keys`."""
        return cls(home / "keys")

    # -- making keys -------------------------------------------------------------------

    def ensure(self) -> None:
        """Create the folder (0700), the server and local keypairs if missing; refuse a
        folder another user owns, and close one others could enter (chmod 0700)."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = self.folder.stat()
        if st.st_uid != os.getuid():
            raise CredentialError(f"{self.folder} is owned by uid {st.st_uid}")
        os.chmod(self.folder, 0o700)
        for sub in ("authorized", *(f"authorized/{role}" for role in ROLES), "issued"):
            (self.folder / sub).mkdir(mode=0o700, exist_ok=True)
        for name in ("server", "client"):
            if not (self.folder / f"{name}.key_secret").exists():
                _create(self.folder, name)

    def server(self) -> ServerKeys:
        """The host's keypair."""
        public, secret = _load(self.folder / "server.key_secret")
        if secret is None:
            raise CredentialError(f"{self.folder / 'server.key_secret'} holds no secret key")
        return ServerKeys(public, secret)

    def local(self) -> ClientKeys:
        """The local key, as a client uses it."""
        return ClientKeys.load(self.folder)

    def issue(self, name: str, role: str, agent: str = "") -> Path:
        """Make a keypair `name` for `role`, authorise it, and return the folder to copy
        to the remote machine (its `OPLOOP_KEYS`). A peer key starts runs on `agent`
        only (empty: this host's default agent; `peer_agent`)."""
        if role not in ROLES:
            raise CredentialError(f"role {role!r}: expected one of {', '.join(ROLES)}")
        _check_name(name)
        if agent and role != "peer":
            raise CredentialError("--agent: only a peer key is bound to an agent")
        if agent and not _NAME.fullmatch(agent):
            raise CredentialError(f"agent name {agent!r}: letters, digits, '_', '.', '-'")
        if self.role_of(name) is not None:
            raise CredentialError(f"a key named {name!r} exists already (revoke it first)")
        out = self.folder / "issued" / name
        out.mkdir(mode=0o700)
        _create(out, "client")
        # shutil here, not at the top: the supervisor loads this module to read its keys
        # and never issues one (`oploop keys`); shutil loads bz2 and lzma (~0.45 MiB).
        import shutil

        shutil.copyfile(self.folder / "server.key", out / "server.key")
        if role == "peer":  # before the key is admitted: never a moment without it
            agents = self.folder / PEER_AGENTS
            agents.mkdir(mode=0o700, exist_ok=True)
            (agents / name).write_text((agent or "default") + "\n")
        authorised = self.folder / "authorized" / role / f"{name}.key"
        shutil.copyfile(out / "client.key", authorised)
        os.chmod(authorised, 0o600)
        return out

    def peer_agent(self, name: str) -> str:
        """The agent peer key `name` may start runs on: named when it was issued
        (`oploop keys add NAME --role peer --agent AGENT`), else this host's default
        agent ("default")."""
        try:
            _check_name(name)
            agent = (self.folder / PEER_AGENTS / name).read_text().strip()
        except (CredentialError, OSError):
            return "default"
        return agent or "default"

    def revoke(self, name: str) -> bool:
        """Withdraw key `name` (from every role) and delete its issued folder.

        Connections already made with it stay up (CURVE checks a key at the
        handshake): restart the host to cut them too."""
        _check_name(name)
        found = False
        for role in ROLES:
            path = self.folder / "authorized" / role / f"{name}.key"
            if path.exists():
                path.unlink()
                found = True
        (self.folder / PEER_AGENTS / name).unlink(missing_ok=True)
        issued = self.folder / "issued" / name
        if issued.is_dir():
            import shutil  # (here, as in `issue`)

            shutil.rmtree(issued)
            found = True
        return found

    def role_of(self, name: str) -> str | None:
        """The role key `name` is authorised for, or None."""
        _check_name(name)
        for role in ROLES:
            if (self.folder / "authorized" / role / f"{name}.key").exists():
                return role
        return None

    def names(self) -> dict[str, list[str]]:
        """Authorised key names by role."""
        out = {}
        for role in ROLES:
            folder = self.folder / "authorized" / role
            out[role] = sorted(p.stem for p in folder.glob("*.key")) if folder.is_dir() else []
        return out

    # -- checking keys -----------------------------------------------------------------

    def admits(self, domain: str, key: bytes) -> bool:
        """Whether public key `key` (z85) may connect to sockets of `domain`."""
        if key == self._local_key():
            return True
        if domain in HOST_DOMAINS and key in self.hosts:
            return True
        return any(key in self._authorised(role) for role in ADMITS.get(domain, ()))

    def role_of_key(self, key: bytes) -> str:
        """The role of an admitted public key (raw or z85) and its name, as `ROLE:NAME`
        ("control:alice": who decided an approval names the key); `host:ID` for another
        host of the shared store; "local" for the local key, "unknown" when it cannot be
        told (it runs on the ZAP thread: never raises)."""
        from zmq.utils import z85 as codec

        try:
            z85 = key if len(key) == 40 else codec.encode(key)
            if z85 == self._local_key():
                return "local"
            host = self.hosts.get(z85)
            if host is not None:
                return f"{HOST}:{host}"
            role = next((r for r in ROLES if z85 in self._authorised(r)), "unknown")
            name = self._names.get(z85, "")
            return f"{role}:{name}" if name and role != "unknown" else role
        except Exception:  # a ZAP edge: an exception here would end the ZAP thread
            log.exception("cannot tell the role of an admitted key")
            return "unknown"

    def _local_key(self) -> bytes:
        if self._local is None:
            self._local = _load(self.folder / "client.key")[0]
        return self._local

    def _authorised(self, role: str) -> frozenset[bytes]:
        """The public keys of `role`, re-read only when its folder's listing changed
        (names and inodes: a folder's mtime may not tick between two quick changes)."""
        folder = self.folder / "authorized" / role
        try:
            with os.scandir(folder) as entries:
                listing = tuple(sorted((e.name, e.inode()) for e in entries))
        except OSError:
            return frozenset()
        with self._lock:
            cached = self._cache.get(role)
            if cached is not None and cached[0] == listing:
                return cached[1]
            import zmq.auth

            found = zmq.auth.load_certificates(folder)
            keys = frozenset(found)
            for name, _ in listing:  # which file each key came from: its name
                if name.endswith(".key"):
                    try:
                        public = _load(folder / name)[0]
                    except Exception:  # (a half-written file: named on the next read)
                        continue
                    self._names[public] = name.removesuffix(".key")
            self._cache[role] = (listing, keys)
            return keys


class Gate:
    """The ZAP handler of one actor's context: admits CURVE clients per domain by the
    `Keyring`, counting what it allows and denies (`statistics()`).

    It runs on its own thread (pyzmq's `ThreadAuthenticator`), so a busy actor
    loop never delays a handshake. Start it before binding a CURVE socket: with
    no ZAP handler, libzmq admits every client.
    """

    def __init__(self, keyring: Keyring, ctx: zmq.Context[Any]) -> None:
        self.keyring = keyring
        self.counts: Counter[str] = Counter()
        from zmq.auth.thread import ThreadAuthenticator

        # ZAP is per context: the handler must serve the very context the CURVE
        # sockets live in, or libzmq finds none there and admits every client.
        self.context = ctx
        self._auth = ThreadAuthenticator(ctx, log=log)
        # The User-Id each admitted connection's messages carry: its key's role.
        self._auth.curve_user_id = self.keyring.role_of_key

    def start(self) -> None:
        """Serve ZAP requests for every domain."""
        self._auth.start()
        for domain in ADMITS:
            self._auth.configure_curve_callback(domain, credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP's question, from the authenticator's thread: may `key` use `domain`?"""
        try:
            allowed = self.keyring.admits(domain, key)
        except Exception:  # a ZAP edge: an unreadable key file denies, never crashes
            log.exception("cannot check a key for domain %s", domain)
            allowed = False
        self.counts[f"{domain}.{'allowed' if allowed else 'denied'}"] += 1
        if not allowed:
            log.warning("denied a CURVE client on %s: key %s is not authorised",
                        domain, key.decode(errors="replace"))
        return allowed

    def statistics(self) -> dict[str, int]:
        """Handshakes allowed and denied, by domain."""
        return dict(self.counts)

    def stop(self) -> None:
        """Stop serving ZAP requests."""
        self._auth.stop()


def _check_name(name: str) -> None:
    """Refuse a key name that is not a plain file name of ours (no `/`, no `..`)."""
    if not _NAME.fullmatch(name) or name in ("server", "client"):
        raise CredentialError(f"key name {name!r}: letters, digits, '_', '.', '-' (not "
                              "'server' or 'client')")


def _create(folder: Path, name: str) -> None:
    """A new keypair as `name.key` (0644: public) and `name.key_secret` (0600)."""
    import zmq.auth

    old = os.umask(0o077)  # the secret is never readable by others, not even briefly
    try:
        public, secret = zmq.auth.create_certificates(folder, name)
    finally:
        os.umask(old)
    os.chmod(public, 0o644)


def _load(path: Path) -> tuple[bytes, bytes | None]:
    """(public, secret) of a key file; refuses a secret file others can read."""
    import zmq.auth

    try:
        public, secret = zmq.auth.load_certificate(path)
        mode = stat.S_IMODE(path.stat().st_mode)
    except (OSError, ValueError) as exc:
        raise CredentialError(f"cannot read key {path}: {exc}") from exc
    if secret is not None and mode & 0o077:
        raise CredentialError(f"{path} holds a secret key but is open to others (mode {mode:o}); "
                        "chmod 600 it")
    return public, secret
