"""Where a host's web view is, for `oploop web` and scripts: no HTTP stack loaded.

The gateway writes its address to `run/web.url` once it listens; the token every
request needs is `web.token` in the home (`access.py` makes it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

WEB_URL_FILE = "web.url"
TOKEN_FILE = "web.token"


def page_url(home: Path, session: str = "") -> str | None:
    """The page's address with its token (one session's page with `session`), or None
    when no gateway serves `home`."""
    try:
        base = (home / "run" / WEB_URL_FILE).read_text().strip()
        token = (home / TOKEN_FILE).read_text().strip()
    except FileNotFoundError:
        return None
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
