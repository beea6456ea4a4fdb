"""`oploop mcp login NAME`: authorize oploop for an HTTP MCP server that wants OAuth
(`actors.mcp.oauth`). No host is needed: the tokens go to the home, where the
executors read them at their next connection."""

from __future__ import annotations

import argparse
import sys

from actors.cli.errors import EXIT_OK, fail
from actors.settings import Settings


async def login(args: argparse.Namespace, settings: Settings) -> int:
    """Print the authorization URL, take the browser's redirect, keep the tokens."""
    config = settings.config.mcp.get(args.name)
    if config is None:
        known = ", ".join(settings.config.mcp) or "none"
        return fail(f"no MCP server {args.name!r} in oploop.toml (configured: {known})")
    if not config.url:
        return fail(f"MCP server {args.name} is a stdio server: only HTTP servers log in")
    from actors.mcp.oauth import LoginNeeded, token_path, uses_oauth
    from actors.mcp.oauth import login as run_login

    if not uses_oauth(config):
        return fail(f"MCP server {args.name} sends an Authorization header of its own "
                    f"(headers in oploop.toml): remove it to use OAuth")

    def say(url: str) -> None:
        print(f"Open this URL in a browser to authorize oploop for {args.name}:\n{url}",
              flush=True)

    try:
        tools = await run_login(config, settings.home, say, args.timeout)
    except LoginNeeded as exc:
        return fail(str(exc))
    except Exception as exc:  # the SDK's OAuth and HTTP errors, said in one line
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        return fail(f"login to {args.name} failed: {type(exc).__name__}: {exc}")
    print(f"oploop: logged in to {args.name} ({tools} tools); tokens in "
          f"{token_path(settings.home, args.name)}", file=sys.stderr)
    return EXIT_OK
