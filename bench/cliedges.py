"""The CLI at its edges, timed: Ctrl-C during a tool to the CLI's exit (embedded host,
in a pseudo-terminal), and a SIGKILLed host to the attached `oploop run` saying so.

`python -m bench.cliedges [--repo PATH] [-n N]` times the code of another checkout
too (its own venv), for before/after figures measured in the same minute.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import pty
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _env(home: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPLOOP_"))}
    env["OPLOOP_HOME"] = home
    return env


def _cli(repo: Path) -> list[str]:
    python = repo / ".venv" / "bin" / "python"
    return [str(python if python.exists() else sys.executable), "-m", "actors.cli"]


def _tty() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _read_until(fd: int, text: bytes, seen: bytearray, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while text not in seen:
        ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            raise TimeoutError(f"no {text!r}")
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            raise TimeoutError(f"exited before {text!r}: {bytes(seen)[-300:]!r}") from None
        seen += chunk


def ctrl_c_once(repo: Path) -> dict[str, Any]:
    """Seconds from a Ctrl-C during a tool to the CLI's exit, with an embedded host."""
    home = tempfile.mkdtemp(prefix="opc-", dir="/tmp")
    master, slave = pty.openpty()
    proc = subprocess.Popen([*_cli(repo), "run", "run `sleep 60`"], stdin=slave, stdout=slave,
                            stderr=slave, env=_env(home), cwd=repo, start_new_session=True,
                            preexec_fn=_tty)
    os.close(slave)
    seen = bytearray()
    try:
        _read_until(master, "→ shell".encode(), seen)
        pressed = time.perf_counter()
        os.write(master, b"\x03")
        shown = None
        while True:  # drain the terminal until the CLI exits
            ready, _, _ = select.select([master], [], [], 0.01)
            if ready:
                with contextlib.suppress(OSError):
                    seen += os.read(master, 65536)
            if shown is None and b"cancelled (" in seen:
                shown = time.perf_counter() - pressed
            if proc.poll() is not None:
                break
        elapsed = time.perf_counter() - pressed
        return {"s": elapsed, "exit": proc.returncode, "shown_s": shown,
                "traceback": b"Traceback" in seen or b"KeyboardInterrupt" in seen}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        _cleanup(repo, home)


def dead_host_once(repo: Path) -> dict[str, Any]:
    """Seconds from SIGKILL of the host to the attached `oploop run` exiting."""
    home = tempfile.mkdtemp(prefix="opd-", dir="/tmp")
    env = _env(home)
    subprocess.run([*_cli(repo), "up", "--detach"], env=env, cwd=repo, check=True,
                   capture_output=True, timeout=120)
    proc = subprocess.Popen([*_cli(repo), "run", "run `sleep 120`"], env=env, cwd=repo,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("→ shell"):
                break
        pid = json.loads((Path(home) / "run" / "host.json").read_text())["pid"]
        killed = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=120)
        return {"s": time.perf_counter() - killed, "exit": proc.returncode}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _cleanup(repo, home)


def _cleanup(repo: Path, home: str) -> None:
    subprocess.run([*_cli(repo), "down"], env=_env(home), cwd=repo, capture_output=True,
                   timeout=60, check=False)
    try:
        from actors.sandbox.workspaces import remove_home

        remove_home(Path(home))
    except Exception:  # noqa: BLE001 - best effort: a bench leaves /tmp as it found it
        shutil.rmtree(home, ignore_errors=True)


def measure(repo: Path, n: int) -> dict[str, Any]:
    """Medians over `n` tries of each."""
    out: dict[str, Any] = {"repo": str(repo), "load": os.getloadavg()[0]}
    for name, once in (("ctrl_c_to_exit", ctrl_c_once), ("dead_host_to_exit", dead_host_once)):
        tries = [once(repo) for _ in range(n)]
        shown = [t["shown_s"] for t in tries if t.get("shown_s") is not None]
        out[name] = {"median_s": statistics.median(t["s"] for t in tries),
                     "shown_median_s": statistics.median(shown) if shown else None,
                     "exits": [t["exit"] for t in tries],
                     "tracebacks": sum(bool(t.get("traceback")) for t in tries)}
    return out


def run(quick: bool = False) -> dict[str, Any]:
    """The section: this checkout's figures."""
    return measure(REPO, 1 if quick else 3)


def table(result: dict[str, Any]) -> str:
    """The section as text."""
    lines = [f"cli edges ({result['repo']}, load {result['load']:.1f})"]
    for name in ("ctrl_c_to_exit", "dead_host_to_exit"):
        r = result[name]
        shown = r.get("shown_median_s")
        lines.append(f"  {name:<20}{r['median_s']:>8.2f} s  exits {r['exits']}"
                     f"  tracebacks {r['tracebacks']}"
                     + (f"  (CANCELLED shown after {shown:.2f} s)" if shown is not None else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repo", type=Path, default=REPO)
    parser.add_argument("-n", type=int, default=3)
    args = parser.parse_args()
    print(table(measure(args.repo, args.n)))
