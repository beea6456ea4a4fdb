"""SHA-256 and BLAKE2 from Python's own implementations, without OpenSSL.

`import hashlib` loads OpenSSL's libcrypto at once (~3.7 MB resident per process).
What speaks TLS loads it anyway (`ssl`: the gateway, an llm caller once its SDK is in);
no other actor does (`actors/nossl.py`), and what they hash (a name, a session id, a
tool call's id) is short: the built-in modules do it at no cost (faster than OpenSSL's
under ~1 KB; hashlib's BLAKE2 are these very ones). A Python built without them
(`--without-builtin-hashlib-hashes`) falls back to hashlib, same digests.
"""

from __future__ import annotations

try:
    from _blake2 import blake2b, blake2s
    try:
        from _sha2 import sha256  # Python 3.12+
    except ImportError:
        from _sha256 import sha256  # Python 3.11
except ImportError:  # (no built-in hashes: OpenSSL's, through hashlib)
    from hashlib import blake2b, blake2s, sha256  # type: ignore[assignment]

__all__ = ["blake2b", "blake2s", "sha256"]
