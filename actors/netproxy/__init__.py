"""The host's filtering network proxy: HTTP (absolute-form) and HTTPS CONNECT, one
allowlist per unix socket (`actors/allowlist.py` decides, `server.py` serves).

A sandboxed tool whose agent (or MCP server) has `network = [hosts...]` reaches
the network only through it: see `actors/sandbox/netbridge.py` for the way in
from the tool's private network namespace, and docs/sandbox.md "Network".
"""
