"""`python -m actors.broadcaster`: run the broadcaster."""

import sys

# The broadcaster speaks no TLS (zmq's CURVE, and libpq's own OpenSSL for a PostgreSQL
# store): without this, importing asyncio loads `ssl` (~4.5 MB resident) for nothing.
sys.modules.setdefault("ssl", None)  # type: ignore[assignment]

from actors.broadcaster.actor import main  # noqa: E402 - after the line above, on purpose

main()
