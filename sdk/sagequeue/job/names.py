"""The one check every name read from a remote cache passes before it becomes a local path.

A remote cache is written by other jobs, and with S3 by anyone with write access to the prefix: the file
names in a manifest, the paths of a Hub tree and the entries of a registry record are not trusted. A name
is accepted only when it is a relative POSIX path of ordinary components (no empty, `.` or `..`
component, no leading `/`, no backslash, no NUL, no control character), and the path it makes under a
directory, once every symbolic link on the way is resolved, is still inside that directory. Restore (both
backends, and any other kind of cache that stages files) writes only through `path_inside`.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

#: Longest name accepted (bytes of UTF-8): far above any Neuron file name, below every file system's limit.
MAX_NAME_BYTES = 1024


class UnsafeNameError(ValueError):
    """A name from a remote cache that would leave the directory it is meant for."""


def check_name(name: str, what: str = "file") -> str:
    """`name` itself when it is a safe relative path, else UnsafeNameError naming the problem."""
    problem = _problem(name)
    if problem is not None:
        raise UnsafeNameError(f"{what} name {name!r}: {problem}")
    return name


def _problem(name: str) -> str | None:
    if not isinstance(name, str) or not name:
        return "empty"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"longer than {MAX_NAME_BYTES} bytes"
    if any(ord(c) < 32 or c == "\x7f" for c in name):
        return "contains a control character"
    if "\\" in name:
        return "contains a backslash"
    if name.startswith("/") or PurePosixPath(name).is_absolute():
        return "is an absolute path"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "has an empty, '.' or '..' component"
    return None


def path_inside(top: Path, name: str, what: str = "file") -> Path:
    """`top / name`, refused when the name is unsafe or the path, symbolic links resolved, leaves `top`."""
    check_name(name, what)
    base = Path(os.path.realpath(top))
    target = Path(os.path.realpath(top / name))
    if target == base or not target.is_relative_to(base):
        raise UnsafeNameError(f"{what} name {name!r}: resolves to {target}, outside {base}")
    return top / name
