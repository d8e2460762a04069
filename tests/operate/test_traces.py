"""One trace per run (docs/operations.md#traces): the span tree of a tool-using run, with
the OpenTelemetry GenAI attribute names, collected by the SDK's in-memory exporter; the
trace id is in the run's events."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.inspect import runs_command
from core import tracing
from tests.agentkit import RecordingResponder, agent_config, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec

sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="the parley[otel] extra")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider.get_tracer("parley"))
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


async def test_a_tool_using_run_is_one_trace_of_llm_and_tool_spans(
    fake_llm: FakeLLM,
    tmp_path: Path,
    spans: InMemorySpanExporter,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "a.txt", "content": "hi"})]),
        Reply(text="wrote it", usage=(120, 7)),
    )
    async with running_agent(fake_llm, tmp_path) as agent:
        report = await agent.run(inbound("write a file"), RecordingResponder())
        assert report.state == "completed", report
        events = await agent.store.events(report.run_id)

    finished = spans.get_finished_spans()
    runs = [s for s in finished if s.name == "invoke_agent parley"]
    assert len(runs) == 1
    root = runs[0]
    assert root.parent is None
    assert root.attributes is not None
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["parley.run_id"] == report.run_id
    trace_id = root.context.trace_id
    children = [
        s for s in finished if s.parent is not None and s.parent.span_id == root.context.span_id
    ]
    names = sorted(s.name for s in children)
    assert names == ["chat fake-model", "chat fake-model", "execute_tool write_file"]
    assert all(s.context.trace_id == trace_id for s in finished)

    llm = sorted((s for s in children if s.name.startswith("chat")), key=lambda s: s.start_time)
    tool = next(s for s in children if s.name.startswith("execute_tool"))
    for span in llm:
        assert span.attributes is not None
        assert span.attributes["gen_ai.operation.name"] == "chat"
        assert span.attributes["gen_ai.request.model"] == "fake-model"
        assert span.attributes["gen_ai.usage.input_tokens"] > 0
    assert llm[1].attributes is not None
    assert llm[1].attributes["gen_ai.usage.input_tokens"] == 120
    assert llm[1].attributes["gen_ai.usage.output_tokens"] == 7
    # the tool ran between the two calls
    assert llm[0].end_time <= tool.start_time <= tool.end_time <= llm[1].start_time
    assert tool.attributes is not None
    assert tool.attributes["gen_ai.tool.name"] == "write_file"
    assert tool.attributes["parley.tool.outcome"] == "ok"

    started = [d for _, name, _, d in events if name == "agent_run.started"]
    assert started
    assert started[0]["trace_id"] == f"{trace_id:032x}"

    # `parley runs show` names the trace
    config = agent_config(fake_llm, tmp_path)
    assert await runs_command(config, "show", report.run_id, 20, {}) == 0
    assert f"Trace: {trace_id:032x}\n" in capsys.readouterr().out


async def test_without_a_tracer_runs_carry_no_trace_id(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="plain"))
    async with running_agent(fake_llm, tmp_path) as agent:
        report = await agent.run(inbound("hello"), RecordingResponder())
        events = await agent.store.events(report.run_id)
    assert events
    assert not any("trace_id" in data for _, _, _, data in events)
