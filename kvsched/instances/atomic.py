"""Atomic file output: a file is replaced in one step once its new content is written, never half-written.

The commands write every output through :func:`atomic_output` (:mod:`kvsched.commands.common` re-exports it),
and so do the writers below them that write tables of their own (the executor's replay and profile tables).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvsched.errors import InputError


@contextmanager
def atomic_output(path: str | Path, what: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` in one step.

    A crash or an interrupt while writing leaves the old file (or none), never a
    half-written one. The temporary name keeps the suffix, so writers that pick
    a format by it (figures, Parquet) work unchanged.

    Parameters
    ----------
    path
        The file to write.
    what
        The flag that names ``path`` (``"--out"``), for the error of a write the system refuses: that
        is one :class:`InputError` naming ``what`` and ``path``, never the temporary file, a name the
        user did not give.
    """
    target = Path(path)
    if target.is_symlink() or (target.exists() and not target.is_file()):
        # A device, pipe or terminal, or a link (-o /dev/stdout, a link even when the shell redirects it to
        # a file): written in place, never replaced; replacing the link would put a file in its place.
        yield target
        return
    import tempfile  # here: only a command that writes a file needs it (~5 ms to import)

    label = f"{what}: " if what else ""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=target.suffix)
    except OSError as exc:  # a folder that takes no new file (/proc): its error would name the temporary one
        raise InputError(f"{label}{target} cannot be written ({exc.strerror or exc})") from None
    os.close(fd)
    tmp = Path(tmp_name)
    tmp_names = {tmp_name, str(tmp)}  # as mkstemp spelled it, and as a writer given ``tmp`` spells it
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; give it a normal file's mode
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        named = {os.fspath(f) for f in (exc.filename, exc.filename2) if isinstance(f, str | os.PathLike)}
        if named & tmp_names:  # the temporary file refused (a full disk): say so of the file the user named
            raise InputError(f"{label}{target} cannot be written ({exc.strerror or exc})") from None
        raise
    except InputError as exc:
        tmp.unlink(missing_ok=True)
        message = str(exc)
        # An API writer (save_schedule) names the file it was given: ours. The longer spelling first, in case
        # one contains the other.
        for name in sorted(tmp_names, key=len, reverse=True):
            message = message.replace(name, str(target))
        if message != str(exc):
            raise InputError(message) from None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


__all__ = ["atomic_output"]
