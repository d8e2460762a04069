"""The tools' roots on disk: made so that the tools' user can reach them, and the entries
of Parley's configuration that must stay as they are (see `core.sandbox.jail.Jail`)."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path


def config_entries(path: Path | str) -> list[Path]:
    """The directory entries the kernel goes through to open `path` whose replacement
    would change what is read: each symlink met on the way, and the file it ends at
    (its directory resolved). The file need not exist: creating it matters as much."""
    entries: list[Path] = []
    pending = list(Path(os.path.abspath(os.path.expanduser(path))).parts[1:])
    current, hops = Path("/"), 0
    while pending:
        name = pending.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            current = current.parent
            continue
        entry = current / name
        if hops < 40 and entry.is_symlink():  # 40: the kernel's own limit on hops
            hops += 1
            entries.append(entry)
            target = Path(os.readlink(entry))
            if target.is_absolute():
                current = Path("/")
            pending = list(target.parts[1 if target.is_absolute() else 0 :]) + pending
        else:
            current = entry
    return [*entries, current]


def make_root(path: Path, owner: tuple[int, int] | None) -> None:
    """`mkdir -p path`. When the tools run as another user, `owner` (uid, gid): every
    directory made is left traversable by anyone (that user must reach the root:
    programs such as git check each parent with access(), which ignores the tools' DAC
    capabilities) and the root itself is owned by that user (git refuses a repository at
    the top of a directory another user owns). Existing directories stay as they are."""
    missing: list[Path] = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)
        mode = directory.stat().st_mode
        if owner is not None and mode & 0o011 != 0o011:  # a umask such as 077 left it closed
            directory.chmod(stat.S_IMODE(mode) | 0o011)
    if missing and owner is not None:
        os.chown(path, *owner)


def _traversable(path: Path, uid: int, gid: int) -> bool:
    info = path.stat()
    if info.st_uid == uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == gid:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def reach_notes(key: str, root: Path, uid: int, gid: int) -> list[str]:
    """What keeps the tools' user (`uid`, `gid`, no other groups) from using `root` as
    programs expect, for the start-up line: a parent it cannot traverse, another owner."""
    notes = []
    closed = [p for p in reversed(root.parents) if p.exists() and not _traversable(p, uid, gid)]
    if closed:
        notes.append(
            f"{key} {root}: the tools' user cannot traverse {closed[0]}, so programs that "
            "check their path (git) fail there; choose a root outside it"
        )
    owner = root.stat().st_uid if root.exists() else uid
    if owner != uid:
        try:
            name = pwd.getpwuid(owner).pw_name
        except KeyError:
            name = str(owner)
        notes.append(
            f"{key} {root} belongs to {name}, not the tools' user: git refuses a "
            "repository at its top (dubious ownership)"
        )
    return notes
