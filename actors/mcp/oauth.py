"""OAuth 2.1 for HTTP servers, with the SDK's client (`mcp.client.auth`).

`oploop mcp login NAME` (`login`) runs the authorization-code grant with PKCE as the
SDK's `OAuthClientProvider` does it: protected-resource and authorization-server
metadata discovery, dynamic client registration, the authorization URL (printed, to
open in a browser), the redirect taken on a loopback port (`127.0.0.1:PORT/callback`,
the same port as the registration's when it is free, else a new one and a new
registration), the code exchanged for tokens. The tokens and the client's
registration are kept in `$OPLOOP_HOME/mcp-auth/NAME.json` (0600, its folder 0700;
`TokenFile`).

An executor reaches an HTTP server with no `Authorization` header of its own through
the same provider over that file (`auth_for`): the access token is sent, refreshed
with the refresh token when it expires (the new tokens written back; one process at
a time, `Provider`), and when the server wants a new authorization the call fails
saying to run `oploop mcp login NAME` (an executor has no browser).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
from mcp.client.auth import OAuthClientProvider
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)

from .config import McpServerConfig

#: Where the tokens are kept, in the home.
FOLDER = "mcp-auth"
#: The loopback redirect's path.
CALLBACK = "/callback"
#: How long `login` waits for the browser's redirect.
LOGIN_WAIT_S = 300.0
#: An access token is refreshed this share of its life before it expires, at most
#: `EARLY_S` before (the server's clock, the request's way to it).
EARLY = 0.1
EARLY_S = 30.0


class LoginNeeded(Exception):
    """The server wants an authorization only a person can give."""


def token_path(home: Path, server: str) -> Path:
    """Where server `server`'s tokens are kept."""
    return home / FOLDER / f"{server}.json"


class TokenFile:
    """The SDK's `TokenStorage` over one JSON file, written 0600 (atomically): the
    tokens (with when the access token expires: the SDK keeps only `expires_in`) and
    the client's registration."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.path.parent, 0o700)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.path)

    def expires_at(self) -> float | None:
        """When the stored access token expires (None: not known)."""
        value = self._read().get("expires_at")
        return float(value) if isinstance(value, int | float) else None

    async def get_tokens(self) -> OAuthToken | None:
        """The stored tokens, if any."""
        raw = self._read().get("tokens")
        return OAuthToken.model_validate(raw) if isinstance(raw, dict) else None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        """Keep new tokens (a login, a refresh)."""
        data = self._read()
        data["tokens"] = tokens.model_dump(mode="json", exclude_none=True)
        data["expires_at"] = time.time() + tokens.expires_in if tokens.expires_in else None
        self._write(data)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        """The client's registration, if any."""
        raw = self._read().get("client")
        return OAuthClientInformationFull.model_validate(raw) if isinstance(raw, dict) \
            else None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        """Keep the client's registration."""
        data = self._read()
        data["client"] = client_info.model_dump(mode="json", exclude_none=True)
        self._write(data)

    def forget_tokens(self) -> None:
        """Drop the tokens (a new login), keeping the registration."""
        data = self._read()
        if data.pop("tokens", None) is not None:
            data.pop("expires_at", None)
            self._write(data)

    def forget_client(self) -> None:
        """Drop the registration (its redirect port is taken: register again)."""
        data = self._read()
        if data.pop("client", None) is not None:
            self._write(data)


class Provider(OAuthClientProvider):
    """The SDK's provider, knowing when stored tokens expire (it loads them without
    their expiry, so a token read from the file would never be refreshed, only
    refused by the server), sharing its refreshes with the other processes over the
    same file, and refreshing a token the server refuses before its time.

    Each executor has a provider over the file: with a server that rotates refresh
    tokens (OAuth 2.1 asks it of public clients), two refreshing at once with the
    same one would leave one of them refused, then asking for a login. So a refresh
    is made under the file's lock (`file_lock`), the file read again first: tokens
    another process wrote meanwhile are taken instead. Only the refresh is locked,
    never the MCP request."""

    def __init__(self, storage: TokenFile, **kwargs: Any) -> None:
        super().__init__(storage=storage, **kwargs)
        self.file = storage

    async def _initialize(self) -> None:
        await super()._initialize()
        self.context.token_expiry_time = self.file.expires_at()

    def _stale(self) -> bool:
        """Whether the access token is expired or about to (`EARLY`: a token good
        when sent should still be good when the server reads it)."""
        tokens, expiry = self.context.current_tokens, self.context.token_expiry_time
        if tokens is None or expiry is None:
            return False
        return time.time() > expiry - min(EARLY_S, EARLY * (tokens.expires_in or 0))

    def _access(self) -> str | None:
        tokens = self.context.current_tokens
        return tokens.access_token if tokens is not None else None

    async def _refresh_shared(self, refused: str | None
                              ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        """Refresh under the file's lock, unless the file (read again) holds tokens
        fresher than ours: another process refreshed. `refused`: an access token the
        server refused (refreshed whatever its expiry)."""
        async with self.context.lock, file_lock(self.file.path):
            await self._initialize()
            if self._access() != refused and not self._stale():
                return
            if not self.context.can_refresh_token():
                return
            spent = self.context.current_tokens and self.context.current_tokens.refresh_token
            response = yield await self._refresh_token()
            if not await self._handle_refresh_response(response):
                # Refused: tokens written meanwhile by a process not taking the lock
                # (a login) are used; else the flow goes on to ask for a login.
                await self._initialize()
                tokens = self.context.current_tokens
                if tokens is None or tokens.refresh_token == spent or self._stale():
                    self.context.clear_tokens()

    async def _auth_flow(self, request: httpx2.Request
                         ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        """The SDK's flow, a shared refresh before it when the token is stale, and
        once again when the server refuses the token we hold (rather than the SDK's
        going straight to a new authorization, which an executor cannot do)."""
        if not self._initialized:
            async with self.context.lock:
                await self._initialize()
        refused: str | None = None
        for attempt in range(2):
            if self._stale() or refused is not None:
                refresh = self._refresh_shared(refused)
                try:
                    outgoing = await refresh.__anext__()
                    while True:
                        outgoing = await refresh.asend((yield outgoing))
                except StopAsyncIteration:
                    pass
                finally:
                    await refresh.aclose()
            sent = self._access()
            flow = super()._auth_flow(request)
            try:
                outgoing = await flow.__anext__()
                while True:
                    response = yield outgoing
                    if (outgoing is request and response.status_code == 401 and attempt == 0
                            and sent is not None and self.context.can_refresh_token()):
                        refused = sent
                        break
                    outgoing = await flow.asend(response)
            except StopAsyncIteration:
                return
            finally:
                await flow.aclose()


@contextlib.asynccontextmanager
async def file_lock(path: Path) -> AsyncIterator[None]:
    """An exclusive `flock` on `path`'s lock file (beside it, 0600), taken in a thread
    (the event loop goes on); released at the end, or by the kernel if the process
    dies holding it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    taking = asyncio.get_running_loop().run_in_executor(None, fcntl.flock, fd, fcntl.LOCK_EX)
    try:
        await asyncio.shield(taking)
    except BaseException:
        # Cancelled while the thread waits: it closes the file (freeing the lock) once taken.
        taking.add_done_callback(lambda _: os.close(fd))
        raise
    try:
        yield
    finally:
        os.close(fd)  # (closing releases the lock)


def metadata(redirect_uri: str) -> OAuthClientMetadata:
    """What oploop registers itself as."""
    return OAuthClientMetadata(client_name="oploop", redirect_uris=[redirect_uri],
                               grant_types=["authorization_code", "refresh_token"],
                               response_types=["code"])


def uses_oauth(config: McpServerConfig) -> bool:
    """Whether an HTTP server is reached through OAuth: one without an `Authorization`
    header of its own."""
    return bool(config.url) and not any(k.lower() == "authorization" for k in config.headers)


def auth_for(config: McpServerConfig, home: Path) -> httpx2.Auth | None:
    """The executor's `httpx2.Auth` for an HTTP server (None: it has a header of its own)."""
    if not uses_oauth(config):
        return None
    storage = TokenFile(token_path(home, config.name))
    redirect = "http://127.0.0.1/callback"
    with contextlib.suppress(Exception):
        client = storage._read().get("client") or {}
        redirect = str((client.get("redirect_uris") or [redirect])[0])

    async def no_browser(url: str) -> None:
        raise LoginNeeded(f"unauthorized: run `oploop mcp login {config.name}` "
                          f"(the server wants an OAuth authorization)")

    async def no_callback() -> AuthorizationCodeResult:  # (never reached)
        raise LoginNeeded(f"unauthorized: run `oploop mcp login {config.name}`")

    return Provider(storage, server_url=config.url, client_metadata=metadata(redirect),
                    redirect_handler=no_browser, callback_handler=no_callback)


async def login(config: McpServerConfig, home: Path, say: Callable[[str], None],
                wait_s: float = LOGIN_WAIT_S) -> int:
    """Authorize oploop for `config`'s server: the URL to open is said with `say`, the
    redirect taken on a loopback port; returns how many tools the server then lists.
    Raises `LoginNeeded` (no redirect in time), or the SDK's errors."""
    from aiohttp import web
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    storage = TokenFile(token_path(home, config.name))
    storage.forget_tokens()  # a login asks again, whatever is stored
    came: asyncio.Future[AuthorizationCodeResult] = asyncio.get_running_loop().create_future()

    async def callback(request: web.Request) -> web.Response:
        query = request.query
        if "error" in query:
            if not came.done():
                came.set_exception(LoginNeeded(f"the authorization was refused: "
                                               f"{query.get('error')} "
                                               f"{query.get('error_description', '')}".strip()))
            return web.Response(text="oploop: the authorization was refused.\n")
        if not came.done():
            came.set_result(AuthorizationCodeResult(code=query.get("code", ""),
                                                    state=query.get("state"),
                                                    iss=query.get("iss")))
        return web.Response(text="oploop: logged in. You can close this window.\n")

    app = web.Application()
    app.router.add_get(CALLBACK, callback)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        port = await _listen(runner, storage)
        redirect_uri = f"http://127.0.0.1:{port}{CALLBACK}"

        async def show(url: str) -> None:
            say(url)

        async def redirected() -> AuthorizationCodeResult:
            try:
                async with asyncio.timeout(wait_s):
                    return await came
            except TimeoutError:
                raise LoginNeeded(f"no redirect came to {redirect_uri} within {wait_s:g} s"
                                  ) from None

        provider = Provider(storage, server_url=config.url,
                            client_metadata=metadata(redirect_uri),
                            redirect_handler=show, callback_handler=redirected)
        timeout = httpx2.Timeout(30.0, read=wait_s + 30.0)
        async with httpx2.AsyncClient(auth=provider, headers=dict(config.headers),
                                      timeout=timeout) as http, \
                streamable_http_client(config.url, http_client=http) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            return len((await session.list_tools()).tools)
    finally:
        await runner.cleanup()


async def _listen(runner: Any, storage: TokenFile) -> int:
    """Listen on the registration's redirect port if it is free; else on a new one,
    the registration dropped (its redirect URI would not match)."""
    from aiohttp import web

    client = await storage.get_client_info()
    ports = []
    if client is not None and client.redirect_uris:
        ports.append(urlsplit(str(client.redirect_uris[0])).port or 0)
    for port in [*[p for p in ports if p], 0]:
        site = web.TCPSite(runner, "127.0.0.1", port)
        try:
            await site.start()
        except OSError:
            continue
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if client is not None and bound not in ports:
            storage.forget_client()
        return int(bound)
    raise OSError("no loopback port to listen on")
