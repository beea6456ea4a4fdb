"""A stdio server's `command` as it can run in the sandbox, checked at `oploop up`.

A stdio server runs in the sandbox: no network (unless its `network` opens it), its
own uid, its own empty workspace as `HOME`. A program that fetches packages when it
starts cannot work there: `npx -y pkg` (every server README's example) downloads
`pkg` unless it is installed, `uvx pkg` always resolves from uv's cache and index.

- `npx [-y|--yes] pkg args...` with `pkg` installed (in the server's `cwd`'s
  `node_modules`, or npm's global `node_modules`) runs that package's program
  directly: `[/usr/lib/node_modules/pkg/dist/index.js, args...]` (the same as npx
  would run, without npx, which writes its cache and logs under `HOME`);
- `npx pkg` with `pkg` not installed, and `uvx`/`uv tool run`, are refused naming
  the fix: install it, then point `command` at the installed program.

No SDK, no subprocess: every actor reads the configuration.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

#: Where npm's global packages live when npx's own installation does not say.
GLOBAL_ROOTS = ("/usr/lib/node_modules", "/usr/local/lib/node_modules")

#: npx options that take no value (everything else before the package is refused).
_NPX_FLAGS = frozenset({"-y", "--yes", "-q", "--quiet", "--no-install", "--prefer-offline",
                        "--offline", "--silent"})


class NotRunnable(ValueError):
    """A command that cannot work in the sandbox; the message says the fix."""


def runnable(command: tuple[str, ...], cwd: str = "") -> tuple[str, ...]:
    """`command` as the sandbox can run it (see the module's docstring); raises
    `NotRunnable` for one that would fetch packages."""
    program = os.path.basename(command[0])
    if program == "uvx" or (program == "uv" and command[1:3] == ("tool", "run")):
        raise NotRunnable(_uvx_fix(command))
    if program == "npx":
        return _npx(command, cwd)
    return command


def _npx(command: tuple[str, ...], cwd: str) -> tuple[str, ...]:
    args = list(command[1:])
    while args and args[0] in _NPX_FLAGS:
        args.pop(0)
    if not args or args[0].startswith("-"):
        raise NotRunnable(f"npx {' '.join(command[1:])}: name the package first (an option "
                          f"oploop does not know: {args[0] if args else 'none'}); or install "
                          f"it and point command at its program")
    spec, rest = args[0], tuple(args[1:])
    package = _package_name(spec)
    for root in _node_roots(command[0], cwd):
        program = _bin_of(Path(root, package), package)
        if program is not None:
            return (str(program), *rest)
    raise NotRunnable(
        f"npx would download {spec} when the server starts, and the sandbox has no network "
        f"for it: install it (`npm install -g {spec}`, or `npm install {spec}` in a folder "
        f"of its own), then point command at its program, e.g. command = "
        f"[\"/usr/bin/{package.rsplit('/', 1)[-1]}\"] or [\"/srv/mcp/node_modules/.bin/"
        f"{package.rsplit('/', 1)[-1]}\"] (see docs/mcp.md)")


def _uvx_fix(command: tuple[str, ...]) -> str:
    args = [a for a in command[1:] if not a.startswith("-") and a not in ("tool", "run")]
    spec = args[0] if args else "PACKAGE"
    name = spec.split("==")[0].split("@")[0]
    import shutil  # (here: every actor imports this module, few check a command; config.py)

    found = shutil.which(name)
    hint = f" (one is installed: command = [\"{found}\", ...])" if found else ""
    return (f"uvx fetches {spec} and its dependencies when the server starts, and the "
            f"sandbox has no network for it: install it in a virtualenv of its own "
            f"(`python3 -m venv /opt/{name} && /opt/{name}/bin/pip install {spec}`, or `uv "
            f"tool install {spec}`), then point command at its program, e.g. command = "
            f"[\"/opt/{name}/bin/{name}\"]{hint} (see docs/mcp.md)")


def _package_name(spec: str) -> str:
    """`@scope/pkg@1.2` -> `@scope/pkg`; `pkg@latest` -> `pkg`."""
    head, at, _ = spec[1:].partition("@")
    return spec[0] + head if at else spec


def _node_roots(npx: str, cwd: str) -> list[str]:
    """The `node_modules` folders npx would look in: the server's `cwd`'s, then npm's
    global one (next to npm itself, found from npx's own installation)."""
    roots = [str(Path(cwd, "node_modules"))] if cwd else []
    import shutil  # (here: every actor imports this module, few check a command; config.py)

    found = shutil.which(npx)
    if found:
        real = Path(os.path.realpath(found))  # .../lib/node_modules/npm/bin/npx-cli.js
        for parent in real.parents:
            if parent.name == "node_modules":
                roots.append(str(parent))
                break
    roots += [r for r in GLOBAL_ROOTS if r not in roots]
    return roots


def _bin_of(folder: Path, package: str) -> Path | None:
    """The program an installed package's `bin` names (the one named like the package
    when there are several), or None."""
    try:
        manifest = json.loads((folder / "package.json").read_text())
    except (OSError, ValueError):
        return None
    bins = manifest.get("bin") if isinstance(manifest, dict) else None
    if isinstance(bins, str):
        target = bins
    elif isinstance(bins, dict) and bins:
        short = package.rsplit("/", 1)[-1]
        target = bins.get(short) or (next(iter(bins.values())) if len(bins) == 1 else None)
    else:
        return None
    if not isinstance(target, str):
        return None
    program = (folder / target).resolve()
    return program if program.is_file() else None
