"""`python -m actors.supervisor`: run the supervisor."""

import sys

# The supervisor opens no TLS connection (its peers speak zmq, with CURVE across
# machines): without this, importing asyncio and uvloop loads `ssl` and OpenSSL
# (~4.5 MiB resident) for nothing. uvloop gets stand-ins (actors/nossl.py).
sys.modules.setdefault("ssl", None)  # type: ignore[assignment]

from actors.supervisor.actor import main  # noqa: E402 - after the line above, on purpose

main()
