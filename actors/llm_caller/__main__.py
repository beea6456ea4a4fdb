"""`python -m actors.llm_caller`: run one llm caller."""

import sys

# The `anthropic` SDK imports aiohttp when it is installed (the gateway's), for an
# optional transport (`DefaultAioHttpClient`) this caller never uses: it calls through
# httpx (`backend.AnthropicBackend`). Kept out, the SDK falls back as without it: ~8 MB less.
sys.modules.setdefault("aiohttp", None)  # type: ignore[assignment]
# Nor does a caller load `ssl` and OpenSSL (~4.5 MiB resident) at start: the SDK does TLS
# itself (httpx through anyio, over the loop's plain connections) and lets it in at its
# import (`AnthropicBackend.sdk_client`); a caller on the scripted model never loads it.
# uvloop gets stand-ins for the names of `ssl` it reads (actors/nossl.py).
sys.modules.setdefault("ssl", None)  # type: ignore[assignment]

from actors.llm_caller.actor import main  # noqa: E402 - after the line above, on purpose

main()
