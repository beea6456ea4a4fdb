"""The file tools' system calls, shared by the sandbox launcher and the unconfined tools:
for now the one atomic writer of `write_file`, sandboxed or not.

Standard library only, and cheap to import: the sandbox launcher imports this
file as a top-level module (its bootstrap puts `actors/` on `sys.path`) on every
sandboxed write; the unsandboxed `write_file` imports it as `actors.fileops`.
"""

from __future__ import annotations

import os


def write_atomic(target: str, data: bytes) -> str:
    """Replace `target` with `data` atomically, through a symlink, making parent dirs.

    The real path is resolved first, so a symlink is written through as an
    editor would; the temporary file lives in the same directory, so the final
    rename is atomic and a reader sees the old file or the new one.
    """
    real = os.path.realpath(target)
    os.makedirs(os.path.dirname(real) or ".", exist_ok=True)
    name = f".{os.path.basename(real)}.{os.urandom(4).hex()}.tmp"
    tmp = os.path.join(os.path.dirname(real), name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    done = False
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        # (No contextlib.suppress in this file: one more import on every sandboxed call.)
        try:  # noqa: SIM105 -- keep an existing file's permissions (an executable script)
            os.chmod(tmp, os.stat(real).st_mode & 0o7777)
        except FileNotFoundError:
            pass
        os.replace(tmp, real)
        done = True
    finally:
        os.close(fd)
        if not done:
            try:  # noqa: SIM105
                os.unlink(tmp)
            except OSError:
                pass
    return real
