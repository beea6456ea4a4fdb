"""`python -m actors.executor`: run one tool executor."""

import sys

# An executor speaks no TLS (its tools run in sandboxed children): without this,
# importing asyncio loads `ssl` and OpenSSL's libssl (~4 MB resident) for nothing.
sys.modules.setdefault("ssl", None)  # type: ignore[assignment]

from actors.executor.actor import main  # noqa: E402 - after the line above, on purpose

main()
