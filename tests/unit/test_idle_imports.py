"""What each actor holds once it serves, idle (issue 28: idle RSS).

`test_import_diet.py` checks what importing an actor's module loads; an actor loads
more as it starts (its loop, its backend). Here each runs for real, in a subprocess,
from its own `__main__` until it says it is ready (the host's ready pipe), and then
reports the modules it has: what a module made lazy must not be there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

#: Run in the subprocess: the actor's `__main__`, and at its ready line, its modules.
_AT_READY = r"""
import json, os, runpy, signal, sys, threading
read_end, write_end = os.pipe()
os.environ["OPLOOP_READY_FD"] = str(write_end)

def report():
    os.read(read_end, 64)
    print(json.dumps(sorted(sys.modules)), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # (a clean stop, as the host's)

threading.Thread(target=report, daemon=True).start()
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)  # (its argv after)
"""

#: OpenSSL's modules: `_ssl` (libssl, libcrypto) and `_hashlib` (libcrypto), ~4.5 MiB.
OPENSSL = {"_ssl", "_hashlib"}
#: What each role holds no more at idle, besides OpenSSL: psutil (~0.9 MiB, the
#: executors read /proc), shutil (~0.45 MiB with bz2 and lzma; the sandbox's),
#: tenacity (~0.45 MiB, an llm call's first retry), the SDK (its first call).
NOT_AT_IDLE = {
    "actors.supervisor": {"psutil", "shutil", "tenacity", "anthropic"},
    "actors.broadcaster": {"psutil", "shutil", "tenacity", "anthropic"},
    "actors.llm_caller": {"psutil", "shutil", "tenacity", "anthropic"},
    "actors.executor": {"psutil", "tenacity", "anthropic"},
    "actors.offline_model": {"psutil", "tenacity", "anthropic"},  # (argparse's shutil)
}
#: The command line each is given (the offline model's, as the host gives it).
ARGS = {"actors.offline_model": ["--port", "0", "--port-file", "{home}/port"]}


def modules_at_ready(entry: str, home: Path) -> set[str]:
    """The modules actor `entry` (`python -m entry`) has once it says it is ready."""
    (home / "run").mkdir(mode=0o700, exist_ok=True)
    script = home / "scenario.json"
    script.write_text(json.dumps({"turns": [{"reply": "hello"}]}))
    env = {**os.environ, "OPLOOP_HOME": str(home), "OPLOOP_LLM_BACKEND": "scripted",
           "OPLOOP_LLM_SCRIPT": str(script)}
    env.pop("OPLOOP_READY_FD", None)
    args = [a.format(home=home) for a in ARGS.get(entry, [])]
    done = subprocess.run([sys.executable, "-c", _AT_READY, entry, *args], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout, f"{entry} never said it was ready: {done.stderr[-2000:]}"
    return set(json.loads(done.stdout.splitlines()[0]))


@pytest.mark.parametrize("entry", sorted(NOT_AT_IDLE))
def test_an_idle_actor_holds_no_openssl_and_nothing_it_loads_when_needed(entry, tmp_path):
    loaded = modules_at_ready(entry, tmp_path)
    assert {f"{entry}.actor", f"{entry}.cli"} & loaded  # (it did start)
    assert not loaded & OPENSSL, sorted(loaded & OPENSSL)
    assert not loaded & NOT_AT_IDLE[entry], sorted(loaded & NOT_AT_IDLE[entry])


@pytest.mark.parametrize("entry", ["actors.supervisor", "actors.llm_caller",
                                   "actors.offline_model", "actors.executor",
                                   "actors.broadcaster"])
def test_the_busy_actors_keep_uvloop(entry, tmp_path):
    # a turn's cost in them is the loop's (every turn passes the executor, every event the
    # broadcaster): OpenSSL went, uvloop stays
    assert "uvloop.loop" in modules_at_ready(entry, tmp_path)


#: In a subprocess as a supervisor or an llm caller starts: `ssl` kept out, uvloop
#: imported with stand-ins. The loop refuses a TLS transport of its own, saying why;
#: once `ssl` is let in, TLS done by httpx (the SDK's client, through anyio) works on it.
_TLS_AFTER = r"""
import sys
sys.modules.setdefault("ssl", None)
import asyncio
from actors import nossl
uvloop = nossl.import_uvloop()
assert "_ssl" not in sys.modules and "_hashlib" not in sys.modules
port, ca = int(sys.argv[1]), sys.argv[2]

async def main():
    loop = asyncio.get_running_loop()
    try:
        await loop.create_connection(asyncio.Protocol, "127.0.0.1", port, ssl=True)
    except nossl.TlsKeptOut as exc:
        print("refused:", exc)
    nossl.let_in()
    import httpx2  # (the SDK's HTTP client)
    async with httpx2.AsyncClient(verify=ca) as client:
        reply = await client.get(f"https://localhost:{port}/")
    print("over tls:", reply.status_code, reply.text)

uvloop.run(main())
"""


def test_ssl_kept_out_refuses_the_loops_tls_and_lets_the_sdks_client_in(tmp_path):
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command to make the test server's certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    server = subprocess.Popen(
        [sys.executable, "-c", _TLS_SERVER, str(cert), str(key)], stdout=subprocess.PIPE,
        text=True)
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        done = subprocess.run([sys.executable, "-c", _TLS_AFTER, port, str(cert)],
                              capture_output=True, text=True, timeout=60)
    finally:
        server.kill()
        server.wait()
    assert done.returncode == 0, done.stderr
    assert "refused: this process keeps ssl (OpenSSL) out" in done.stdout
    assert "over tls: 200 hello over tls" in done.stdout


#: A one-page HTTPS server (the standard library's), its port on the first line.
_TLS_SERVER = r"""
import http.server, ssl, sys

class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello over tls"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = http.server.HTTPServer(("127.0.0.1", 0), Page)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[1], sys.argv[2])
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"""
