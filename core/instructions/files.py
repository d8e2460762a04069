"""Reading the files that tell the model what to do (AGENTS.md, channel instruction files,
SKILL.md): only regular files with one name, opened without following a final symlink,
at most `max_bytes` of them.

These files are protected configuration: tools can neither write nor create them (the
jail freezes them). Parley refuses a file that has a second hard link, because a tool could
write it through the other name, and a symlinked skill folder, because its target need not be
frozen.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from core.records import record

DEFAULT_MAX_BYTES = 32 * 1024
LIBRARY_SUFFIX = ".md"
MAX_LIBRARY_FILES = 200


class UnreadableFile(Exception):
    """A file Parley will not read as instructions; the message says why."""


@record(frozen=True, slots=True)
class InstructionFile:
    """One instruction file as read at the last (re)load.

    Attributes:
        label: how the system message and `/instructions` name it.
        path: where it was read.
        text: its text (cut to the size limit, which a warning then names).
    """

    label: str
    path: Path
    text: str


def read_text(path: Path, max_bytes: int) -> tuple[str, bool]:
    """The text of `path` (invalid UTF-8 replaced) and whether it was cut at `max_bytes`.

    Raises:
        FileNotFoundError: there is no such file.
        UnreadableFile: a symlink, not a regular file, or a file with several hard links.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last component is a symlink
            raise UnreadableFile(f"{path} is a symlink") from exc
        if isinstance(exc, FileNotFoundError):
            raise
        raise UnreadableFile(f"{path}: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableFile(f"{path} is not a regular file")
        if info.st_nlink > 1:
            raise UnreadableFile(
                f"{path} has {info.st_nlink} hard links (a tool could write it through another)"
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    finally:
        os.close(fd)
    cut = len(data) > max_bytes
    return data[:max_bytes].decode("utf-8", "replace"), cut


def read_instruction(
    path: Path, label: str, max_bytes: int, warnings: list[str]
) -> InstructionFile | None:
    """`path` as an instruction file, or None when it is missing or refused (a warning
    then names it)."""
    try:
        text, cut = read_text(path, max_bytes)
    except FileNotFoundError:
        return None
    except UnreadableFile as exc:
        warnings.append(f"instructions {exc}: not used")
        return None
    if cut:
        warnings.append(f"instructions {path} is longer than {max_bytes} bytes: cut there")
    text = text.strip()
    return InstructionFile(label, path, text) if text else None


def read_library(
    directory: Path, max_bytes: int, warnings: list[str]
) -> dict[str, InstructionFile]:
    """The `*.md` files of `directory` by name (file name without `.md`): what
    `/instructions set NAME` may choose. Missing directory: none."""
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        warnings.append(f"instructions library {directory}: {exc.strerror}")
        return {}
    found: dict[str, InstructionFile] = {}
    for entry in entries:
        if not entry.name.endswith(LIBRARY_SUFFIX) or entry.name.startswith("."):
            continue
        if len(found) >= MAX_LIBRARY_FILES:
            warnings.append(
                f"instructions library {directory}: more than {MAX_LIBRARY_FILES} files"
            )
            break
        name = entry.name.removesuffix(LIBRARY_SUFFIX)
        read = read_instruction(Path(entry.path), name, max_bytes, warnings)
        if read is not None:
            found[name] = read
    return found


__all__ = [
    "DEFAULT_MAX_BYTES",
    "InstructionFile",
    "UnreadableFile",
    "read_instruction",
    "read_library",
    "read_text",
]
