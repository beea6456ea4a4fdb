"""Actors that start without OpenSSL: `ssl` kept out of asyncio and uvloop.

`import asyncio` imports `ssl` for its TLS transports, and with it OpenSSL's libssl and
libcrypto: ~4.5 MiB resident in every process. An actor that opens no TLS connection
of its own keeps it out from its `__main__` (`sys.modules["ssl"] = None`), before
asyncio is imported; asyncio then runs without TLS. uvloop reads a few names of `ssl`
when it is imported, for its own TLS transports: `import_uvloop` hands it stand-ins for
them, with which those transports cannot work (`ssl=` of `create_connection` or
`create_server`, `start_tls`: refused, `TlsKeptOut` or uvloop's TypeError). A library
that does TLS itself over a plain connection (httpx through anyio: the SDK of an llm
caller) imports the real `ssl`, OpenSSL with it, once `let_in` has lifted the ban.
"""

from __future__ import annotations

import sys
import types

__all__ = ["TlsKeptOut", "import_uvloop", "kept_out", "let_in"]


class TlsKeptOut(RuntimeError):
    """A TLS transport of the loop was asked for in a process that kept `ssl` out."""


def kept_out() -> bool:
    """Whether this process keeps `ssl` out (its `__main__` put None in its place)."""
    return "ssl" in sys.modules and sys.modules["ssl"] is None


def let_in() -> None:
    """Let `ssl` be imported from now on (what needs it loads OpenSSL then)."""
    if kept_out():
        del sys.modules["ssl"]


def import_uvloop() -> types.ModuleType:
    """`import uvloop`; where `ssl` is kept out, against stand-ins for the names of `ssl`
    uvloop reads at its import (it is kept out again after)."""
    if not kept_out():
        import uvloop

        return uvloop
    sys.modules["ssl"] = _stand_in()
    try:
        import uvloop
    finally:
        sys.modules["ssl"] = None  # type: ignore[assignment]
    return uvloop


def _stand_in() -> types.ModuleType:
    """A module with the names of `ssl` uvloop reads (uvloop/includes/stdlib.pxi):
    classes no TLS object is an instance of, exceptions nothing raises, and a default
    context that cannot be made."""
    module = types.ModuleType("ssl", "stand-ins for uvloop's import: ssl is kept out "
                                     "of this process (actors/nossl.py)")

    def create_default_context(*args: object, **kwargs: object) -> None:
        raise TlsKeptOut("this process keeps ssl (OpenSSL) out: its loop has no TLS "
                         "(actors/nossl.py)")

    class SSLError(OSError):
        """Never raised: no TLS runs on the loop."""

    module.__dict__.update(
        SSLContext=type("SSLContext", (), {"__doc__": "No TLS context is one of these."}),
        MemoryBIO=type("MemoryBIO", (), {}),
        create_default_context=create_default_context,
        SSLError=SSLError,
        SSLWantReadError=type("SSLWantReadError", (SSLError,), {}),
        SSLSyscallError=type("SSLSyscallError", (SSLError,), {}),
        SSLZeroReturnError=type("SSLZeroReturnError", (SSLError,), {}),
        CertificateError=type("CertificateError", (SSLError, ValueError), {}),
        # (the values of OpenSSL's SSL_ERROR_WANT_READ, _WANT_WRITE, _SYSCALL)
        SSL_ERROR_WANT_READ=2, SSL_ERROR_WANT_WRITE=3, SSL_ERROR_SYSCALL=5,
    )
    return module
