"""An MCP server that requires OAuth 2.1, for the tests: `python mcp_oauthserver.py PORT
ACCESS_S`. Built from the SDK's server auth pieces (`MCPServer(auth=...,
auth_server_provider=...)`, as the SDK's own `examples/stories/oauth` server): one
process is the authorization server (metadata discovery, dynamic client registration,
`/authorize` with PKCE, `/token` with refresh) and the resource server (`/mcp` behind
a bearer check, its protected-resource metadata). Consent is given at once (no login
page: a test's browser is an HTTP GET). Access tokens live `ACCESS_S` seconds, so a
test sees them refreshed; a refresh token is issued with each.

Tool: `whoami` (the client id and scopes of the token used). Each grant is logged on
stderr (`grant: authorization_code` / `grant: refresh_token`), and each refresh token
refused (`refused: refresh_token`: spent, or never issued).
"""

from __future__ import annotations

import secrets
import sys
import time

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    OAuthAuthorizationServerProvider,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyHttpUrl

SCOPES = ["mcp"]


class Provider(OAuthAuthorizationServerProvider[AuthorizationCode, RefreshToken, AccessToken]):
    """Clients, codes and tokens in memory; consent at once."""

    def __init__(self, access_s: int) -> None:
        self.access_s = access_s
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        assert client_info.client_id is not None
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull,
                        params: AuthorizationParams) -> str:
        assert client.client_id is not None
        code = AuthorizationCode(
            code=f"code_{secrets.token_hex(16)}", client_id=client.client_id,
            scopes=params.scopes or SCOPES, expires_at=time.time() + 300,
            code_challenge=params.code_challenge, redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource)
        self.codes[code.code] = code
        return construct_redirect_uri(str(params.redirect_uri), code=code.code,
                                      state=params.state)

    async def load_authorization_code(self, client: OAuthClientInformationFull,
                                      authorization_code: str) -> AuthorizationCode | None:
        return self.codes.get(authorization_code)

    async def exchange_authorization_code(self, client: OAuthClientInformationFull,
                                          authorization_code: AuthorizationCode) -> OAuthToken:
        del self.codes[authorization_code.code]
        print("grant: authorization_code", file=sys.stderr, flush=True)
        return self._tokens(authorization_code.client_id, authorization_code.scopes,
                            authorization_code.resource)

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if found is not None and found.expires_at is not None and found.expires_at < time.time():
            return None
        return found

    async def load_refresh_token(self, client: OAuthClientInformationFull,
                                 refresh_token: str) -> RefreshToken | None:
        found = self.refresh.get(refresh_token)
        if found is None:
            print("refused: refresh_token", file=sys.stderr, flush=True)
        return found if found is not None and found.client_id == client.client_id else None

    async def exchange_refresh_token(self, client: OAuthClientInformationFull,
                                     refresh_token: RefreshToken,
                                     scopes: list[str]) -> OAuthToken:
        del self.refresh[refresh_token.token]
        print("grant: refresh_token", file=sys.stderr, flush=True)
        return self._tokens(refresh_token.client_id, scopes or refresh_token.scopes, None)

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)

    def _tokens(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        access = f"access_{secrets.token_hex(16)}"
        refresh = f"refresh_{secrets.token_hex(16)}"
        self.access[access] = AccessToken(token=access, client_id=client_id, scopes=scopes,
                                          expires_at=int(time.time()) + self.access_s,
                                          resource=resource)
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes)
        return OAuthToken(access_token=access, token_type="Bearer", expires_in=self.access_s,
                          scope=" ".join(scopes), refresh_token=refresh)


def main(port: int, access_s: int) -> None:
    base = f"http://127.0.0.1:{port}"
    server = MCPServer(
        "oauth-test",
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(base), resource_server_url=AnyHttpUrl(f"{base}/mcp"),
            required_scopes=SCOPES,
            client_registration_options=ClientRegistrationOptions(
                enabled=True, valid_scopes=SCOPES, default_scopes=SCOPES)),
        auth_server_provider=Provider(access_s))

    @server.tool()
    def whoami() -> str:
        """The client id and scopes of the token this call came with."""
        token = get_access_token()
        assert token is not None
        return f"client {token.client_id} with scopes {' '.join(token.scopes)}"

    server.run("streamable-http", host="127.0.0.1", port=port,
               transport_security=TransportSecuritySettings(
                   enable_dns_rebinding_protection=False))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
