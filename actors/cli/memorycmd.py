"""`oploop memory [NAME [PATH]]`: the memory folders of `memory = "NAME"` agents.

Read on the spot, without a host: the folders are files of the home
(`$OPLOOP_HOME/memory/NAME`), read through `memoryfs` so that a link planted in
one is refused here as the tool refuses it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from actors import memoryfs, memorytool
from actors.cli.errors import EXIT_OK, fail
from bus.endpoints import oploop_home


def cmd_memory(args: argparse.Namespace) -> int:
    """No NAME: the memory names of this home; NAME: that folder, two levels deep;
    NAME PATH: one file's contents (a path under /memories, or relative to it)."""
    home = oploop_home()
    if not args.name:
        return _names(home / "memory")
    problem = memorytool.folder_name_error(args.name)
    if problem is not None:
        return fail(problem)
    folder = memorytool.folder(home, args.name)
    if not folder.is_dir():
        return fail(f"no memory {args.name!r} in {home} (an agent with memory = "
                    f"\"{args.name}\" makes it on its first call)")
    path = args.path or memoryfs.ROOT
    if not path.startswith(memoryfs.ROOT):
        path = f"{memoryfs.ROOT}/{path.lstrip('/')}"
    if args.path:
        is_error, text = memoryfs.read(str(folder), path)
    else:
        is_error, text = memoryfs.execute(str(folder), {"command": "view", "path": path})
    if is_error:
        return fail(text)
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    return EXIT_OK


def _names(root: Path) -> int:
    try:
        names = sorted(p.name for p in root.iterdir()
                       if p.is_dir() and not p.is_symlink()
                       and memorytool.folder_name_error(p.name) is None)
    except FileNotFoundError:
        names = []
    if not names:
        print(f"no memory folders in {root.parent} (an agent's memory = \"NAME\" makes one)")
        return EXIT_OK
    for name in names:
        try:
            fd = os.open(root / name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                used, entries = memoryfs.usage(fd)
            finally:
                os.close(fd)
            print(f"{name}\t{entries} entries, {used} bytes")
        except OSError as exc:
            print(f"{name}\t({exc.strerror})")
    return EXIT_OK
