"""An MCP server for the tests, written with the SDK's `MCPServer` (FastMCP's name in
mcp 2): `python mcp_testserver.py stdio` or `python mcp_testserver.py http PORT`.

Instructions (`INSTRUCTIONS`); resources `test://greeting` (text), `test://pixel` (a PNG)
and the template `test://note/{name}`; prompts `review` (arguments `topic`, required,
and `tone`) and `plain`; the tool `linked` returns a resource link to `test://secret`.
Tools: `book` (asks the user a form: `name`, `seats`, `window`; says what came back;
marks `book-asking`, then `book-ACTION` or `book-cancelled`);
`summarise` (asks the client's model, by sampling, and says its answer);
`echo`; `slow` (sleeps, cancellable, touches `OPLOOP_TEST_MARKS/slow-started`
first, `slow-cancelled` when cancelled); `deaf` (blocks its event loop: answers
nothing, not even a ping, after touching `deaf-started`); `meet` (returns once N
calls are in at once); `crash` (says why on stderr, exits 3); `garbage` (writes a
line that is not JSON-RPC on stdout); `image` (a 1x1 PNG); `structured` (a result
with structuredContent only); `write_to`, `connect_to` and `fetch` (what the sandbox
lets it do); `add_tool` (adds `extra`, then tells the client its list changed); `big_text`
(a text of `mb` MB) and `images` (`count` PNGs of `mb` MB each) for the bounds.
`progress` (`steps` progress notifications, then a result); `for_user` (one block for
the user only, one for both); `task_only` (listed with execution.taskSupport
"required"); `who` (the client's name and version, from its `initialize`); `chatter`
(a line on stderr); `outlive` (returns once the mark `name` exists: a call in flight
while another ends). `python mcp_testserver.py http PORT TOKEN` serves `/mcp` and, only
to `Authorization: Bearer TOKEN`, `/locked/mcp` (401 otherwise).
`python mcp_testserver.py stdio many` also lists `MANY` tools of 5 KB of description
each; `stdio silent` never answers `initialize`.
"""

from __future__ import annotations

import base64
import os
import socket
import sys
import time
from pathlib import Path

if __name__ == "__main__" and "silent" in sys.argv[2:]:  # reads, never answers (at once:
    print("test server: silent on purpose", file=sys.stderr, flush=True)  # no SDK import)
    while sys.stdin.buffer.read(65536):
        pass
    sys.exit(0)

import anyio
import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import AssistantMessage, Message, UserMessage
from mcp.server.mcpserver.utilities.types import Image
from mcp_types import ResourceLink
from pydantic import BaseModel, Field

#: A 1x1 transparent PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")

#: What the server's `initialize` answer says (`include_instructions` puts it in the
#: system prompt).
INSTRUCTIONS = "Test server instructions: call echo before anything else."


class TestServer(MCPServer):
    """The SDK's server, listing `task_only` as a tool that must be run as a task (the
    decorator has no parameter for it)."""

    async def list_tools(self) -> list[types.Tool]:
        tools = await super().list_tools()
        return [t.model_copy(update={"execution": types.ToolExecution(task_support="required")})
                if t.name == "task_only" else t for t in tools]


server = TestServer("oploop-test", instructions=INSTRUCTIONS)


def _mark(name: str) -> None:
    marks = os.environ.get("OPLOOP_TEST_MARKS")
    if marks:
        Path(marks, name).write_text(str(os.getpid()))


@server.resource("test://greeting", name="greeting", description="A greeting",
                 mime_type="text/plain")
def greeting() -> str:
    """A greeting."""
    return "hello from a resource"


@server.resource("test://pixel", name="pixel", mime_type="image/png")
def pixel() -> bytes:
    """A 1x1 PNG."""
    return PNG


@server.resource("test://note/{name}", name="note", description="A note by name")
def note(name: str) -> str:
    """The note `name`."""
    return f"note {name}"


@server.resource("test://secret", name="secret", mime_type="text/plain")
def secret() -> str:
    """What the resource link of `linked` points at."""
    return "the linked secret is 7"


@server.tool()
def linked() -> list[ResourceLink]:
    """A resource link (to `test://secret`): the model reads it with read_resource."""
    return [ResourceLink(type="resource_link", uri="test://secret", name="secret")]


@server.prompt(description="Review a topic")
def review(topic: str, tone: str = "kind") -> list[Message]:
    """Two messages: a user's request and an assistant's answer to it."""
    return [UserMessage(f"Please review {topic}, in a {tone} tone."),
            AssistantMessage("I will review it.")]


@server.prompt()
def plain() -> str:
    """A prompt of one message."""
    return "Say hello."


class Booking(BaseModel):
    """The form `book` asks the user to fill."""

    name: str = Field(description="who travels")
    seats: int = Field(description="how many seats")
    window: bool = False


@server.tool()
async def book(ctx: Context) -> str:
    """Ask the user who travels (an elicitation), then say what was booked."""
    _mark("book-asking")
    try:
        answer = await ctx.elicit("Who is travelling?", Booking)
    except anyio.get_cancelled_exc_class():
        _mark("book-cancelled")  # (the call was cancelled while the question waited)
        raise
    _mark(f"book-{answer.action}")
    if answer.action == "accept":
        data = answer.data
        return f"booked {data.seats} seat(s) for {data.name}, window {data.window}"
    return f"not booked: {answer.action}"


@server.tool()
async def summarise(text: str, ctx: Context) -> str:
    """Ask the client's model (sampling) to summarise `text`; say its answer, or why
    there is none."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import SamplingMessage, TextContent

    try:
        result = await ctx.session.create_message(
            [SamplingMessage(role="user", content=TextContent(type="text", text=text))],
            max_tokens=50, system_prompt="Summarise in one line.")
    except MCPError as exc:
        return f"no summary: {exc.error.message}"
    said = result.content.text if isinstance(result.content, TextContent) else "?"
    return f"summary by {result.model} ({result.stop_reason}): {said}"


@server.tool()
def echo(text: str) -> str:
    """Say `text` back."""
    return f"echo: {text}"


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep `seconds`, then say so (`slow-cancelled` marks a cancel that reached us)."""
    _mark("slow-started")
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        _mark("slow-cancelled")
        raise
    return f"slept {seconds}"


@server.tool()
async def deaf() -> str:
    """Block the server's event loop for a long time: nothing is answered meanwhile
    (an async tool that never yields; a sync one would run in a thread)."""
    _mark("deaf-started")
    time.sleep(3600)  # noqa: ASYNC251 - blocking on purpose
    return "woke"


_arrived: list[anyio.Event] = []


@server.tool()
async def meet(count: int) -> str:
    """Return once `count` calls of `meet` are in at the same time (or fail after 30 s):
    only concurrent calls can all return."""
    here = anyio.Event()
    _arrived.append(here)
    if len(_arrived) >= count:
        for each in _arrived:
            each.set()
        _arrived.clear()
    with anyio.fail_after(30):
        await here.wait()
    return f"met {count}"


@server.tool()
def crash() -> str:
    """Exit at once with status 3, saying why on stderr."""
    print("test server: crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool()
def garbage() -> str:
    """Write a line that is not JSON-RPC on stdout (the wire, which the SDK's stdio
    server keeps on a private duplicate: it points fd 1 at stderr, against exactly
    this mistake)."""
    from mcp.server import stdio as sdk_stdio

    claim = sdk_stdio._claims.get(1)
    wire = claim.private_fd if claim is not None and claim.private_fd is not None else 1
    os.write(wire, b"this is not json-rpc\n")
    return "wrote garbage"


@server.tool()
def image() -> Image:
    """A 1x1 PNG image."""
    return Image(data=PNG, format="png")


@server.tool()
def structured() -> dict[str, int]:
    """A structured result."""
    return {"answer": 42}


@server.tool()
def write_to(path: str) -> str:
    """Write a file at `path`; say what happened."""
    try:
        Path(path).write_text("written by the MCP test server\n")
    except OSError as exc:
        return f"refused: {exc.strerror or exc}"
    return f"wrote {path}"


@server.tool()
def connect_to(port: int) -> str:
    """Connect to 127.0.0.1:`port`; say what happened."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return "connected"
    except OSError as exc:
        return f"refused: {exc.strerror or exc}"


@server.tool()
def fetch(url: str) -> str:
    """GET `url` (through HTTP_PROXY when the sandbox sets it); say what came back."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return f"status {answer.status}: {answer.read(200).decode(errors='replace')}"
    except urllib.error.HTTPError as exc:
        return f"status {exc.code}: {exc.read(400).decode(errors='replace').strip()}"
    except OSError as exc:
        return f"failed: {exc}"


@server.tool()
async def add_tool(ctx: Context) -> str:
    """Add the tool `extra`, and tell the client the list changed."""

    def extra() -> str:
        """A tool added at run time."""
        return "extra here"

    server.add_tool(extra)
    await ctx.session.send_tool_list_changed()
    return "added"


@server.tool()
def big_text(mb: float) -> str:
    """A text of `mb` MB (a line of digits, then x's, then a last line)."""
    size = int(mb * 1_000_000)
    return "first line 0123456789\n" + "x" * size + "\nlast line"


@server.tool()
def images(count: int, mb: float) -> list[Image]:
    """`count` PNG images of `mb` MB each (a PNG header, then padding: the signature is
    what the host checks)."""
    pad = b"\0" * max(0, int(mb * 1_000_000) - len(PNG))
    return [Image(data=PNG + pad, format="png") for _ in range(count)]


@server.tool()
async def progress(steps: int, ctx: Context) -> str:
    """Report `steps` progress notifications (1..steps of steps), then say done."""
    for n in range(1, steps + 1):
        await ctx.report_progress(n, steps, f"step {n}")
    return f"done after {steps} steps"


@server.tool()
def for_user() -> list[types.TextContent]:
    """A block for the user only, and one for everyone."""
    return [types.TextContent(text="secret for the user only",
                              annotations=types.Annotations(audience=["user"])),
            types.TextContent(text="for the model too")]


@server.tool()
def task_only() -> str:
    """A tool that must be run as a task (see TestServer)."""
    return "ran without a task"


@server.tool()
def who(ctx: Context) -> str:
    """The client's name and version, as its `initialize` said."""
    params = ctx.session.client_params
    info = params.client_info if params is not None else None
    return f"{info.name} {info.version}" if info is not None else "unknown"


@server.tool()
async def outlive(name: str) -> str:
    """Touch `outlive-started`, then return once the mark `name` exists (60 s at most)."""
    _mark("outlive-started")
    marks = Path(os.environ.get("OPLOOP_TEST_MARKS", "/nonexistent"))
    with anyio.fail_after(60):
        while not (marks / name).exists():
            await anyio.sleep(0.05)
    return f"outlived {name}"


@server.tool()
def chatter(text: str) -> str:
    """Write `text` on stderr."""
    print(f"test server says: {text}", file=sys.stderr, flush=True)
    return "said"


#: How many tools `stdio many` adds.
MANY = 3000


def _add_many() -> None:
    def one(q: str = "") -> str:
        return f"many: {q}"

    for n in range(MANY):
        server.add_tool(one, name=f"many_{n:04d}", description=f"tool {n}: " + "d" * 5000)


def _serve_locked(port: int, token: str) -> None:
    """`/mcp`, and `/locked/mcp` for `Bearer TOKEN` only (401 Unauthorized otherwise)."""
    import uvicorn

    app = server.streamable_http_app()

    async def locked(scope, receive, send):  # a plain ASGI wrapper
        if scope["type"] == "http" and scope["path"].startswith("/locked/"):
            auth = dict(scope["headers"]).get(b"authorization", b"").decode()
            if auth != f"Bearer {token}":
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
            scope = dict(scope, path=scope["path"].removeprefix("/locked"))
        await app(scope, receive, send)

    uvicorn.run(locked, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    if "many" in sys.argv[2:]:
        _add_many()
    if sys.argv[1] == "http" and len(sys.argv) > 3:
        _serve_locked(int(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
