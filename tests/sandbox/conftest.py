"""The adversarial sandbox suite's fixtures live in sbhelp (importable by the tests too)."""

from sbhelp import host, mhost

__all__ = ["host", "mhost"]
