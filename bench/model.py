"""A local Messages-API server for the benchmark: the offline model, playing a scenario.

Every system measured over HTTP (oploop's llm callers, the peers) calls this one
process through a real SDK, so a turn's time includes what a user's turn
includes: the request built from the history, sent, parsed, answered.

The scenario (`history_scenario`): by default a session asks for one
`read_file` of the target per turn, without end (oploop's runs are cut by
`max_turns`). A prompt tagged `#tN` plays N such turns and then a text answer
(the peers' runs end on it); `#streamN` plays N-1 reads and then a slowly
streamed text answer of `STREAM_WORDS` words, one delta every `STREAM_DELAY_S`
(longer than the llm caller's 20 ms batching, so one TOKEN event per delta).
Sessions are told apart by the request's `metadata.user_id`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: Turns of the untagged (endless) script; runs are cut by max_turns long before.
ENDLESS_TURNS = 1000
#: Words of the streamed answer (`#streamN`), one SSE delta each.
STREAM_WORDS = 120
#: Pause before each streamed delta: above the llm caller's 20 ms batch interval.
STREAM_DELAY_S = 0.03
#: Seconds to wait for the server to write its port.
START_TIMEOUT_S = 30.0


def _read_call(target: str) -> dict[str, Any]:
    return {"reply": [{"type": "tool_use", "name": "read_file", "input": {"path": target}}]}


def history_scenario(target: str, lengths: tuple[int, ...], streams: tuple[int, ...] = (),
                     chat: int = 0) -> dict[str, Any]:
    """The scenario document: endless reads, `#tN` scripts, `#streamN` scripts and,
    with `chat`, a `#chat` script of that many runs (a read, then an answer)."""
    read = _read_call(target)
    scripts: dict[str, list[Any]] = {
        f"t{n}": [*([read] * n), {"reply": "done"}] for n in lengths
    }
    words = " ".join(f"word{i}" for i in range(STREAM_WORDS))
    for n in streams:
        scripts[f"stream{n}"] = [*([read] * (n - 1)),
                                 {"reply": words, "delay_s": STREAM_DELAY_S}]
    if chat:
        scripts["chat"] = [read, {"reply": "read it"}] * chat
    return {"description": "one read_file per turn (bench)", "turns": [read] * ENDLESS_TURNS,
            "scripts": scripts}


class OfflineModel:
    """`python -m actors.offline_model` on an ephemeral port, playing `scenario`."""

    def __init__(self, directory: Path, scenario: dict[str, Any], context: int | None = None
                 ) -> None:
        self.dir = directory
        #: Its context window in tokens (None: the default, 200k; 0: none).
        self.context = context
        self.scenario_path = directory / "model-scenario.json"
        self.scenario_path.write_text(json.dumps(scenario))
        self.port_file = directory / "model.port"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """The base URL an SDK is given."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the server and wait for its port (raises RuntimeError if it dies)."""
        self.port_file.unlink(missing_ok=True)
        log = open(self.dir / "model.log", "wb")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "actors.offline_model", "--port-file", str(self.port_file),
             "--scenario", str(self.scenario_path)],
            stdout=log, stderr=log, env={
                **os.environ, "OPLOOP_PARENT_PID": str(os.getpid()),
                **({} if self.context is None else {"OPLOOP_OFFLINE_CONTEXT": str(self.context)}),
            },
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"offline model exited {self.proc.returncode}: "
                                   f"{(self.dir / 'model.log').read_text()[-1000:]}")
            try:
                text = self.port_file.read_text().strip()
            except FileNotFoundError:
                text = ""
            if text:
                self.port = int(text)
                return
            time.sleep(0.05)
        raise RuntimeError("offline model did not write its port in time")

    def stop(self) -> None:
        """SIGTERM, then wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> OfflineModel:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
