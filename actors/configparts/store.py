"""The `[store]` table of `oploop.toml`: where the session log is.

    [store]
    url = "postgresql://oploop@db.example/oploop"  # "" (default): $OPLOOP_HOME/sessions.db
    lease_s = 5                                     # a host's hold on its running sessions

`OPLOOP_STORE` overrides `url` (`actors.settings`). Every host given the same
PostgreSQL URL shares one store (docs/sessions.md: leases and failover).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .checks import ConfigError, as_table, checked, no_unknown

#: URL schemes a store may have (libpq's two spellings of PostgreSQL).
STORE_SCHEMES = ("postgresql://", "postgres://")
#: Bounds of `lease_s`: renewed every second, a lease must outlast a few renewals.
MIN_LEASE_S = 2.0
MAX_LEASE_S = 600.0


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Where the session log is: "" for the SQLite file in the home, else PostgreSQL."""

    url: str = ""
    #: How long a host's hold on its running sessions lasts without renewal (it renews
    #: every second): a dead host's sessions are taken over this long after it stopped.
    lease_s: float = 5.0


def check_store_url(url: str, name: str) -> str:
    """`url` if it names a store oploop can use; `ConfigError` naming `name` otherwise."""
    url = url.strip()
    if url and not url.startswith(STORE_SCHEMES):
        raise ConfigError(f"{name}: expected a postgresql:// URL (or empty for the SQLite "
                          f"file in $OPLOOP_HOME), got {url.split(':', 1)[0]!r}")
    return url


def parse_store(raw: Any, source: str) -> StoreConfig:
    """`[store]`: `url` and `lease_s`."""
    table = as_table(raw, source, "store")
    no_unknown(table, {"url", "lease_s"}, source, "store")
    url = check_store_url(checked(str, table.get("url", ""), source, "store.url"),
                          f"{source}: store.url")
    lease = checked(float, table.get("lease_s", StoreConfig().lease_s), source, "store.lease_s")
    if not MIN_LEASE_S <= lease <= MAX_LEASE_S:
        raise ConfigError(f"{source}: store.lease_s: must be within "
                          f"{MIN_LEASE_S:g}..{MAX_LEASE_S:g} seconds")
    return StoreConfig(url, lease)
