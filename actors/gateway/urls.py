"""Where a host's web view is, for `oploop web` and scripts: no HTTP stack loaded.

The gateway writes its address to `run/web.url` once it listens (an address for
programs: `http://127.0.0.1:PORT/`); the token every request needs is `web.token`
in the home (`access.py` makes it). A browser is sent to the page's own host name
instead (`page_host`), where the token's cookie lives (`access.py` says why).
"""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

WEB_URL_FILE = "web.url"
TOKEN_FILE = "web.token"
#: Host names of a loopback gateway's address that a browser is sent away from.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def gateway_id(token: str) -> str:
    """A short name of the gateway that holds `token`: what its page's host name and
    its cookie's name are made of (a hash: it tells nothing of the token)."""
    import hashlib  # here: the host, which imports this module, keeps OpenSSL out

    return hashlib.sha256(b"oploop-web:" + token.encode()).hexdigest()[:12]


def page_host(token: str) -> str:
    """The page's own host name on loopback: `oploop-<id>.localhost`."""
    return f"oploop-{gateway_id(token)}.localhost"


def cookie_name(token: str) -> str:
    """The name of the cookie that carries `token`: one per gateway."""
    return f"oploop_{gateway_id(token)}"


def hostname(host: str) -> str:
    """A `Host` header without its port (`[::1]:7480` -> `[::1]`)."""
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rpartition(":")[0] if ":" in host else host


def load_token(home: Path) -> str:
    """The home's web token, made (0600) if there is none yet (`access.py` checks it)."""
    path = home / TOKEN_FILE
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if len(token) >= 16:
        return token
    # (`secrets.token_urlsafe(24)` itself, without `secrets`: it loads OpenSSL's libcrypto
    # through `hmac`, ~4 MB resident in the host, which makes the token)
    token = base64.urlsafe_b64encode(os.urandom(24)).rstrip(b"=").decode()
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)
    return token


def page_url(home: Path, session: str = "") -> str | None:
    """The page's address with its token (one session's page with `session`), or None
    when no gateway serves `home`. On loopback, at the page's own host name."""
    try:
        base = (home / "run" / WEB_URL_FILE).read_text().strip()
        token = (home / TOKEN_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    parts = urlsplit(base)
    if parts.hostname in LOOPBACK_HOSTS and parts.port is not None:
        base = urlunsplit(parts._replace(netloc=f"{page_host(token)}:{parts.port}"))
    return f"{base}{f's/{session}' if session else ''}?token={token}"


def has_display() -> bool:
    """Whether a browser opened here would be seen (a desktop session, or macOS)."""
    return sys.platform == "darwin" or bool(os.environ.get("DISPLAY")
                                            or os.environ.get("WAYLAND_DISPLAY"))


def show(home: Path, session: str = "", *, open_browser: bool = True) -> int:
    """`oploop web [SESSION] [--no-open]`: print the page's address; open it in a browser
    when there is a display and `open_browser`. Exit status 1 when no gateway serves."""
    url = page_url(home, session)
    if url is None:
        print(f"oploop: no web view in {home}: is the host up (`oploop up`) with [http] "
              "enabled?", file=sys.stderr)
        return 1
    print(url)
    if open_browser and has_display():
        import webbrowser

        webbrowser.open(url)
    return 0
