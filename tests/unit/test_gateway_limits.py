"""The gateway's own bounds, without a server: redirect targets, names, caps, the quiet log."""

from __future__ import annotations

import errno
import logging

import zmq

from actors.gateway.access import local_path
from actors.gateway.limits import RESERVE_FDS, Quiet, fitted, out_of_descriptors
from actors.gateway.urls import cookie_name, hostname, page_host


def test_no_redirect_target_leaves_the_gateway():
    for path in ("//evil.com/", "///evil.com", "/\\evil.com", "\\\\evil.com", "/\\/evil.com"):
        target = local_path(path)
        assert target.startswith("/") and not target.startswith(("//", "/\\")), target
    assert local_path("/s/abc") == "/s/abc"


def test_each_gateway_has_its_own_name_and_cookie():
    assert page_host("a" * 24) != page_host("b" * 24)
    assert page_host("a" * 24).endswith(".localhost")
    assert cookie_name("a" * 24).startswith("oploop_") and "a" * 24 not in cookie_name("a" * 24)
    assert hostname("[::1]:7480") == "[::1]" and hostname("x.localhost:1") == "x.localhost"


def test_caps_fit_under_the_descriptor_limit():
    assert fitted(2_048, 2, 20_000) == 2_048
    assert fitted(2_048, 2, 150) == (150 - RESERVE_FDS) // 2
    assert fitted(512, 4, 10) == 1


def test_out_of_descriptors_is_told_apart():
    assert out_of_descriptors(OSError(errno.EMFILE, "Too many open files"))
    assert out_of_descriptors(zmq.ZMQError(errno.EMFILE))
    assert not out_of_descriptors(OSError(errno.ECONNRESET, "reset"))


def test_quiet_logs_once_per_interval_with_a_count(caplog):
    quiet = Quiet()
    with caplog.at_level(logging.WARNING, logger="oploop.gateway"):
        for _ in range(1_000):
            quiet.warn("x", "out of descriptors")
    assert len(caplog.records) == 1
