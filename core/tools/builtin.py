"""Built-in tools: `bash`, `read_file`, `write_file`, `list_directory` (docs/tools.md).

The file tools check the path (a seatbelt with a clear reason), then do the work on
their run's confined thread (core/sandbox/filejail.py): the kernel grants that thread
exactly what the run's tool processes get."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from pydantic import BaseModel, ConfigDict, Field

from core.errors import ToolDenied, ToolError
from core.sandbox import (
    SandboxSettings,
    budget,
    cap_output,
    mentions_denied_path,
    open_no_symlinks,
    refuse_write,
    resolve_path,
    usage_of,
)
from core.tools.base import Category, Tool, ToolContext, ToolResult
from core.tools.running import file_jail_of, run_in_workspace, site_of

if TYPE_CHECKING:
    from core.seatbelt import BlockVerdict

DEFAULT_READ_LINES = 2000
MAX_LIST_ENTRIES = 1000


class BashParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str = Field(
        min_length=1,
        description="Command line; stdin is closed (no editors, pagers or REPLs).",
    )
    timeout: float | None = Field(
        default=None,
        gt=0,
        le=3600,
        description="Seconds before it and its children are killed.",
    )


def check_command(command: str) -> BlockVerdict:
    """The seatbelt verdict on a command line (core/seatbelt/blocklist.py). Its parser and
    rules (tree-sitter, ~30 ms to import) load at the first `bash` call, not at start-up:
    a turn that runs no command does not pay for them."""
    from core.seatbelt import check_command as check

    return check(command, home=os.path.expanduser("~"))


class BashTool(Tool):
    """Runs a command line with `bash -c` in the workspace."""

    name = "bash"
    description = (
        "Run a bash command in the workspace; returns exit code, stdout and stderr. Long "
        "output is cut to head and tail, the full text saved to a file for read_file."
    )
    category: Category = "write"
    params = BashParams

    def call_timeout(self, args: BaseModel, sandbox: SandboxSettings) -> float:
        assert isinstance(args, BashParams)
        return min(args.timeout or sandbox.default_timeout, sandbox.max_timeout)

    def effective_category(self, args: BaseModel) -> Category:
        assert isinstance(args, BashParams)
        # Blocked and interactive commands stay `write`: run() refuses them without
        # troubling an approver.
        return "admin" if check_command(args.command).kind == "destructive" else "write"

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, BashParams)
        verdict = check_command(args.command)
        if verdict.kind == "blocked":
            raise ToolDenied(
                f"command blocked and not run: {verdict.reason}. If the match is file "
                "content (a heredoc), write the file with write_file instead."
            )
        if verdict.kind == "interactive":
            raise ToolError(f"command refused (stdin is closed): {verdict.reason}")
        sandbox = ctx.sandbox
        # bash is not bound by the file-tool walls, so at least refuse naming a denied path.
        denied = mentions_denied_path(args.command, sandbox, site_of(ctx))
        if denied is not None:
            raise ToolDenied(f"permission denied: the command names the denied path {denied}")
        timeout = self.call_timeout(args, sandbox)
        return await run_in_workspace(["bash", "-c", args.command], ctx, timeout=timeout)


class ReadFileParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, description="File to read; relative to the workspace.")
    offset: int = Field(default=1, ge=1, description="First line to return (1 = first line).")
    limit: int = Field(
        default=DEFAULT_READ_LINES,
        ge=1,
        le=100_000,
        description="Maximum lines to return.",
    )


def _open_nofollow(path: Path, flags: int) -> BinaryIO:
    """Open a checked path. O_NOFOLLOW stops a symlink swapped in since the check; a
    regular file with another hard link is refused, since the other name may be a denied
    path (a link made in the workspace to `~/.ssh/id_rsa` passes every path check).
    O_NONBLOCK: a FIFO with no writer must not hold the run's file thread forever."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
            raise ToolDenied(
                f"permission denied: {path} has {info.st_nlink} hard links, and another name "
                "of the file may be a denied path"
            )
        if flags != os.O_RDONLY and stat.S_ISFIFO(info.st_mode):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb" if flags == os.O_RDONLY else "wb")


def _count_lines(f: BinaryIO) -> int:
    count, last = 0, b"\n"
    while chunk := f.read(1 << 20):
        count += chunk.count(b"\n")
        last = chunk[-1:]
    return count + (last != b"\n")


def _read_page(path: Path, offset: int, limit: int, cap: int) -> tuple[bytes, int, int]:
    """Lines offset.. (at most `limit`, stopping before `cap` bytes unless the first line
    alone exceeds it). Returns (page, last line shown, total lines). Runs on the run's
    confined file thread: a directory raises IsADirectoryError."""
    if stat.S_ISDIR(os.stat(path).st_mode):
        raise IsADirectoryError(path)
    with _open_nofollow(path, os.O_RDONLY) as f:
        return _page_of(f, offset, limit, cap)


def _page_of(f: BinaryIO, offset: int, limit: int, cap: int) -> tuple[bytes, int, int]:
    page = bytearray()
    last = total = 0
    for number, line in enumerate(f, start=1):
        total = number
        if number < offset:
            continue
        if number >= offset + limit or (page and len(page) + len(line) > cap):
            return bytes(page), last, number + _count_lines(f)
        page += line
        last = number
    return bytes(page), last, total


INLINE_READ_BYTES = 256 * 1024
"""A regular file up to this size is read on the event loop: microseconds, where the hand-off
to the run's file thread costs ~0.2 ms."""


def _read_inline(path: Path, offset: int, limit: int, cap: int) -> tuple[bytes, int, int] | None:
    """The page, read here when that is as safe as on the run's confined thread: `path`
    passed the run's path rules, and the kernel opens exactly it (openat2 with no symlink
    or /proc magic link anywhere on the way, so nothing swapped in since the check is
    followed); a small regular file with one name. None: anything else, for the thread."""
    try:
        fd = open_no_symlinks(str(path), os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None  # missing, a symlink, no openat2: the confined thread says what
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1 or info.st_size > INLINE_READ_BYTES:
            return None
        return _page_of(f, offset, limit, cap)


class ReadFileTool(Tool):
    """Reads a text file inside the sandbox, a page of lines at a time."""

    name = "read_file"
    description = (
        "Read a text file inside the allowed directories. Returns up to `limit` lines "
        "starting at line `offset`; a footer says how to fetch the next page."
    )
    category: Category = "read"
    params = ReadFileParams

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, ReadFileParams)
        files = file_jail_of(ctx)
        path = resolve_path(
            args.path, ctx.sandbox, for_write=False, site=files.site, readable=files.readable
        )
        cap = ctx.sandbox.output_cap_bytes
        try:
            page_of = _read_inline(path, args.offset, args.limit, cap)
            if page_of is None:
                page_of = await files.run(_read_page, path, args.offset, args.limit, cap)
            page, last, total = page_of
        except FileNotFoundError:
            raise ToolError(f"`{args.path}` does not exist ({path})") from None
        except IsADirectoryError:
            raise ToolError(f"`{args.path}` is a directory; use list_directory") from None
        except OSError as exc:
            raise ToolError(f"cannot read `{args.path}`: {exc.strerror or exc}") from exc
        if total == 0:
            return ToolResult("(empty file)")
        if args.offset > total:
            raise ToolError(
                f"offset {args.offset} is past the end of `{args.path}` ({total} lines)"
            )
        text, truncated, _cut = cap_output(page, cap, path)
        if args.offset > 1 or last < total:
            more = f"; next: offset={last + 1}" if last < total else ""
            text = f"{text.rstrip(chr(10))}\n[lines {args.offset}–{last} of {total}{more}]"
        return ToolResult(text, artifacts=(path,) if truncated else ())


class WriteFileParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, description="File to write; relative to the workspace.")
    content: str = Field(description="The full new content of the file (UTF-8).")


def _write(path: Path, data: bytes, limit: int | None, why: str) -> int:
    """Write `data` to `path` unless it adds more than `limit` bytes (the write quota);
    the bytes it added. Runs on the run's confined file thread."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        old = 0
    else:
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(path)
        old = info.st_size if stat.S_ISREG(info.st_mode) else 0
    if limit is not None and len(data) - old > limit:
        raise refuse_write(len(data) - old, limit, why)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Truncate only after the hard-link check: O_TRUNC would empty the other name's file.
    with _open_nofollow(path, os.O_WRONLY | os.O_CREAT) as f:
        f.truncate(0)
        f.write(data)
    return len(data) - old


class WriteFileTool(Tool):
    """Creates or replaces a file inside the sandbox."""

    name = "write_file"
    description = "Create or overwrite a file inside the allowed directories (parents are created)."
    category: Category = "write"
    params = WriteFileParams

    @property
    def idempotent(self) -> bool:
        # Writing the same content twice leaves the same file.
        return True

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, WriteFileParams)
        sandbox = ctx.sandbox
        files = file_jail_of(ctx)
        path = resolve_path(args.path, sandbox, for_write=True, site=files.site)
        data = args.content.encode("utf-8")
        if sandbox.max_file_bytes and len(data) > sandbox.max_file_bytes:
            raise ToolError(
                f"{len(data):,} bytes is over the largest file a tool may write "
                f"({sandbox.max_file_bytes:,}, tools.max_file_bytes)"
            )
        limit, why = budget(sandbox, files.site)
        try:
            added = await files.run(_write, path, data, limit, why)
        except IsADirectoryError:
            raise ToolError(f"`{args.path}` is a directory") from None
        except OSError as exc:
            raise ToolError(f"cannot write `{args.path}`: {exc.strerror or exc}") from exc
        usage_of(files.site).charge(added)
        return ToolResult(f"wrote {len(data):,} bytes to {path}")


class ListDirectoryParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        default=".", min_length=1, description="Directory to list; relative to the workspace."
    )


def _list(path: Path) -> list[str]:
    # On the run's confined file thread; not a directory raises NotADirectoryError.
    with os.scandir(path) as it:
        entries = sorted(it, key=lambda e: e.name)
    # ls -F style markers: the model knows them and they cost one character.
    return [e.name + ("@" if e.is_symlink() else "/" if e.is_dir() else "") for e in entries]


class ListDirectoryTool(Tool):
    """Lists a directory inside the sandbox."""

    name = "list_directory"
    description = (
        "List a directory inside the allowed directories, sorted; directories end with "
        "`/`, symlinks with `@`."
    )
    category: Category = "read"
    params = ListDirectoryParams

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, ListDirectoryParams)
        files = file_jail_of(ctx)
        path = resolve_path(
            args.path, ctx.sandbox, for_write=False, site=files.site, readable=files.readable
        )
        try:
            names = await files.run(_list, path)
        except (NotADirectoryError, FileNotFoundError):
            raise ToolError(f"`{args.path}` is not a directory ({path})") from None
        except OSError as exc:
            raise ToolError(f"cannot list `{args.path}`: {exc.strerror or exc}") from exc
        if not names:
            return ToolResult(f"{path}/: (empty directory)")
        shown = names[:MAX_LIST_ENTRIES]
        lines = [f"{path}/:", *shown]
        if len(names) > len(shown):
            lines.append(f"… and {len(names) - len(shown):,} more entries not shown")
        return ToolResult("\n".join(lines))


def builtin_tools() -> list[Tool]:
    """One instance of each built-in tool."""
    return [BashTool(), ReadFileTool(), WriteFileTool(), ListDirectoryTool()]
