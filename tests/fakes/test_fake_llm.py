"""Tests of the fake LLM server itself, driven with plain httpx (no Parley code)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
import pytest

from tests.fakes.llm import FakeLLM, Fault, Reply, ToolCallSpec

APIS = ["chat", "responses", "anthropic"]
ANTHROPIC_HEADERS = {"x-api-key": "test-key", "anthropic-version": "2023-06-01"}

Event = tuple[str | None, str]  # (event name, data)


@pytest.fixture
async def fake() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as c:
        yield c


def url(fake: FakeLLM, api: str) -> str:
    return {
        "chat": fake.base_url + "/chat/completions",
        "responses": fake.base_url + "/responses",
        "anthropic": fake.root_url + "/v1/messages",
    }[api]


def default_body(api: str) -> dict[str, Any]:
    if api == "chat":
        return {
            "model": "gpt-test",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        }
    if api == "responses":
        return {"model": "gpt-test", "input": "hi", "stream": True}
    return {
        "model": "claude-test",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }


def default_headers(api: str) -> dict[str, str]:
    return dict(ANTHROPIC_HEADERS) if api == "anthropic" else {}


async def parse_sse(resp: httpx.Response) -> list[Event]:
    events: list[Event] = []
    name: str | None = None
    data: list[str] = []
    async for line in resp.aiter_lines():
        if not line:
            if data:
                events.append((name, "\n".join(data)))
            name, data = None, []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        events.append((name, "\n".join(data)))
    return events


async def stream(
    client: httpx.AsyncClient,
    fake: FakeLLM,
    api: str,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> list[Event]:
    async with client.stream(
        "POST",
        url(fake, api),
        json=body if body is not None else default_body(api),
        headers=headers if headers is not None else default_headers(api),
    ) as resp:
        assert resp.status_code == 200, await resp.aread()
        assert resp.headers["content-type"].startswith("text/event-stream")
        return await parse_sse(resp)


def payloads(events: list[Event]) -> list[dict[str, Any]]:
    return [json.loads(data) for _, data in events if data != "[DONE]"]


def chat_deltas(events: list[Event]) -> list[dict[str, Any]]:
    return [p["choices"][0]["delta"] for p in payloads(events) if p["choices"]]


def text_fragments(api: str, events: list[Event]) -> list[str]:
    if api == "chat":
        return [d["content"] for d in chat_deltas(events) if d.get("content")]
    if api == "responses":
        return [p["delta"] for p in payloads(events) if p["type"] == "response.output_text.delta"]
    return [
        p["delta"]["text"]
        for p in payloads(events)
        if p["type"] == "content_block_delta" and p["delta"]["type"] == "text_delta"
    ]


def tool_calls(api: str, events: list[Event]) -> list[tuple[int, str, str, str]]:
    """(index, id, name, joined arguments) per tool call, in order."""
    calls: dict[int, list[str]] = {}
    if api == "chat":
        for delta in chat_deltas(events):
            for tc in delta.get("tool_calls", []):
                if "id" in tc:
                    assert tc["type"] == "function"
                    calls[tc["index"]] = [tc["id"], tc["function"]["name"], ""]
                calls[tc["index"]][2] += tc["function"].get("arguments", "")
    elif api == "responses":
        for p in payloads(events):
            if p["type"] == "response.output_item.added" and p["item"]["type"] == "function_call":
                calls[p["output_index"]] = [p["item"]["call_id"], p["item"]["name"], ""]
            elif p["type"] == "response.function_call_arguments.delta":
                calls[p["output_index"]][2] += p["delta"]
            elif p["type"] == "response.function_call_arguments.done":
                assert p["arguments"] == calls[p["output_index"]][2]
    else:
        for p in payloads(events):
            if p["type"] == "content_block_start" and p["content_block"]["type"] == "tool_use":
                block = p["content_block"]
                assert block["input"] == {}
                calls[p["index"]] = [block["id"], block["name"], ""]
            elif p["type"] == "content_block_delta" and p["delta"]["type"] == "input_json_delta":
                calls[p["index"]][2] += p["delta"]["partial_json"]
    return [(i, calls[i][0], calls[i][1], calls[i][2]) for i in sorted(calls)]


async def post_json(
    client: httpx.AsyncClient,
    fake: FakeLLM,
    api: str,
    body: Any,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    return await client.post(
        url(fake, api),
        json=body,
        headers=headers if headers is not None else default_headers(api),
    )


def error_message(api: str, resp: httpx.Response) -> str:
    body = resp.json()
    if api == "anthropic":
        assert body["type"] == "error"
        assert isinstance(body["error"]["type"], str)
        return str(body["error"]["message"])
    assert set(body["error"]) >= {"message", "type", "code"}
    return str(body["error"]["message"])


async def collect_data_lines(resp: httpx.Response, into: list[str]) -> None:
    async for line in resp.aiter_lines():
        if line.startswith("data:"):
            into.append(line)


# ---------------------------------------------------------------------- streaming


@pytest.mark.parametrize("api", APIS)
async def test_text_streams_in_fragments(
    fake: FakeLLM, client: httpx.AsyncClient, api: str
) -> None:
    text = "Hello there, this text arrives in several small pieces."
    fake.script(Reply(text=text, chunk_size=5))
    events = await stream(client, fake, api)
    fragments = text_fragments(api, events)
    assert len(fragments) == -(-len(text) // 5)
    assert all(len(f) <= 5 for f in fragments)
    assert "".join(fragments) == text
    if api == "chat":
        assert events[-1] == (None, "[DONE]")
        assert chat_deltas(events)[0]["role"] == "assistant"
        assert payloads(events)[-1]["choices"][0]["finish_reason"] == "stop"
    elif api == "responses":
        assert events[0][0] == "response.created"
        assert events[-1][0] == "response.completed"
        assert all(name == json.loads(data)["type"] for name, data in events)
        final = json.loads(events[-1][1])["response"]
        assert final["output"][0]["content"][0]["text"] == text
        assert set(final["usage"]) >= {"input_tokens", "output_tokens"}
    else:
        names = [name for name, _ in events]
        assert names[0] == "message_start"
        assert "ping" in names
        assert names[-2:] == ["message_delta", "message_stop"]
        assert all(name == json.loads(data)["type"] for name, data in events)
        assert json.loads(events[-2][1])["delta"]["stop_reason"] == "end_turn"
    fake.assert_complete()


@pytest.mark.parametrize("api", APIS)
async def test_tool_call_arguments_rejoin(
    fake: FakeLLM, client: httpx.AsyncClient, api: str
) -> None:
    args = {"command": "ls -la /tmp && echo 'done'", "timeout": 30}
    fake.script(
        Reply(
            tool_calls=[ToolCallSpec("bash", args), ToolCallSpec("read_file", {"path": "a.txt"})],
            chunk_size=4,
        )
    )
    events = await stream(client, fake, api)
    calls = tool_calls(api, events)
    assert [c[0] for c in calls] == [0, 1]
    assert [c[1] for c in calls] == ["call_1", "call_2"]
    assert [c[2] for c in calls] == ["bash", "read_file"]
    assert json.loads(calls[0][3]) == args
    assert json.loads(calls[1][3]) == {"path": "a.txt"}
    if api == "chat":
        arg_chunks = [
            tc for d in chat_deltas(events) for tc in d.get("tool_calls", []) if "id" not in tc
        ]
        assert len(arg_chunks) > 2  # split across several chunks
        assert payloads(events)[-1]["choices"][0]["finish_reason"] == "tool_calls"
    elif api == "anthropic":
        stop_reason = json.loads(events[-2][1])["delta"]["stop_reason"]
        assert stop_reason == "tool_use"
    else:
        final = json.loads(events[-1][1])["response"]
        assert [item["type"] for item in final["output"]] == ["function_call"] * 2
        assert json.loads(final["output"][0]["arguments"]) == args


@pytest.mark.parametrize("api", APIS)
async def test_raw_string_arguments_sent_verbatim(
    fake: FakeLLM, client: httpx.AsyncClient, api: str
) -> None:
    fake.script(Reply(tool_calls=[ToolCallSpec("bash", '{"command": "ls"', id="my_id")]))
    calls = tool_calls(api, await stream(client, fake, api))
    assert calls == [(calls[0][0], "my_id", "bash", '{"command": "ls"')]


@pytest.mark.parametrize("api", APIS)
async def test_reasoning_in_vendor_field(
    fake: FakeLLM, client: httpx.AsyncClient, api: str
) -> None:
    reasoning = "Let me think about this carefully first."
    fake.script(Reply(text="Answer.", reasoning=reasoning, chunk_size=6))
    events = await stream(client, fake, api)
    if api == "chat":
        fragments = [
            d["reasoning_content"] for d in chat_deltas(events) if "reasoning_content" in d
        ]
    elif api == "responses":
        fragments = [
            p["delta"]
            for p in payloads(events)
            if p["type"] == "response.reasoning_summary_text.delta"
        ]
    else:
        data = payloads(events)
        fragments = [
            p["delta"]["thinking"]
            for p in data
            if p["type"] == "content_block_delta" and p["delta"]["type"] == "thinking_delta"
        ]
        starts = [p["content_block"]["type"] for p in data if p["type"] == "content_block_start"]
        assert starts == ["thinking", "text"]
        signatures = [
            p
            for p in data
            if p["type"] == "content_block_delta" and p["delta"]["type"] == "signature_delta"
        ]
        assert len(signatures) == 1
        assert signatures[0]["index"] == 0
        assert signatures[0]["delta"]["signature"]
    assert len(fragments) > 1
    assert "".join(fragments) == reasoning
    assert "".join(text_fragments(api, events)) == "Answer."


async def test_chat_usage_chunk_only_when_requested(
    fake: FakeLLM, client: httpx.AsyncClient
) -> None:
    fake.script(Reply(text="abc", usage=(11, 7)), Reply(text="abc"))
    body = {**default_body("chat"), "stream_options": {"include_usage": True}}
    data = payloads(await stream(client, fake, "chat", body))
    assert data[-1]["choices"] == []
    assert data[-1]["usage"] == {
        "prompt_tokens": 11,
        "completion_tokens": 7,
        "total_tokens": 18,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    }
    assert all(p["usage"] is None for p in data[:-1])

    data = payloads(await stream(client, fake, "chat"))
    assert all(p["choices"] and "usage" not in p for p in data)


@pytest.mark.parametrize("api", ["responses", "anthropic"])
async def test_usage_reported(fake: FakeLLM, client: httpx.AsyncClient, api: str) -> None:
    fake.script(Reply(text="abc", usage=(12, 5)))
    data = payloads(await stream(client, fake, api))
    if api == "responses":
        usage = data[-1]["response"]["usage"]
        assert (usage["input_tokens"], usage["output_tokens"]) == (12, 5)
    else:
        assert data[0]["message"]["usage"]["input_tokens"] == 12
        assert data[-2]["usage"]["output_tokens"] == 5


# ---------------------------------------------------------------------- faults


@pytest.mark.parametrize("api", APIS)
async def test_429_with_retry_after_then_next_reply(
    fake: FakeLLM, client: httpx.AsyncClient, api: str
) -> None:
    fake.script(
        Reply(fault=Fault(status=429, retry_after=2, message="slow down")), Reply(text="ok")
    )
    resp = await post_json(client, fake, api, default_body(api))
    assert resp.status_code == 429
    assert resp.headers["retry-after"] == "2"
    assert error_message(api, resp) == "slow down"
    if api == "anthropic":
        assert resp.json()["error"]["type"] == "rate_limit_error"
    else:
        assert resp.json()["error"]["code"] == "rate_limit_exceeded"
    assert fake.pending == 1
    assert "".join(text_fragments(api, await stream(client, fake, api))) == "ok"
    fake.assert_complete()


@pytest.mark.parametrize("status", [400, 401, 500, 529])
async def test_fault_status_without_retry_after(
    fake: FakeLLM, client: httpx.AsyncClient, status: int
) -> None:
    fake.script(Reply(fault=Fault(status=status)))
    resp = await post_json(client, fake, "chat", default_body("chat"))
    assert resp.status_code == status
    assert "retry-after" not in resp.headers
    assert error_message("chat", resp) == "injected fault"


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("cut_after", [0, 3])
async def test_cut_after_drops_connection(
    fake: FakeLLM, client: httpx.AsyncClient, api: str, cut_after: int
) -> None:
    fake.script(Reply(text="x" * 200, chunk_size=4, fault=Fault(cut_after=cut_after)))
    received: list[str] = []
    async with client.stream(
        "POST", url(fake, api), json=default_body(api), headers=default_headers(api)
    ) as resp:
        assert resp.status_code == 200
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            await collect_data_lines(resp, received)
    assert len(received) == cut_after
    assert fake.disconnects == 0


async def test_recorded_error_body_is_sent_verbatim(
    fake: FakeLLM, client: httpx.AsyncClient
) -> None:
    body = {
        "error": {
            "message": "Your input exceeds the context window of this model.",
            "type": "invalid_request_error",
            "param": "input",
            "code": "context_length_exceeded",
        }
    }
    fake.script(Reply(fault=Fault(status=400, body=body)))
    resp = await post_json(client, fake, "responses", default_body("responses"))
    assert resp.status_code == 400
    assert resp.json() == body


STREAM_ERROR = {"message": "Failed to call a function.", "type": "invalid_request_error"}


@pytest.mark.parametrize(
    ("api", "shape", "name", "expected"),
    [
        ("chat", "event", "error", {"error": STREAM_ERROR}),
        ("chat", "data", None, {"error": STREAM_ERROR}),
        ("anthropic", "event", "error", {"type": "error", "error": STREAM_ERROR}),
        (
            "responses",
            "event",
            "error",
            {
                "type": "error",
                "code": None,
                "message": "Failed to call a function.",
                "param": None,
                "sequence_number": 1,
            },
        ),
    ],
)
async def test_stream_error_ends_the_stream(
    fake: FakeLLM,
    client: httpx.AsyncClient,
    api: str,
    shape: Literal["event", "data"],
    name: str | None,
    expected: dict[str, Any],
) -> None:
    fault = Fault(stream_error=STREAM_ERROR, stream_error_as=shape)
    fake.script(Reply(text="never finished", fault=fault))
    events = await stream(client, fake, api)
    assert len(events) == 2  # the opening event, then the error; a clean end, no [DONE]
    assert events[-1] == (name, json.dumps(expected, separators=(",", ":")))
    assert fake.disconnects == 0


async def test_stream_error_as_a_failed_response(fake: FakeLLM, client: httpx.AsyncClient) -> None:
    error = {"message": "Your input exceeds the context window.", "code": "context_length_exceeded"}
    fault = Fault(stream_error=error, stream_error_as="failed", cut_after=2)
    fake.script(Reply(text="never finished", fault=fault))
    events = await stream(client, fake, "responses")
    assert [name for name, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.failed",
    ]
    failed = json.loads(events[-1][1])
    assert failed["sequence_number"] == 2
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {
        "code": "context_length_exceeded",
        "message": "Your input exceeds the context window.",
    }


@pytest.mark.parametrize("api", APIS)
async def test_refusal_in_each_wire_format(
    fake: FakeLLM, client: httpx.AsyncClient, api: str
) -> None:
    refusal = "I'm sorry, I can't help with that."
    fake.script(Reply(refusal=refusal, chunk_size=5))
    events = await stream(client, fake, api)
    data = payloads(events)
    if api == "chat":
        fragments = [d["refusal"] for d in chat_deltas(events) if d.get("refusal")]
        assert not text_fragments(api, events)
        assert data[-1]["choices"][0]["finish_reason"] == "stop"
    elif api == "responses":
        fragments = [p["delta"] for p in data if p["type"] == "response.refusal.delta"]
        assert not text_fragments(api, events)
        final = data[-1]["response"]
        assert final["output"][0]["content"] == [{"type": "refusal", "refusal": refusal}]
    else:
        fragments = text_fragments(api, events)
        assert data[-2]["delta"]["stop_reason"] == "refusal"
    assert len(fragments) > 1
    assert "".join(fragments) == refusal


@pytest.mark.parametrize("block_type", ["server_tool_use", "mcp_tool_use"])
async def test_anthropic_server_tool_blocks(
    fake: FakeLLM, client: httpx.AsyncClient, block_type: str
) -> None:
    fake.script(
        Reply(
            text="Found.",
            server_tool_calls=[ToolCallSpec("web_search", {"query": "parley"})],
            server_tool_type=block_type,
            chunk_size=4,
        )
    )
    events = await stream(client, fake, "anthropic")
    data = payloads(events)
    starts = [p["content_block"] for p in data if p["type"] == "content_block_start"]
    assert [b["type"] for b in starts] == [block_type, "web_search_tool_result", "text"]
    assert starts[0]["id"].startswith("srvtoolu_")
    assert starts[1]["tool_use_id"] == starts[0]["id"]
    partial = [
        p["delta"]["partial_json"]
        for p in data
        if p["type"] == "content_block_delta" and p["delta"]["type"] == "input_json_delta"
    ]
    assert len(partial) > 1
    assert {p["index"] for p in data if p.get("delta", {}).get("type") == "input_json_delta"} == {0}
    assert json.loads("".join(partial)) == {"query": "parley"}
    assert "".join(text_fragments("anthropic", events)) == "Found."
    assert data[-2]["delta"]["stop_reason"] == "end_turn"


async def test_chunk_delay_is_observed(fake: FakeLLM, client: httpx.AsyncClient) -> None:
    fake.script(Reply(text="abcdef", chunk_size=2, chunk_delay=0.05))
    arrivals: list[float] = []
    async with client.stream("POST", url(fake, "chat"), json=default_body("chat")) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                arrivals.append(time.monotonic())
    # role chunk, 3 text chunks, finish chunk, [DONE]: 6 events, 5 gaps
    assert len(arrivals) == 6
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert min(gaps) >= 0.03
    assert arrivals[-1] - arrivals[0] >= 0.2


@pytest.mark.parametrize("api", APIS)
async def test_client_disconnect_counted(
    fake: FakeLLM, client: httpx.AsyncClient, api: str
) -> None:
    fake.script(Reply(text="y" * 400, chunk_size=2, chunk_delay=0.01), Reply(text="done"))
    async with client.stream(
        "POST", url(fake, api), json=default_body(api), headers=default_headers(api)
    ) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                break  # leaving the block closes the stream mid-way
    await fake.wait_for_disconnects(1, timeout=5)
    assert fake.disconnects == 1
    # the server is still healthy afterwards
    assert "".join(text_fragments(api, await stream(client, fake, api))) == "done"
    assert fake.disconnects == 1


async def test_full_read_is_not_a_disconnect(fake: FakeLLM, client: httpx.AsyncClient) -> None:
    fake.script(Reply(text="abc", chunk_delay=0.001), Reply(text="abc"))
    await stream(client, fake, "anthropic", headers=ANTHROPIC_HEADERS)
    await stream(client, fake, "responses")
    assert fake.disconnects == 0


# ---------------------------------------------------------------------- validation


TOOL_CALL_MSG = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "bash", "arguments": "{}"}},
        {"id": "call_b", "type": "function", "function": {"name": "bash", "arguments": "{}"}},
    ],
}
USER = {"role": "user", "content": "hi"}


def tool_msg(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


CHAT_INVALID: dict[str, tuple[list[dict[str, Any]], str]] = {
    "unpaired_at_end": ([USER, TOOL_CALL_MSG, tool_msg("call_a")], "call_b"),
    "unpaired_before_user": ([USER, TOOL_CALL_MSG, tool_msg("call_a"), USER], "call_b"),
    "orphan_tool_result": ([USER, tool_msg("call_zzz")], "call_zzz"),
    "answered_twice": (
        [USER, TOOL_CALL_MSG, tool_msg("call_a"), tool_msg("call_b"), tool_msg("call_a")],
        "call_a",
    ),
}


@pytest.mark.parametrize("case", sorted(CHAT_INVALID))
async def test_chat_rejects_bad_tool_pairing(
    fake: FakeLLM, client: httpx.AsyncClient, case: str
) -> None:
    messages, needle = CHAT_INVALID[case]
    fake.script(Reply(text="never sent"))
    resp = await post_json(client, fake, "chat", {**default_body("chat"), "messages": messages})
    assert resp.status_code == 400
    assert needle in error_message("chat", resp)
    assert fake.pending == 1  # a rejected request consumes nothing
    assert fake.requests[-1].error is not None


async def test_chat_accepts_paired_tool_calls_any_order(
    fake: FakeLLM, client: httpx.AsyncClient
) -> None:
    fake.script(Reply(text="fine"))
    messages = [USER, TOOL_CALL_MSG, tool_msg("call_b"), tool_msg("call_a"), USER]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    body = {**default_body("chat"), "messages": messages, "tools": tools}
    assert "".join(text_fragments("chat", await stream(client, fake, "chat", body))) == "fine"


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"tools": []}, "tools"),
        ({"stream": False}, "stream"),
        ({"model": None}, "model"),
        ({"messages": []}, "messages"),
    ],
)
async def test_chat_rejects_bad_fields(
    fake: FakeLLM, client: httpx.AsyncClient, patch: dict[str, Any], needle: str
) -> None:
    resp = await post_json(client, fake, "chat", {**default_body("chat"), **patch})
    assert resp.status_code == 400
    assert needle in error_message("chat", resp)


@pytest.mark.parametrize("api", APIS)
async def test_invalid_json_rejected(fake: FakeLLM, client: httpx.AsyncClient, api: str) -> None:
    resp = await client.post(url(fake, api), content=b"{not json", headers=default_headers(api))
    assert resp.status_code == 400
    assert "JSON" in error_message(api, resp)


def tool_use(use_id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": use_id, "name": "bash", "input": {"command": "ls"}}


def tool_result(use_id: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": use_id, "content": "ok"}


ANTHROPIC_INVALID: dict[str, tuple[list[dict[str, Any]], str]] = {
    "system_role": ([{"role": "system", "content": "be nice"}, USER], "system"),
    "unpaired_tool_use": (
        [
            USER,
            {"role": "assistant", "content": [tool_use("toolu_a"), tool_use("toolu_b")]},
            {"role": "user", "content": [tool_result("toolu_a")]},
        ],
        "toolu_b",
    ),
    "unpaired_at_end": ([USER, {"role": "assistant", "content": [tool_use("toolu_a")]}], "toolu_a"),
    "result_not_immediately_after": (
        [
            USER,
            {"role": "assistant", "content": [tool_use("toolu_a")]},
            USER,
            {"role": "user", "content": [tool_result("toolu_a")]},
        ],
        "toolu_a",
    ),
    "orphan_tool_result": ([{"role": "user", "content": [tool_result("toolu_x")]}], "toolu_x"),
    "string_input": (
        [
            USER,
            {"role": "assistant", "content": [{**tool_use("toolu_a"), "input": '{"a": 1}'}]},
            {"role": "user", "content": [tool_result("toolu_a")]},
        ],
        "input",
    ),
    "empty_text_block": ([{"role": "user", "content": [{"type": "text", "text": ""}]}], "empty"),
}


@pytest.mark.parametrize("case", sorted(ANTHROPIC_INVALID))
async def test_anthropic_rejects_bad_messages(
    fake: FakeLLM, client: httpx.AsyncClient, case: str
) -> None:
    messages, needle = ANTHROPIC_INVALID[case]
    resp = await post_json(
        client, fake, "anthropic", {**default_body("anthropic"), "messages": messages}
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert needle in error_message("anthropic", resp)


async def test_anthropic_accepts_paired_tool_use(fake: FakeLLM, client: httpx.AsyncClient) -> None:
    fake.script(Reply(text="fine"))
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "sig"}
    messages = [
        USER,
        {"role": "assistant", "content": [thinking, tool_use("toolu_a"), tool_use("toolu_b")]},
        {"role": "user", "content": [tool_result("toolu_b"), tool_result("toolu_a")]},
    ]
    body = {**default_body("anthropic"), "messages": messages, "system": "be brief"}
    events = await stream(client, fake, "anthropic", body)
    assert "".join(text_fragments("anthropic", events)) == "fine"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"anthropic-version": "2023-06-01"}, 401),
        ({"x-api-key": "k"}, 400),
    ],
)
async def test_anthropic_requires_headers(
    fake: FakeLLM, client: httpx.AsyncClient, headers: dict[str, str], status: int
) -> None:
    resp = await post_json(client, fake, "anthropic", default_body("anthropic"), headers)
    assert resp.status_code == status
    assert error_message("anthropic", resp)


def function_call(call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "bash", "arguments": "{}"}


def function_output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "ok"}


RESPONSES_INVALID: dict[str, tuple[list[dict[str, Any]], str]] = {
    "orphan_output": ([USER, function_output("call_x")], "call_x"),
    "output_before_call": ([USER, function_output("call_a"), function_call("call_a")], "call_a"),
    "unpaired_call": (
        [USER, function_call("call_a"), function_call("call_b"), function_output("call_a")],
        "call_b",
    ),
}


@pytest.mark.parametrize("case", sorted(RESPONSES_INVALID))
async def test_responses_rejects_bad_tool_pairing(
    fake: FakeLLM, client: httpx.AsyncClient, case: str
) -> None:
    items, needle = RESPONSES_INVALID[case]
    resp = await post_json(client, fake, "responses", {**default_body("responses"), "input": items})
    assert resp.status_code == 400
    assert needle in error_message("responses", resp)


async def test_responses_accepts_paired_calls_and_previous_response(
    fake: FakeLLM, client: httpx.AsyncClient
) -> None:
    fake.script(
        Reply(text="ok"),
        Reply(tool_calls=[ToolCallSpec("bash", {})]),
        Reply(text="done"),
    )
    items = [USER, function_call("call_a"), function_output("call_a")]
    await stream(client, fake, "responses", {**default_body("responses"), "input": items})

    data = payloads(await stream(client, fake, "responses"))
    resp_id = data[-1]["response"]["id"]
    call_id = data[-1]["response"]["output"][0]["call_id"]
    follow_up = {**default_body("responses"), "previous_response_id": resp_id}
    # the previous response's call must be answered ...
    resp = await post_json(client, fake, "responses", {**follow_up, "input": [USER]})
    assert resp.status_code == 400
    assert call_id in error_message("responses", resp)
    # ... and then it is accepted
    events = await stream(
        client, fake, "responses", {**follow_up, "input": [function_output(call_id)]}
    )
    assert "".join(text_fragments("responses", events)) == "done"
    fake.assert_complete()


# ---------------------------------------------------------------------- auth


@pytest.mark.parametrize("api", APIS)
async def test_api_key_enforced(client: httpx.AsyncClient, api: str) -> None:
    async with FakeLLM(api_key="k") as fake:
        fake.script(Reply(text="hello"))
        bad = {"authorization": "Bearer nope", "x-api-key": "nope", "anthropic-version": "1"}
        resp = await post_json(client, fake, api, default_body(api), bad)
        assert resp.status_code == 401
        if api == "anthropic":
            assert resp.json()["error"]["type"] == "authentication_error"
        else:
            assert resp.json()["error"]["code"] == "invalid_api_key"
        resp = await post_json(client, fake, api, default_body(api), {"anthropic-version": "1"})
        assert resp.status_code == 401
        assert fake.pending == 1

        good = {"authorization": "Bearer k", "x-api-key": "k", "anthropic-version": "1"}
        events = await stream(client, fake, api, headers=good)
        assert "".join(text_fragments(api, events)) == "hello"
        fake.assert_complete()


# ---------------------------------------------------------------------- scripting API


async def test_requests_recorded(fake: FakeLLM, client: httpx.AsyncClient) -> None:
    fake.script(Reply(text="a"), Reply(text="b"), Reply(text="c"))
    for api in APIS:
        await stream(client, fake, api)
    assert [r.api for r in fake.requests] == APIS
    assert [r.path for r in fake.requests] == [
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
    ]
    assert fake.requests[2].headers["anthropic-version"] == "2023-06-01"
    assert all(k == k.lower() for r in fake.requests for k in r.headers)
    assert fake.requests[0].json == default_body("chat")
    assert [r.reply.text if r.reply else None for r in fake.requests] == ["a", "b", "c"]
    assert fake.base_url == fake.root_url + "/v1"
    assert fake.root_url.startswith("http://127.0.0.1:")


async def test_script_exhausted(fake: FakeLLM, client: httpx.AsyncClient) -> None:
    resp = await post_json(client, fake, "chat", default_body("chat"))
    assert resp.status_code == 500
    assert error_message("chat", resp) == "fake LLM: script exhausted"
    resp = await post_json(client, fake, "anthropic", default_body("anthropic"))
    assert resp.status_code == 500
    assert resp.json()["error"]["message"] == "fake LLM: script exhausted"
    assert fake.unexpected == 2
    assert len(fake.requests) == 2
    fake.assert_complete()


async def test_responder_used_when_queue_empty(fake: FakeLLM, client: httpx.AsyncClient) -> None:
    fake.script(Reply(text="scripted"))
    fake.responder = lambda req: Reply(text=f"auto {len(fake.requests)} {req.api}")
    texts = []
    for _ in range(3):
        texts.append("".join(text_fragments("chat", await stream(client, fake, "chat"))))
    assert texts == ["scripted", "auto 2 chat", "auto 3 chat"]
    assert fake.unexpected == 0


async def test_async_responder(fake: FakeLLM, client: httpx.AsyncClient) -> None:
    async def responder(req: Any) -> Reply:
        await asyncio.sleep(0)
        return Reply(text="async")

    fake.responder = responder
    assert "".join(text_fragments("anthropic", await stream(client, fake, "anthropic"))) == "async"


async def test_assert_complete_fails_when_replies_remain(
    fake: FakeLLM, client: httpx.AsyncClient
) -> None:
    fake.script(Reply(text="one"), Reply(text="two"))
    await stream(client, fake, "chat")
    with pytest.raises(AssertionError, match="1 scripted reply not consumed"):
        fake.assert_complete()
    await stream(client, fake, "chat")
    fake.assert_complete()


async def test_wait_for_requests(fake: FakeLLM, client: httpx.AsyncClient) -> None:
    fake.script(*(Reply(text=str(i)) for i in range(3)))
    waiter = asyncio.create_task(fake.wait_for_requests(3, timeout=5))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await asyncio.gather(*(stream(client, fake, "chat") for _ in range(3)))
    await waiter
    with pytest.raises(AssertionError, match="timed out"):
        await fake.wait_for_requests(4, timeout=0.05)


async def test_many_concurrent_requests(fake: FakeLLM) -> None:
    fake.responder = lambda req: Reply(text="pong")
    limits = httpx.Limits(max_connections=20)
    async with httpx.AsyncClient(limits=limits, timeout=10) as c:
        results = await asyncio.gather(*(stream(c, fake, api) for api in APIS * 50))
    assert all(
        "".join(text_fragments(api, events)) == "pong"
        for api, events in zip(APIS * 50, results, strict=True)
    )
    assert len(fake.requests) == 150


async def test_start_stop_fast() -> None:
    t0 = time.monotonic()
    for _ in range(5):
        async with FakeLLM() as fake:
            assert fake.port > 0
    assert time.monotonic() - t0 < 2
    with pytest.raises(RuntimeError):
        _ = fake.base_url


async def test_stop_with_stream_in_flight(client: httpx.AsyncClient) -> None:
    fake = FakeLLM()
    await fake.start()
    fake.script(Reply(text="z" * 100, chunk_size=1, chunk_delay=0.05))
    async with client.stream("POST", url(fake, "chat"), json=default_body("chat")) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                break
        t0 = time.monotonic()
        await fake.stop()
        assert time.monotonic() - t0 < 2
