"""`python -m actors.host`: run a host in `$OPLOOP_HOME` until SIGTERM."""

import sys

# The host starts its actors and waits on them: it speaks no TLS. Without this,
# importing asyncio loads `ssl` and OpenSSL's libssl (~4 MB resident) for nothing;
# asyncio runs without it. (A foreground `oploop up` runs the host in the CLI's
# process instead, which keeps its ssl.)
sys.modules.setdefault("ssl", None)  # type: ignore[assignment]

from actors.host.actor import main  # noqa: E402 - after the line above, on purpose

main()
