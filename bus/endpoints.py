"""Where sockets live: a private runtime directory of `ipc://` endpoints.

The runtime dir is `$OPLOOP_HOME/run` (mode 0700, so only this user can reach
the sockets); each endpoint is a socket file in it (mode 0600 once bound).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

#: The sockets of a host, by name (see `bus.messages` for who binds what).
ENDPOINT_NAMES = ("api", "control", "work", "ingest", "events", "replay")

# sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_IPC_PATH = 107


class EndpointError(Exception):
    """The runtime dir cannot be used (path too long, wrong owner or mode)."""


def oploop_home() -> Path:
    """`$OPLOOP_HOME`, default `~/.oploop`."""
    return Path(os.environ.get("OPLOOP_HOME") or Path.home() / ".oploop").absolute()


@dataclass(frozen=True, slots=True)
class Endpoints:
    """The endpoint addresses of one host, derived from its runtime dir."""

    run_dir: Path

    @classmethod
    def for_home(cls, home: Path | None = None) -> Endpoints:
        """Endpoints of the host whose home is `home` (default `oploop_home()`)."""
        return cls((home or oploop_home()) / "run")

    def path(self, name: str) -> Path:
        """The socket file of endpoint `name`."""
        if name not in ENDPOINT_NAMES:
            raise KeyError(name)
        return self.run_dir / f"{name}.sock"

    def address(self, name: str) -> str:
        """The zmq address of endpoint `name`."""
        return f"ipc://{self.path(name)}"

    def socket_files(self) -> list[Path]:
        """Socket files present in the runtime dir now."""
        return [self.path(n) for n in ENDPOINT_NAMES if self.path(n).exists()]

    def prepare(self) -> None:
        """Create the runtime dir 0700 (or check an existing one) for binding.

        Refuses a dir owned by someone else or open to others, and paths too
        long for a unix socket address.
        """
        longest = max(len(str(self.path(n))) for n in ENDPOINT_NAMES)
        if longest > _MAX_IPC_PATH:
            raise EndpointError(
                f"runtime dir {self.run_dir} is too deep for unix sockets "
                f"({longest} > {_MAX_IPC_PATH} bytes); set OPLOOP_HOME to a shorter path"
            )
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = self.run_dir.stat()
        if st.st_uid != os.getuid():
            raise EndpointError(f"runtime dir {self.run_dir} is owned by uid {st.st_uid}")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(self.run_dir, 0o700)

    def remove_stale(self) -> list[Path]:
        """Delete socket files left by a host that died; returns what was removed."""
        removed = []
        for p in self.socket_files():
            p.unlink(missing_ok=True)
            removed.append(p)
        return removed
