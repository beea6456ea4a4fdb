"""SHA-256 and BLAKE2b from Python's own implementations, without OpenSSL.

`import hashlib` loads OpenSSL's libcrypto at once (~3.7 MB resident per process).
The actors that speak TLS load it anyway (`ssl`); the host and the executors speak
none, and what they hash (a name, a session id) is short: the built-in modules do it
at no cost. A Python built without them (`--without-builtin-hashlib-hashes`) falls
back to hashlib, same digests.
"""

from __future__ import annotations

try:
    from _blake2 import blake2b
    try:
        from _sha2 import sha256  # Python 3.12+
    except ImportError:
        from _sha256 import sha256  # Python 3.11
except ImportError:  # (no built-in hashes: OpenSSL's, through hashlib)
    from hashlib import blake2b, sha256  # type: ignore[assignment]

__all__ = ["blake2b", "sha256"]
