"""The gateway's pure parts: `[http]` settings and the metrics counted from events."""

from __future__ import annotations

import asyncio
import socket
import subprocess

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from actors.config import ConfigError, HttpConfig, parse_config
from actors.eventcounts import MAX_LABELS, EventCounts
from actors.gateway.actor import Gateway, GatewayError
from actors.gateway.feed import NOTICE_QUEUE, Feed
from actors.gateway.metrics import Metrics
from actors.settings import load_settings
from bus.codec import decode, encode
from bus.messages import Envelope, StatsReply


def test_http_defaults_to_loopback_7480_and_on():
    http = load_settings({}).config.http
    assert (http.enabled, http.host, http.port, http.explicit) == (True, "127.0.0.1", 7480, False)


def test_http_listen_from_file_and_environment():
    assert parse_config({"http": {"listen": "[::1]:9000"}}).http.listen == "[::1]:9000"
    assert not parse_config({"http": {"enabled": False}}).http.enabled
    http = load_settings({"OPLOOP_HTTP_LISTEN": "localhost:0"}).config.http
    assert (http.host, http.port, http.explicit) == ("localhost", 0, True)
    assert not load_settings({"OPLOOP_HTTP_LISTEN": "off"}).config.http.enabled


@pytest.mark.parametrize("listen", ["0.0.0.0:7480", "10.1.2.3:80", "example.com:80"])
def test_off_loopback_is_refused_naming_the_key(listen):
    with pytest.raises(ConfigError, match=r"http\.listen: .*off loopback is refused"):
        parse_config({"http": {"listen": listen}})
    with pytest.raises(ConfigError, match="OPLOOP_HTTP_LISTEN: .*off loopback"):
        load_settings({"OPLOOP_HTTP_LISTEN": listen})


@pytest.mark.parametrize("listen", ["7480", "127.0.0.1", "127.0.0.1:x", "127.0.0.1:70000"])
def test_malformed_listen_is_refused(listen):
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        parse_config({"http": {"listen": listen}})


def test_unknown_http_key_is_named():
    with pytest.raises(ConfigError, match=r"http\.port: unknown key"):
        parse_config({"http": {"port": 1}})


def ev(seq, kind, data=None, session="s1"):
    return {"session": session, "seq": seq, "type": kind, "turn": 1, "ts": 0.0,
            "data": data or {}}


class Counted:
    """The broadcaster's counts (`EventCounts`), through the wire, rendered by the
    gateway's `/metrics` (`Metrics`) as a scrape does."""

    def __init__(self) -> None:
        self.counts = EventCounts()
        self.lost = 0

    def observe(self, e: dict) -> None:
        self.counts.observe(e["type"], e["data"])

    def samples(self) -> dict:
        from prometheus_client import generate_latest

        # Through the codec, as the broadcaster's `StatsReply` carries them.
        wire = decode(encode(Envelope(StatsReply({"counts": self.counts.snapshot()}))))
        m = Metrics()
        m.counted.counts = {**wire.body.counters["counts"], "missed": self.lost}
        out = {}
        for family in text_string_to_metric_families(generate_latest(m.registry).decode()):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out


def test_metrics_count_a_run_from_its_events():
    m = Counted()
    for e in [ev(1, "SESSION_START"), ev(2, "TURN_START"),
              ev(3, "TOOL_END", {"name": "shell", "is_error": True, "duration_ms": 250}),
              ev(4, "RETRY", {"attempt": 1, "error": "overloaded: try later", "wait_s": 0.5}),
              ev(5, "TURN_END", {"stop": "end_turn",
                                 "usage": {"input_tokens": 10, "output_tokens": 3}}),
              ev(6, "CANCELLED", {"mode": "ui", "reason": ""})]:
        m.observe(e)
    s = m.samples()
    assert s[("oploop_turns_total", ())] == 1
    assert s[("oploop_events_total", (("type", "TURN_START"),))] == 1
    assert s[("oploop_tool_calls_total", (("outcome", "error"), ("tool", "shell")))] == 1
    assert s[("oploop_tool_call_duration_seconds_sum", (("tool", "shell"),))] == 0.25
    assert s[("oploop_tool_call_duration_seconds_count", (("tool", "shell"),))] == 1
    assert s[("oploop_tool_call_duration_seconds_bucket", (("le", "0.1"), ("tool", "shell")))] == 0
    assert s[("oploop_tool_call_duration_seconds_bucket", (("le", "0.25"), ("tool", "shell")))] \
        == 1
    assert s[("oploop_tool_call_duration_seconds_bucket", (("le", "+Inf"), ("tool", "shell")))] \
        == 1
    assert s[("oploop_model_retries_total", (("cause", "overloaded"),))] == 1
    assert s[("oploop_tokens_total", (("kind", "input"),))] == 10
    assert s[("oploop_tokens_total", (("kind", "output"),))] == 3
    assert s[("oploop_turn_ends_total", (("stop", "end_turn"),))] == 1
    assert s[("oploop_runs_total", (("terminal", "CANCELLED"),))] == 1
    assert s[("oploop_cancels_total", (("mode", "ui"),))] == 1
    assert s[("oploop_gateway_events_missed_total", ())] == 0
    m.observe(ev(7, "ERROR", {"error": "model_error", "message": "overloaded"}, session="s2"))
    assert m.samples()[("oploop_run_errors_total", (("error", "model_error"),))] == 1


def test_metrics_show_every_state_terminal_and_mode_at_zero_and_count_the_cost():
    m = Counted()
    s = m.samples()
    for terminal in ("DONE", "ERROR", "CANCELLED"):
        assert s[("oploop_runs_total", (("terminal", terminal),))] == 0
    for mode in ("ui", "operation", "deadline"):
        assert s[("oploop_cancels_total", (("mode", mode),))] == 0
    assert s[("oploop_model_cost_usd_total", ())] == 0
    for i, cost in enumerate([0.25, None, 0.5]):  # (None: a model with no price)
        m.observe(ev(i + 1, "TURN_END", {"stop": "end_turn", "usage": {
            "input_tokens": 10, "output_tokens": 3, "cost_usd": cost}}))
    assert m.samples()[("oploop_model_cost_usd_total", ())] == 0.75


def test_metrics_show_what_was_lost_and_bound_model_chosen_labels():
    m = Counted()
    m.lost = 3  # the broadcaster's: events it could not recover, never published
    for i in range(MAX_LABELS + 10):
        m.observe(ev(6 + i, "TOOL_END", {"name": f"made_up_{i}", "duration_ms": 1}))
    s = m.samples()
    assert s[("oploop_gateway_events_missed_total", ())] == 3
    tools = {dict(labels)["tool"] for (name, labels) in s if name == "oploop_tool_calls_total"}
    assert len(tools) == MAX_LABELS + 1 and "other" in tools


def test_without_the_broadcasters_counts_a_scrape_renders_the_rest():
    from prometheus_client import generate_latest

    m = Metrics()  # (a scrape the broadcaster did not answer: counts None)
    text = generate_latest(m.registry).decode()
    assert "oploop_gateway_sse_clients" in text and "oploop_runs_total" not in text


def test_a_taken_default_port_gives_way_but_a_configured_one_fails(tmp_path):
    async def main() -> None:
        taken = socket.create_server(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        try:
            for explicit in (False, True):
                settings = load_settings({"OPLOOP_HOME": str(tmp_path)})
                gw = Gateway(settings)
                gw.http = HttpConfig(True, "127.0.0.1", port, explicit=explicit)
                runner = web.AppRunner(web.Application())
                await runner.setup()
                try:
                    if explicit:
                        with pytest.raises(GatewayError, match="cannot listen on"):
                            await gw._listen(runner)
                    else:
                        url = await gw._listen(runner)
                        assert url.startswith("http://127.0.0.1:")
                        assert not url.endswith(f":{port}/")
                        async with aiohttp.ClientSession() as http, http.get(url) as resp:
                            assert resp.status == 404  # an empty app, but it serves
                finally:
                    await runner.cleanup()
        finally:
            taken.close()

    asyncio.run(main())


def test_only_the_gateway_loads_the_http_stack_and_it_loads_no_model_code():
    import json
    import sys

    def loaded_after(statement: str) -> set[str]:
        code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60, check=True)
        return set(json.loads(done.stdout))

    http = {"aiohttp", "prometheus_client"}
    for module in ("host.actor", "supervisor.actor", "broadcaster.actor", "cli",
                   "gateway.urls"):
        assert not loaded_after(f"import actors.{module}") & http, module
    gateway = loaded_after("import actors.gateway.actor")
    assert http <= gateway
    assert not {m for m in gateway if m.split(".")[0] in ("anthropic", "pydantic", "httpx")}


def test_the_feed_skips_deltas_and_ends_a_stream_that_falls_behind():
    async def main() -> None:
        feed = Feed()
        with feed.watch() as slow, feed.watch() as quick:
            feed.publish(ev(1, "TOKEN", {"text": "x"}))
            feed.publish(ev(2, "TURN_START"))
            assert (await quick.get())["seq"] == 2
            for seq in range(3, 3 + NOTICE_QUEUE + 1):
                feed.publish(ev(seq, "TURN_START"))
                while not quick.empty():
                    quick.get_nowait()
            assert feed.streams == 1  # the slow one is out; the quick one goes on
            items = [slow.get_nowait() for _ in range(slow.qsize())]
            assert items[-1] is None and all(i is not None for i in items[:-1])
        assert feed.streams == 0

    asyncio.run(main())


def self_signed(directory) -> tuple[str, str]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return str(cert), str(key)


def test_off_loopback_needs_both_cert_and_key(tmp_path):
    cert, key = self_signed(tmp_path)
    http = parse_config({"http": {"listen": "0.0.0.0:8443", "cert": cert, "key": key}}).http
    assert (http.host, http.port, http.tls, http.loopback) == ("0.0.0.0", 8443, True, False)
    with pytest.raises(ConfigError, match=r"http\.key: required with http\.cert"):
        parse_config({"http": {"listen": "0.0.0.0:8443", "cert": cert}})
    with pytest.raises(ConfigError, match=r"http\.cert: no such file"):
        parse_config({"http": {"cert": str(tmp_path / "none"), "key": key}})
    toml = tmp_path / "oploop.toml"
    toml.write_text(f'[http]\ncert = "{cert}"\nkey = "{key}"\n')
    env = {"OPLOOP_CONFIG": str(toml), "OPLOOP_HTTP_LISTEN": "0.0.0.0:0"}
    assert load_settings(env).config.http.tls


def test_the_gateway_serves_https_with_cert_and_key(tmp_path):
    cert, key = self_signed(tmp_path)

    async def main() -> None:
        gw = Gateway(load_settings({"OPLOOP_HOME": str(tmp_path)}))
        gw.http = HttpConfig(True, "127.0.0.1", 0, explicit=True, cert=cert, key=key)
        runner = web.AppRunner(web.Application())
        await runner.setup()
        try:
            url = await gw._listen(runner)
            assert url.startswith("https://127.0.0.1:")
            async with aiohttp.ClientSession() as http, http.get(url, ssl=False) as resp:
                assert resp.status == 404  # an empty app, over TLS
        finally:
            await runner.cleanup()

    asyncio.run(main())
