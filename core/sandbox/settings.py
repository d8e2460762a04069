"""The sandbox's settings (docs/tools.md): where tools may work, what they may read, their
limits. Shared by the tool contract (`core.tools.base`) and the jail that enforces them."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

DEFAULT_ENV_ALLOWLIST = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TERM", "SHELL", "TMPDIR", "TZ")
DEFAULT_DENIED_PATHS = (
    "~/.ssh",
    "~/.gnupg",
    "~/.aws",
    "~/.config/gcloud",
    "~/.kube",
    "~/.netrc",
    "/etc/shadow",
    "/etc/passwd",
    "/etc/sudoers",
)


def default_temp_root() -> Path:
    return Path(tempfile.gettempdir()) / "parley"


class SandboxSettings(BaseModel):
    """Where tools may touch the filesystem and what they may see and print."""

    model_config = ConfigDict(extra="forbid")

    workspace: Path | None = Field(
        default=None,
        description="Working directory of `bash` and the default root for file tools; "
        "unset: `default_workspace()`.",
    )
    allowed_paths: list[Path] = Field(
        default=[],
        description="Extra roots file tools may use (the workspace and a temp dir always are).",
    )
    denied_paths: list[Path] = Field(
        default_factory=lambda: [Path(p) for p in DEFAULT_DENIED_PATHS],
        description="Paths no tool may touch, even inside an allowed root.",
    )
    output_cap_bytes: int = Field(default=64 * 1024, ge=1024, description="Bytes kept per stream.")
    default_timeout: float = Field(default=120.0, gt=0, le=600)
    max_timeout: float = Field(default=600.0, gt=0, le=3600)
    env_allowlist: list[str] = Field(default_factory=lambda: list(DEFAULT_ENV_ALLOWLIST))
    artifacts_dir: Path = Field(
        default=Path("~/.parley/artifacts"),
        description="Where full outputs that were cut are kept for `read_file`.",
    )
    sandbox: Literal["auto", "required", "off"] = Field(
        default="auto",
        description="Kernel sandbox for tool processes: `auto` uses Landlock where the kernel "
        "has it (and says loudly when not), `required` refuses to start without it.",
    )
    network: bool | Literal["public"] = Field(
        default=True,
        description='True: open; False: no socket but a unix socketpair; "public": the '
        "internet only, not loopback, private or link-local addresses.",
    )
    unix_sockets: list[Path] = Field(
        default=[],
        description="Pathname unix sockets tools may connect to (absolute paths); "
        "every other unix socket is refused.",
    )
    run_as: str = Field(
        default="nobody",
        description="When Parley runs as root, tools run as this unprivileged user; empty: root.",
    )
    read_only_paths: list[Path] = Field(
        default=[],
        description="Extra roots tools may read and execute from (system dirs always are).",
    )
    max_cpu_seconds: int = Field(default=600, ge=0, description="CPU seconds per process; 0: none.")
    max_processes: int = Field(
        default=512, ge=0, description="Processes the tool user may add; 0: no limit."
    )
    max_file_bytes: int = Field(default=1 << 30, ge=0, description="Largest file a tool writes.")
    max_memory_bytes: int = Field(
        default=8 << 30,
        ge=0,
        description="Address space per tool process (an MCP server: its data size).",
    )
    workspace_scope: Literal["channel", "conversation", "shared"] = Field(
        default="channel",
        description="Who shares a workspace directory under `workspace`: each channel (chat, "
        "DM) has its own, each conversation (thread) has its own, or all share the root.",
    )
    max_call_write_bytes: int = Field(
        default=100 << 20,
        ge=0,
        description="Bytes one tool call may add to its workspace, temp dir and artifacts; "
        "0: no limit.",
    )
    max_conversation_write_bytes: int = Field(
        default=1 << 30,
        ge=0,
        description="Bytes a conversation's tool calls and artifacts may hold (its oldest "
        "artifacts are deleted first when over); 0: no limit.",
    )

    _cache: dict[str, Any] = PrivateAttr(default_factory=dict)

    def resolved_workspace(self) -> Path:
        """The workspace, symlinks resolved once per configuration (as the path rules
        are): the system prompt names it every turn, and resolving took ~9 lstat calls."""
        return self._resolved("workspace", self.workspace or self.default_workspace())

    def default_workspace(self) -> Path:
        """`~/.parley/workspace`; for a root Parley whose tools run as another user,
        `$STATE_DIRECTORY/workspace` (systemd's StateDirectory=) or
        `/var/lib/parley/workspace`: that user cannot reach into root's home (0700), and
        programs such as git, which check every parent of their directory, fail there."""
        if os.geteuid() == 0 and self.run_as:
            state = os.environ.get("STATE_DIRECTORY", "").split(":")[0] or "/var/lib/parley"
            return Path(state) / "workspace"
        return Path("~/.parley/workspace")

    def resolved_artifacts(self) -> Path:
        return self._resolved("artifacts", self.artifacts_dir)

    def _resolved(self, key: str, path: Path) -> Path:
        resolved = self._cache.get(key)
        if resolved is None:
            resolved = self._cache[key] = Path(os.path.expanduser(path)).resolve()
        assert isinstance(resolved, Path)
        return resolved
