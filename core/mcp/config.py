"""`[mcp.servers.<name>]`: the MCP servers Parley connects to, and the category of each
of their tools. Plain settings: nothing here imports the `mcp` SDK, so a configuration
without servers costs nothing to load.

A tool's category, from the first that applies:

1. its entry under `[mcp.servers.<name>.tools]` (`read | write | admin | deny`);
2. `trust_annotations = true` and the server marks it `readOnlyHint`: `read`;
3. the server's `default` — raised to `admin` when the server marks the tool
   `destructiveHint` (an annotation may make a tool ask; it never makes one ask less).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core.errors import ConfigError

McpCategory = Literal["read", "write", "admin", "deny"]
OfferedCategory = Literal["read", "write", "admin"]

SERVER_NAME = re.compile(r"[a-z0-9_]+")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HEADER_NAME = re.compile(r"[A-Za-z0-9-]+")


class McpServerConfig(BaseModel):
    """One MCP server: a command run over stdio inside the sandbox, or an HTTP URL."""

    model_config = ConfigDict(extra="forbid")

    command: list[str] | None = Field(
        None,
        min_length=1,
        description="stdio: the program and its arguments (a relative path is taken from "
        "config.toml's directory).",
    )
    url: str | None = Field(None, description="Streamable HTTP: the server's endpoint.")
    env: list[str] = Field(
        default=[],
        description="stdio: names of host variables passed to the server (values never here).",
    )
    headers_env: dict[str, str] = Field(
        default={},
        description="HTTP: header name → the host variable that holds its value.",
    )
    default: McpCategory = Field("admin", description="Category of tools not listed in `tools`.")
    tools: dict[str, McpCategory] = Field(
        default={}, description="Per-tool category, by the server's tool name."
    )
    trust_annotations: bool = Field(
        False, description="Let the server's `readOnlyHint` make a tool `read`."
    )
    timeout_seconds: float = Field(60.0, gt=0, le=3600, description="Longest a call may run.")
    connect_timeout_seconds: float = Field(
        15.0,
        gt=0,
        le=300,
        description="Longest the start (process, handshake, tool list) may take.",
    )
    max_restarts: int = Field(
        5, ge=1, le=100, description="Losses within 5 minutes that park the server."
    )
    resources: OfferedCategory | None = Field(
        None, description="Offer the server's resources (list and read) as tools of this category."
    )
    prompts: OfferedCategory | None = Field(
        None, description="Offer the server's prompts (list and get) as tools of this category."
    )
    directory: Path | None = Field(
        None,
        description="stdio: the server's own read-write directory (its working directory); "
        "default: `mcp/<name>` beside the store (`~/.parley/mcp/<name>`).",
    )
    read_paths: list[Path] = Field(
        default=[],
        description="stdio: more files or directories the server may read (its `command` "
        "files and the interpreter and installation they resolve to always are).",
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(
                    f"`{name}` is not a variable name (the value goes in the host env)"
                )
        return names

    @field_validator("headers_env")
    @classmethod
    def _header_names(cls, headers: dict[str, str]) -> dict[str, str]:
        for header, variable in headers.items():
            if not HEADER_NAME.fullmatch(header):
                raise ValueError(f"`{header}` is not an HTTP header name")
            if not ENV_NAME.fullmatch(variable):
                raise ValueError(f"`{variable}` (for {header}) is not a variable name")
        return headers

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"`{url}` is not an http(s) URL")
        if parts.username or parts.password:
            raise ValueError("credentials do not belong in the URL: use `headers_env`")
        return url

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("set exactly one of `command` (stdio) and `url` (HTTP)")
        if self.url is not None:
            stdio_only = [k for k in ("env", "directory", "read_paths") if getattr(self, k)]
            if stdio_only:
                raise ValueError(
                    f"`{stdio_only[0]}` applies to stdio servers; an HTTP server takes its "
                    "credentials from `headers_env`"
                )
        elif self.headers_env:
            raise ValueError("`headers_env` applies to HTTP servers; a stdio server gets `env`")
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"

    def category(
        self, tool: str, *, read_only_hint: bool | None, destructive_hint: bool | None
    ) -> McpCategory:
        """The category of the server's tool `tool` (see the module docstring)."""
        listed = self.tools.get(tool)
        if listed is not None:
            return listed
        if self.trust_annotations and read_only_hint is True:
            return "read"
        if destructive_hint is True and self.default in ("read", "write"):
            return "admin"
        return self.default

    def only_reads(self) -> bool:
        """Every category the configuration gives is `read` (or `deny`): the process may
        write nowhere but its temp dir. (An annotation may still make one of its tools
        ask first; the kernel holds it to reading either way.)"""
        categories = {self.default, *self.tools.values(), self.resources, self.prompts}
        return categories <= {"read", "deny", None}


class McpConfig(BaseModel):
    """`[mcp]`: the servers, by name."""

    model_config = ConfigDict(extra="forbid")

    servers: dict[str, McpServerConfig] = Field(default={})

    @field_validator("servers")
    @classmethod
    def _server_names(cls, servers: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        for name in servers:
            if not SERVER_NAME.fullmatch(name):
                raise ValueError(f"server name `{name}` must be lower-case [a-z0-9_]+")
        return servers


def command_files(config: McpServerConfig, base: Path) -> list[Path]:
    """The files a stdio server's `command` names outside the system dirs: its program
    and scripts. They are Parley's configuration (tools may not change them) and the
    server may read them. A relative path is taken from `base` (config.toml's directory).
    (Under the system dirs a program is read-only to tools already.)"""
    from core.sandbox import SYSTEM_ROOTS

    found: list[Path] = []
    for item in config.command or ():
        if item.startswith("-"):
            continue
        path = Path(os.path.expanduser(item))
        path = path if path.is_absolute() else base / path
        if path.is_file():
            resolved = path.resolve()
            if not any(resolved.is_relative_to(root) for root in SYSTEM_ROOTS):
                found.append(path)
    return found


def check_env(name: str, config: McpServerConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The HTTP headers `headers_env` names, with their values.

    Raises:
        ConfigError: a variable that `env` or `headers_env` names is not set.
    """
    for variable in config.env:
        if variable not in environ:
            raise ConfigError(
                f"mcp.servers.{name}.env",
                f"host variable `{variable}` is not set",
                f"export {variable} before starting Parley, or remove it from the list",
            )
    headers = {}
    for header, variable in config.headers_env.items():
        if variable not in environ:
            raise ConfigError(
                f"mcp.servers.{name}.headers_env.{header}",
                f"host variable `{variable}` is not set",
                f"export {variable} before starting Parley, or remove the header",
            )
        headers[header] = environ[variable]
    return headers


__all__ = [
    "McpCategory",
    "McpConfig",
    "McpServerConfig",
    "OfferedCategory",
    "check_env",
    "command_files",
]
