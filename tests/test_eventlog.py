"""A run's events: the channel hears of each first, then it is recorded (core/eventlog.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.eventlog import EventLog, RunEvents
from core.events import LoopEvent, ToolFinished
from core.messages import Message, ToolCall


def _finished() -> ToolFinished:
    call = ToolCall("c1", "read_file", '{"path": "a.txt"}')
    return ToolFinished(call, Message.tool_result(call, "hello"), 0.01)


def _logged(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["event"] for line in path.read_text().splitlines()]


def test_a_tools_end_reaches_the_channel_before_its_record(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(None, path)
    seen_at_forward: list[list[str]] = []

    def channel(event: LoopEvent) -> None:
        seen_at_forward.append(_logged(path))

    RunEvents(log, channel, run_id="r1", conv="c")(_finished())
    log.close()
    assert seen_at_forward == [[]]  # not yet recorded when the channel heard of it
    assert _logged(path) == ["agent.tool.call"]


def test_an_event_the_channel_fails_on_is_still_recorded(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(None, path)

    def channel(event: LoopEvent) -> None:
        raise ConnectionError("the platform went away")

    with pytest.raises(ConnectionError):
        RunEvents(log, channel, run_id="r1", conv="c")(_finished())
    log.close()
    assert _logged(path) == ["agent.tool.call"]
