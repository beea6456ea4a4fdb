"""Run the offline model: `python -m actors.offline_model --port-file FILE`."""

import sys

# The offline model serves plain HTTP on the host's loopback: without this, importing
# asyncio and uvloop loads `ssl` and OpenSSL (~4.5 MiB resident) for nothing (uvloop gets
# stand-ins: actors/nossl.py).
sys.modules.setdefault("ssl", None)  # type: ignore[assignment]

from actors.offline_model.cli import main  # noqa: E402 - after the line above, on purpose

sys.exit(main())
