"""Reading the files that tell the model what to do (AGENTS.md, channel instruction files,
SKILL.md): only regular files with one name, opened without following a final symlink,
at most `max_bytes` of them. An instruction file over that is cut at the end of a line,
and a marker line tells the model so (`read_instruction`).

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
LIMIT_KEY = "instructions.max_bytes"  # the setting that bounds every instruction file
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
        text: its text (cut at a line within the size limit, with a marker line saying
            so, and a warning naming it).
    """

    label: str
    path: Path
    text: str


def read_bytes(path: Path, max_bytes: int) -> tuple[bytes, int]:
    """Up to `max_bytes + 1` bytes of `path` (one more shows it goes on) and its size.

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
    return data, max(info.st_size, len(data))  # a file growing meanwhile: at least that


def read_text(path: Path, max_bytes: int) -> tuple[str, bool]:
    """The text of `path` (invalid UTF-8 replaced) and whether it was cut at `max_bytes`.

    Raises:
        FileNotFoundError: there is no such file.
        UnreadableFile: a symlink, not a regular file, or a file with several hard links.
    """
    data, _ = read_bytes(path, max_bytes)
    cut = len(data) > max_bytes
    return data[:max_bytes].decode("utf-8", "replace"), cut


def cut_at_line(data: bytes, max_bytes: int) -> bytes:
    """At most `max_bytes` of `data`, ending with a whole line: the model is never handed
    half a word or half a rule. One line longer than the limit is cut after its last
    space, else after its last whole UTF-8 character."""
    head = data[:max_bytes]
    for end in (b"\n", b" "):
        at = head.rfind(end)
        if at > 0:
            return head[: at + 1]
    return _whole_chars(head)


def _whole_chars(data: bytes) -> bytes:
    """`data` without the part of a UTF-8 character cut off at its end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:  # ASCII: whatever came before it is whole
            return data
        if byte >= 0xC0:  # the lead byte of the last character: is all of it there?
            length = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if back >= length else data[:-back]
    return data


def read_instruction(
    path: Path, label: str, max_bytes: int, warnings: list[str]
) -> InstructionFile | None:
    """`path` as an instruction file, or None when it is missing or refused (a warning
    then names it). A file over `max_bytes` is cut at a line, and the model is told where
    (a marker line); a warning says so."""
    try:
        data, size = read_bytes(path, max_bytes)
    except FileNotFoundError:
        return None
    except UnreadableFile as exc:
        warnings.append(f"instructions {exc}: not used")
        return None
    if len(data) <= max_bytes:
        text = data.decode("utf-8", "replace").strip()
        return InstructionFile(label, path, text) if text else None
    kept = cut_at_line(data, max_bytes)
    at = "a line" if kept.endswith(b"\n") else "a word" if kept.endswith(b" ") else "a character"
    warnings.append(
        f"instructions {path} is {size:,} bytes, over `{LIMIT_KEY}` ({max_bytes:,}): "
        f"cut at the end of {at} after {len(kept):,} bytes; the model is told the rest "
        "is missing"
    )
    marker = f"[… {path.name} cut at {len(kept):,} of {size:,} bytes: the limit is `{LIMIT_KEY}`]"
    text = kept.decode("utf-8", "replace").strip()
    return InstructionFile(label, path, f"{text}\n\n{marker}" if text else marker)


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
    "LIMIT_KEY",
    "InstructionFile",
    "UnreadableFile",
    "cut_at_line",
    "read_bytes",
    "read_instruction",
    "read_library",
    "read_text",
]
