"""MCP tools as Parley tools: `mcp__<server>__<tool>`, with the category the server's
configuration gives (core/mcp/config.py), run through the same executor, policy,
approvals and journal as every other tool.

A call's result reaches the model as text: text blocks as they are, embedded text
resources by their text, images, audio and binary resources as a one-line note, and
structured content as JSON when there is nothing else. An `isError` result is an error
result, with the end of what a stdio server wrote to stderr meanwhile. A result longer
than `output_cap_bytes` is cut to head and tail like a tool process's output, the whole
kept as an artifact the conversation's tools can read.

Resources and prompts are offered only where `resources` / `prompts` name a category:
`mcp__<server>__resources_list`, `…__resources_read`, `…__prompts_list`, `…__prompts_get`.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import Client
from pydantic import BaseModel, ConfigDict, Field

from core.errors import ToolValidationError
from core.mcp.config import OfferedCategory
from core.mcp.connection import McpConnection, RemoteTool, stderr_note
from core.sandbox import CappedStream, call_quota, prepare_site
from core.tools.base import Tool, ToolContext, ToolResult, compact_schema, parse_arguments
from core.tools.running import site_of

PREFIX = "mcp__"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME = 64  # what every provider accepts


def tool_name(server: str, tool: str) -> str:
    """The name the model sees: `mcp__<server>__<tool>`, in the characters every provider
    accepts, at most 64 long (a longer one ends with a hash of the whole)."""
    name = f"{PREFIX}{server}__{_UNSAFE.sub('_', tool)}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: _MAX_NAME - 9]}_{digest}"


class McpArguments(BaseModel):
    """A call's arguments, checked against the server's input schema."""

    model_config = ConfigDict(frozen=True)

    values: dict[str, Any] = Field(default={})


class McpTool(Tool):
    """One tool of an MCP server."""

    params = McpArguments
    deferrable = True

    def __init__(
        self, name: str, remote: RemoteTool, connection: McpConnection, category: OfferedCategory
    ) -> None:
        self.name = name
        self.remote = remote
        self.connection = connection
        self.category = category
        self.description = remote.description or f"`{remote.name}` of MCP server {connection.name}"
        self.timeout = connection.config.timeout_seconds
        schema = compact_schema(remote.input_schema)
        if not isinstance(schema, dict) or schema.get("type") not in (None, "object"):
            schema = {"type": "object", "properties": {}}
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        self._schema: dict[str, Any] = schema
        self._validator = _validator(schema)

    def schema(self) -> dict[str, Any]:
        return self._schema

    def validate(self, raw_arguments: str) -> BaseModel:
        data = parse_arguments(self.name, raw_arguments)
        if self._validator is not None:
            problems = sorted(self._validator.iter_errors(data), key=lambda e: list(e.path))
            if problems:
                where = "; ".join(
                    f"{'.'.join(str(p) for p in e.path) or '(root)'}: {e.message}"
                    for e in problems[:5]
                )
                raise ToolValidationError(f"invalid arguments for `{self.name}`: {where}")
        return McpArguments(values=data)

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, McpArguments)
        remote = self.remote.name

        async def call(client: Client) -> types.CallToolResult:
            return await client.call_tool(remote, args.values)

        timeout = self.call_timeout(args, ctx.sandbox)
        mark = self.connection.stderr_mark()
        result = await self.connection.request(f"`{remote}`", call, timeout)
        text = content_text(result.content)
        if not text and result.structured_content is not None:
            text = json.dumps(result.structured_content, ensure_ascii=False)
        if result.is_error:
            text = f"error (reported by MCP server `{self.connection.name}`): {text or 'no detail'}"
            text += stderr_note(self.connection.stderr_since(mark))
        return capped(text or "(no output)", result.is_error, ctx)


def _validator(schema: dict[str, Any]) -> Any:
    """A JSON Schema validator for `schema`, or None when the server's schema is itself
    invalid (the server then checks its arguments alone)."""
    from jsonschema import exceptions, validators

    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except exceptions.SchemaError:
        return None
    return cls(schema)


def content_text(blocks: list[Any]) -> str:
    """The text of MCP content blocks, one block per paragraph."""
    parts: list[str] = []
    for block in blocks:
        match block:
            case types.TextContent():
                parts.append(block.text)
            case types.ImageContent() | types.AudioContent():
                size = len(block.data) * 3 // 4
                parts.append(f"[{block.type} ({block.mime_type}, ~{size:,} bytes) not shown]")
            case types.EmbeddedResource():
                parts.append(_resource_text(block.resource))
            case types.ResourceLink():
                parts.append(f"[resource {block.uri}: {block.name}]")
            case _:
                parts.append(f"[{getattr(block, 'type', 'unknown')} content not shown]")
    return "\n\n".join(parts)


def _resource_text(contents: Any) -> str:
    if isinstance(contents, types.TextResourceContents):
        return contents.text
    mime = getattr(contents, "mime_type", None) or "binary"
    return f"[resource {contents.uri} ({mime}) not shown]"


def capped(text: str, is_error: bool, ctx: ToolContext) -> ToolResult:
    """`text` as a tool result, cut to head and tail past `output_cap_bytes` with the
    whole kept as an artifact of the conversation (within its write quota)."""
    data = text.encode()
    cap = ctx.sandbox.output_cap_bytes
    if len(data) <= cap:
        return ToolResult(text, is_error=is_error)
    site = site_of(ctx)
    prepare_site(site)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    path: Path = site.artifacts / f"{stamp}-{secrets.token_hex(4)}.mcp.txt"
    stream = CappedStream(cap, path, call_quota(ctx.sandbox, site, []))
    try:
        stream.feed(data)
    finally:
        stream.close()
    cut, artifact = stream.result()
    note = (
        "\nnote: output was cut; full output in "
        f"{artifact} (page through it with read_file offset/limit)"
        if artifact is not None
        else ""
    )
    return ToolResult(cut + note, is_error, (artifact,) if artifact is not None else ())


# --- resources and prompts ------------------------------------------------------------------


class _NoArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _ReadResource(BaseModel):
    model_config = ConfigDict(extra="forbid")

    uri: str = Field(min_length=1, description="The resource's URI, from resources_list.")


class _GetPrompt(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="The prompt's name, from prompts_list.")
    arguments: dict[str, str] = Field(default={}, description="Its arguments.")


class McpFeatureTool(Tool):
    """One of the resource and prompt tools of a server that offers them."""

    deferrable = True

    def __init__(self, connection: McpConnection, action: str, category: OfferedCategory) -> None:
        self.connection, self.action, self.category = connection, action, category
        self.name = tool_name(connection.name, action)
        self.timeout = connection.config.timeout_seconds
        server = connection.name
        kinds: dict[str, tuple[type[BaseModel], str]] = {
            "resources_list": (_NoArguments, f"List the resources MCP server {server} offers."),
            "resources_read": (_ReadResource, f"Read one resource of MCP server {server}."),
            "prompts_list": (_NoArguments, f"List the prompts MCP server {server} offers."),
            "prompts_get": (_GetPrompt, f"Get one prompt of MCP server {server}, filled in."),
        }
        self.params, self.description = kinds[action]

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        timeout = self.call_timeout(args, ctx.sandbox)
        request = self.connection.request
        if isinstance(args, _ReadResource):
            read = await request(
                f"reading {args.uri}", lambda c: c.read_resource(args.uri), timeout
            )
            text = "\n\n".join(_resource_text(part) for part in read.contents)
        elif isinstance(args, _GetPrompt):
            got = await request(
                f"prompt `{args.name}`", lambda c: c.get_prompt(args.name, args.arguments), timeout
            )
            text = "\n\n".join(f"{m.role}: {content_text([m.content])}" for m in got.messages)
        elif self.action == "resources_list":
            listed = await request("resources/list", lambda c: c.list_resources(), timeout)
            text = "\n".join(
                f"- {r.uri} — {r.name}{f': {r.description}' if r.description else ''}"
                for r in listed.resources
            )
        else:
            prompts = await request("prompts/list", lambda c: c.list_prompts(), timeout)
            text = "\n".join(
                f"- {p.name}{f': {p.description}' if p.description else ''}"
                + (f" (arguments: {', '.join(a.name for a in p.arguments)})" if p.arguments else "")
                for p in prompts.prompts
            )
        return capped(text or "(none)", False, ctx)


__all__ = ["PREFIX", "McpFeatureTool", "McpTool", "capped", "content_text", "tool_name"]
