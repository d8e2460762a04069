"""The real agent, built from a config whose provider is the fake LLM, and a recording
channel end (a `Responder`) for tests that are about the agent rather than a platform."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.app import App, build_registry
from bot.config import ParleyConfig, parse_config
from core.agent import Agent
from core.chat import ApprovalRequest, Inbound
from core.errors import DeliveryFailed
from core.events import LoopEvent, TextDelta
from tests.fakes.llm import FakeLLM


def agent_config(fake_llm: FakeLLM, tmp_path: Path, **overrides: Any) -> ParleyConfig:
    """A valid config: provider `fake` (plus `other`) at the fake LLM, state under tmp_path."""
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    raw: dict[str, Any] = {
        "default_provider": "fake",
        "providers": {
            "fake": {"kind": "openai_chat", "base_url": fake_llm.base_url, "model": "fake-model"},
            "other": {"kind": "openai_chat", "base_url": fake_llm.base_url, "model": "other-model"},
        },
        "store": {
            "path": str(tmp_path / "parley.db"),
            "events_log": str(tmp_path / "events.jsonl"),
        },
        "tools": {
            "workspace": str(workspace),
            # Tests place files where the tools work: one workspace for every
            # conversation. Scopes have their own tests (tests/tools/test_wall_files.py).
            "workspace_scope": "shared",
            "artifacts_dir": str(tmp_path / "artifacts"),
            "tools_file": None,
            "default_timeout": 30,
        },
    }
    _merge(raw, overrides)
    return parse_config(raw)


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    """Deep merge; a None value removes the key (e.g. a provider gone from the config)."""
    for key, value in extra.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


@asynccontextmanager
async def running_agent(
    fake_llm: FakeLLM,
    tmp_path: Path,
    *,
    approval_timeout: float = 300.0,
    responders: Any = None,
    shutdown_grace: float = 5.0,
    environ: dict[str, str] | None = None,
    **config: Any,
) -> AsyncIterator[Agent]:
    """The real `Agent` (store in tmp_path); shut down and closed on exit. `environ`: the
    host variables the application sees (default: none)."""
    _merge(config, {"agent": {"approval_timeout_seconds": approval_timeout}})
    cfg = agent_config(fake_llm, tmp_path, **config)
    app = App(cfg, environ or {}, build_registry(cfg, environ or {}))
    agent = await app.open_agent(responders)
    try:
        yield agent
    finally:
        await app.close_agent(agent, grace=shutdown_grace)
        await app.aclose()


def inbound(text: str, *, key: tuple[str, str, str] = ("test", "c1", ""), **kw: Any) -> Inbound:
    defaults: dict[str, Any] = {"user_id": "u1", "user_name": "alice", "is_dm": True}
    defaults.update(kw)
    return Inbound(key[0], key[1], key[2], text=text, **defaults)


@dataclass
class RecordingStream:
    """One streamed reply: the deltas seen and the final text."""

    deltas: list[str] = field(default_factory=list)
    final: str | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, event: LoopEvent) -> None:
        if isinstance(event, TextDelta):
            self.deltas.append(event.text)

    async def finish(self, text: str) -> None:
        self.final = text
        self.done.set()


@dataclass
class RecordingResponder:
    """A channel end that records everything the agent says into one conversation."""

    approve_with: bool | None = True  # None: never answer (the request times out)
    fail_sends: bool = False
    sent: list[str] = field(default_factory=list)
    streams: list[RecordingStream] = field(default_factory=list)
    approvals: list[ApprovalRequest] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def send(self, text: str) -> None:
        if self.fail_sends:
            raise DeliveryFailed("the fake channel refused the post")
        self.sent.append(text)
        self.changed.set()

    def stream(self) -> RecordingStream:
        stream = RecordingStream()
        self.streams.append(stream)
        return stream

    async def approve(self, request: ApprovalRequest) -> bool:
        self.approvals.append(request)
        if self.approve_with is None:
            await asyncio.sleep(request.timeout)
            return False
        return self.approve_with

    @contextlib.asynccontextmanager
    async def typing(self) -> AsyncIterator[None]:
        yield

    @property
    def finals(self) -> list[str | None]:
        return [s.final for s in self.streams]

    async def wait_sent(self, fragment: str, timeout: float = 10.0) -> str:
        async def found() -> str:
            while True:
                for text in self.sent:
                    if fragment in text:
                        return text
                self.changed.clear()
                await self.changed.wait()

        return await asyncio.wait_for(found(), timeout)
