"""`parley run` with `[telemetry] otlp_endpoint`: each run's spans reach an OTLP/HTTP
collector (a fake one on 127.0.0.1 that decodes the protobuf requests), and `parley runs
show` names the same trace."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from tests.channels.test_stored_before_ack import Parley
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.fakes.telegram import FakeTelegram, TgUser
from tests.process import child_env, parley, start_parley, telegram_run_config

trace_pb = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2", reason="the parley[otel] extra"
)

ALICE = TgUser(111, "Alice", "alice")
TOKEN = "123456:TEST-token"


@asynccontextmanager
async def collector() -> AsyncIterator[tuple[str, list[tuple[str, str]]]]:
    """An OTLP/HTTP traces endpoint; yields its URL and the (trace id, span name) seen."""
    seen: list[tuple[str, str]] = []

    async def traces(request: web.Request) -> web.Response:
        message = trace_pb.ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for resource in message.resource_spans:
            for scope in resource.scope_spans:
                seen.extend((span.trace_id.hex(), span.name) for span in scope.spans)
        answer = trace_pb.ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}/v1/traces", seen
    finally:
        await runner.cleanup()


async def test_run_traces_reach_the_otlp_endpoint_and_runs_show_names_them(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "a.txt", "content": "x"})]),
        Reply(text="wrote it"),
    )
    async with collector() as (endpoint, seen), FakeTelegram(token=TOKEN) as telegram:
        config = telegram_run_config(
            tmp_path,
            fake_llm.base_url,
            telegram.url,
            ALICE.id,
            f"""
            [telemetry]
            otlp_endpoint = "{endpoint}"
            """,
        )
        env = child_env(TELEGRAM_BOT_TOKEN=TOKEN)
        proc = Parley(await start_parley("--config", str(config), "run", env=env, stdin=False))
        try:
            await proc.until(lambda: b"parley: ready" in proc.err, "start-up", timeout=60)
            telegram.dm(ALICE, "write a file")
            await proc.until(lambda: "wrote it" in telegram.texts(ALICE.id), "answer")
        finally:
            code = await proc.stop()  # the batch still held is sent at exit
        assert code == 0, proc.err.decode()
        code, out, err = await parley("--config", str(config), "runs", env=env)
        assert code == 0, err
        run_id = out.splitlines()[1].split()[0]
        code, shown, err = await parley("--config", str(config), "runs", "show", run_id, env=env)
        assert code == 0, err

    names = sorted(name for _, name in seen if not name.startswith("channel "))
    assert names == [
        "chat fake-model",
        "chat fake-model",
        "execute_tool write_file",
        "invoke_agent parley",
    ], seen
    assert any(name.startswith("channel ") for _, name in seen), seen  # the answer's post
    assert len({trace for trace, _ in seen}) == 1
    assert f"Trace: {seen[0][0]}\n" in shown
