"""Hear another host hand its sessions over: LISTEN on the store's hand-over channel.

A host stopping gracefully expires its leases and NOTIFYs `pgleases.HANDOVER_CHANNEL`
(`Ownership.hand_over`). Every claiming host listens there on a connection of its own,
in a daemon thread (psycopg's `notifies` blocks), and wakes its renewal loop at once:
the sessions are claimed and `RESUMED` in a fraction of a second instead of at the
next claim (up to `RENEW_EVERY_S` later). A notification missed (the listening
connection lost, the store restarting) costs only that: the next claim takes them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from actors.pgleases import HANDOVER_CHANNEL
from actors.sessionlog import JournalError

log = logging.getLogger("oploop.handovers")

#: How often the listening thread looks whether it should stop (seconds).
POLL_S = 0.5
#: How long it waits before connecting again after losing its connection.
RECONNECT_S = 1.0


class HandoverListener:
    """A daemon thread calling `heard()` on the loop at every hand-over NOTIFY."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]],
                 loop: asyncio.AbstractEventLoop, heard: Callable[[], None]) -> None:
        self._connect = connect
        self._loop = loop
        self._heard = heard
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="handovers", daemon=True)

    def start(self) -> None:
        """Start listening."""
        self._thread.start()

    def stop(self) -> None:
        """Stop listening (the thread ends within `POLL_S`; nobody waits for it)."""
        self._stop.set()

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                with self._connect() as conn:
                    conn.execute(f"LISTEN {HANDOVER_CHANNEL}")
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=POLL_S, stop_after=1):
                            self._wake()
            except (psycopg.Error, JournalError) as exc:
                log.info("hand-over listener: %s (again in %.0f s)", exc, RECONNECT_S)
                self._stop.wait(RECONNECT_S)

    def _wake(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._heard)
        except RuntimeError:  # (the loop closed: the supervisor is stopping)
            self._stop.set()
