"""A scripted fake LLM HTTP server speaking three streaming wire formats.

The fake listens on 127.0.0.1 on a free port and answers, with server-sent events, exactly
the way the real vendors do:

* OpenAI Chat Completions: ``POST /v1/chat/completions``
* OpenAI Responses: ``POST /v1/responses``
* Anthropic Messages: ``POST /v1/messages``

Tests script the replies up front::

    async with FakeLLM() as fake:
        fake.script(Reply(text="hi"), Reply(tool_calls=[ToolCallSpec("bash", {"command": "ls"})]))
        ...  # point the client at fake.base_url (OpenAI) or fake.root_url (Anthropic)
        fake.assert_complete()

Each request consumes one :class:`Reply` from the FIFO queue, whatever the API. When the queue
is empty, :attr:`FakeLLM.responder` (if set) builds the reply; otherwise the fake answers 500
("fake LLM: script exhausted") and counts the request in :attr:`FakeLLM.unexpected`.

Requests are validated the way real providers do it (tool call / tool result pairing, required
fields and headers, API key) and rejected with 400/401 in the vendor's error shape. Validation
failures and authentication failures do not consume a scripted reply.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import time
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Self

from aiohttp import web

__all__ = ["Api", "FakeLLM", "Fault", "RecordedRequest", "Reply", "ToolCallSpec"]

Api = Literal["chat", "responses", "anthropic"]

SCRIPT_EXHAUSTED = "fake LLM: script exhausted"
ECHO = " (received: {header}; key: {quoted}; line: {line_b64}; headers: {headers_json})"
"""What `Fault.echo_key` appends to the error message."""


@dataclass
class ToolCallSpec:
    """One tool call the fake model makes.

    ``arguments`` given as a dict is JSON-encoded; a ``str`` is sent verbatim (to test malformed
    JSON). ``id`` defaults to ``call_N`` with N counting up per :class:`FakeLLM`.
    """

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class Fault:
    """A failure injected instead of (or in the middle of) a normal reply.

    * ``status``: answer with this HTTP status and a vendor-shaped error body instead of
      streaming (takes precedence over ``cut_after``).
    * ``retry_after``: seconds, sent as a ``Retry-After`` header with the error status.
    * ``cut_after``: stream with status 200, then drop the connection after this many SSE
      events (0: right after the headers), without the final events / ``[DONE]``.
    * ``body``: with ``status``, this exact JSON body instead of the vendor-shaped default
      built from ``message`` (to replay a recorded error answer).
    * ``stream_error``: stream with status 200, then send this vendor error object in the
      stream and end it (cleanly, without the final events / ``[DONE]``) after ``cut_after``
      events (default 1: after the opening event). The object is the inner ``error`` of the
      vendor's shape, e.g. ``{"message": ..., "type": ..., "code": ...}`` (OpenAI) or
      ``{"type": ..., "message": ...}`` (Anthropic). ``stream_error_as`` picks the wire
      shape: ``"event"`` (default) an ``event: error`` SSE event, i.e. Chat
      ``{"error": {...}}``, Responses ``{"type": "error", "code", "message", "param",
      "sequence_number"}``, Anthropic ``{"type": "error", "error": {...}}``; ``"data"`` a
      plain ``data: {"error": {...}}`` chunk (Chat; Groq, OpenRouter); ``"failed"`` a
      Responses ``response.failed`` event with ``response.error = {code, message}``.
    * ``echo_key``: with ``status``, the error message goes on to echo the credential the
      request carried, as a careless gateway does: ``message + ECHO.format(...)``, i.e.
      the ``Authorization`` (or ``x-api-key``) header as sent, the bare key URL-quoted,
      the header line base64-encoded and the headers as a JSON object.
    """

    status: int | None = None
    retry_after: float | None = None
    cut_after: int | None = None
    message: str = "injected fault"
    body: dict[str, Any] | None = None
    stream_error: dict[str, Any] | None = None
    stream_error_as: Literal["event", "data", "failed"] = "event"
    echo_key: bool = False


@dataclass
class Reply:
    """One scripted model turn.

    ``usage`` is ``(prompt_tokens, completion_tokens)``; by default it is estimated as
    ``len / 4`` of the request body and of the generated strings. Text, reasoning and tool
    arguments are split into fragments of ``chunk_size`` characters, each its own SSE event;
    ``chunk_delay`` seconds pass between consecutive events.

    ``refusal``: the model refuses, in each vendor's way: Chat ``delta.refusal`` fragments,
    a Responses ``refusal`` content part (``response.refusal.delta``), Anthropic a text block
    and stop reason ``"refusal"``.

    ``server_tool_calls`` (Anthropic only): tools the server runs itself, streamed before the
    text as a ``server_tool_type`` block (default ``server_tool_use``; any other name plays
    a block type the client does not know) with ``input_json_delta`` fragments, then its
    result block (``web_search_tool_result`` for ``web_search``, else ``<name>_tool_result``).
    """

    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallSpec] = field(default_factory=list)
    refusal: str = ""
    server_tool_calls: list[ToolCallSpec] = field(default_factory=list)
    server_tool_type: str = "server_tool_use"
    usage: tuple[int, int] | None = None
    omit_usage: bool = False  # Chat/Responses: send no usage at all (as some servers do)
    # Of the prompt tokens: read from the prompt cache, and (Anthropic) written to it, each
    # reported in the vendor's shape.
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    chunk_size: int = 8
    chunk_delay: float = 0.0
    fault: Fault | None = None

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        if self.chunk_delay < 0:
            raise ValueError("chunk_delay must be >= 0")


@dataclass
class RecordedRequest:
    """A request as the fake received it.

    ``error`` is the message of the 4xx/5xx the fake answered with (validation, auth, script
    exhausted), ``None`` if it was served from a :class:`Reply` (``reply`` is then set; a
    ``Fault`` with a status also leaves ``error`` at ``None``).
    """

    path: str
    headers: dict[str, str]
    json: Any
    api: Api
    error: str | None = None
    raw: bytes = b""  # the body's exact bytes
    reply: Reply | None = None


Responder = Callable[[RecordedRequest], "Reply | Awaitable[Reply]"]


class _Invalid(Exception):
    """A request that a real provider would reject with 400."""


_OPENAI_ERROR: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", None),
}
_ANTHROPIC_ERROR: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_RESPONSES_ROLES = frozenset({"system", "developer", "user", "assistant"})


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _data(obj: Any) -> bytes:
    return f"data: {_dumps(obj)}\n\n".encode()


def _event(name: str, obj: Any) -> bytes:
    return f"event: {name}\ndata: {_dumps(obj)}\n\n".encode()


def _split(s: str, size: int) -> list[str]:
    return [s[i : i + size] for i in range(0, len(s), size)]


def _format_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


class FakeLLM:
    """The fake server. Use ``async with FakeLLM() as fake:`` (or ``start()`` / ``stop()``)."""

    def __init__(
        self, *, api_key: str | None = None, host: str = "127.0.0.1", shutdown_timeout: float = 0.2
    ) -> None:
        self.api_key = api_key
        self.host = host
        self.port = 0
        self.requests: list[RecordedRequest] = []
        self.responder: Responder | None = None
        self.disconnects = 0
        # Transports seen, kept alive so a new connection is never mistaken for an old one.
        self._transports: list[object] = []
        self.unexpected = 0
        self._queue: deque[Reply] = deque()
        self._call_counter = 0
        self._id_counter = 0
        self._response_calls: dict[str, tuple[str, ...]] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._shutdown_timeout = shutdown_timeout
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def root_url(self) -> str:
        """``http://127.0.0.1:PORT`` (Anthropic clients post to ``root_url + "/v1/messages"``)."""
        if self._runner is None:
            raise RuntimeError("FakeLLM is not running")
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``: the base URL an OpenAI client uses."""
        return self.root_url + "/v1"

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("FakeLLM already started")
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle_chat)
        app.router.add_post("/v1/responses", self._handle_responses)
        app.router.add_post("/v1/messages", self._handle_anthropic)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=self._shutdown_timeout
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, 0)
        await site.start()
        addresses = runner.addresses  # socknames of the site's listening sockets
        if not addresses:
            await runner.cleanup()
            raise RuntimeError("FakeLLM: could not determine the bound port")
        self.port = int(addresses[0][1])
        self._runner = runner

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ scripting

    def script(self, *replies: Reply) -> None:
        """Append replies to the FIFO queue; each request consumes one."""
        for reply in replies:
            if not isinstance(reply, Reply):
                raise TypeError(f"expected Reply, got {type(reply).__name__}")
        self._queue.extend(replies)

    @property
    def pending(self) -> int:
        """How many scripted replies have not been consumed yet."""
        return len(self._queue)

    def assert_complete(self) -> None:
        """Fail if scripted replies remain unconsumed."""
        if self._queue:
            left = ", ".join(repr(r) for r in list(self._queue)[:3])
            more = "" if len(self._queue) <= 3 else ", ..."
            raise AssertionError(
                f"fake LLM: {len(self._queue)} scripted repl"
                f"{'y' if len(self._queue) == 1 else 'ies'} not consumed: {left}{more}"
            )

    async def wait_for_requests(self, n: int, timeout: float = 5) -> None:
        """Wait until at least ``n`` requests arrived (AssertionError on timeout)."""
        await self._wait_until(lambda: len(self.requests) >= n, timeout, f"{n} request(s)")

    async def wait_for_disconnects(self, n: int = 1, timeout: float = 5) -> None:
        """Wait until at least ``n`` client disconnects were seen (AssertionError on timeout)."""
        await self._wait_until(lambda: self.disconnects >= n, timeout, f"{n} disconnect(s)")

    async def _wait_until(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append(fut)
            try:
                async with asyncio.timeout_at(deadline):
                    await fut
            except TimeoutError:
                raise AssertionError(
                    f"fake LLM: timed out after {timeout}s waiting for {what} "
                    f"(requests={len(self.requests)}, disconnects={self.disconnects})"
                ) from None
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)

    def _notify(self) -> None:
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def _next_id(self, prefix: str) -> str:
        self._id_counter += 1
        return f"{prefix}{self._id_counter}"

    def _next_call_id(self) -> str:
        self._call_counter += 1
        return f"call_{self._call_counter}"

    # ------------------------------------------------------------------ HTTP handling

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat")

    async def _handle_responses(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "responses")

    async def _handle_anthropic(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "anthropic")

    @property
    def connections(self) -> int:
        """How many distinct TCP connections requests arrived on."""
        return len(self._transports)

    async def _handle(self, request: web.Request, api: Api) -> web.StreamResponse:
        if not any(t is request.transport for t in self._transports):
            self._transports.append(request.transport)
        raw = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        body: Any
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        rec = RecordedRequest(path=request.path, headers=headers, json=body, api=api, raw=raw)
        self.requests.append(rec)
        self._notify()

        auth_error = self._check_auth(api, headers)
        if auth_error is not None:
            rec.error = auth_error
            return self._error(api, 401, auth_error)
        try:
            if body is None:
                raise _Invalid(
                    "We could not parse the JSON body of your request. (HINT: This likely means "
                    "you aren't using your HTTP library correctly.)"
                )
            if not isinstance(body, dict):
                raise _Invalid("The request body must be a JSON object.")
            if api == "chat":
                _validate_chat(body)
            elif api == "responses":
                self._validate_responses(body)
            else:
                _validate_anthropic(body, headers)
        except _Invalid as exc:
            rec.error = str(exc)
            return self._error(api, 400, str(exc))

        reply = await self._take_reply(rec)
        if reply is None:
            self.unexpected += 1
            rec.error = SCRIPT_EXHAUSTED
            return self._error(api, 500, SCRIPT_EXHAUSTED)
        rec.reply = reply

        fault = reply.fault
        if fault is not None and fault.status is not None:
            extra = {}
            if fault.retry_after is not None:
                extra["Retry-After"] = _format_seconds(fault.retry_after)
            message = fault.message + (_echo(api, headers) if fault.echo_key else "")
            return self._error(api, fault.status, message, extra, fault.body)

        if api == "chat":
            events = list(self._chat_events(body, reply, len(raw)))
        elif api == "responses":
            events = list(self._responses_events(body, reply, len(raw)))
        else:
            events = list(self._anthropic_events(body, reply, len(raw)))
        if fault is not None and fault.stream_error is not None:
            kept = 1 if fault.cut_after is None else fault.cut_after
            events = [*events[:kept], self._stream_error(api, fault, kept, body)]
        return await self._stream(request, reply, events)

    def _stream_error(self, api: Api, fault: Fault, seq: int, body: dict[str, Any]) -> bytes:
        """The in-stream error event of `fault` (see :class:`Fault`), in `api`'s shape."""
        error = fault.stream_error or {}
        if api == "anthropic":
            return _event("error", {"type": "error", "error": error})
        if api == "chat":
            if fault.stream_error_as == "data":
                return _data({"error": error})
            return _event("error", {"error": error})
        if fault.stream_error_as == "failed":
            response = {
                "id": self._next_id("resp_"),
                "object": "response",
                "status": "failed",
                "model": body["model"],
                "output": [],
                "error": {
                    "code": error.get("code") or error.get("type"),
                    "message": error.get("message"),
                },
                "incomplete_details": None,
                "usage": None,
            }
            payload = {"type": "response.failed", "sequence_number": seq, "response": response}
            return _event("response.failed", payload)
        payload = {
            "type": "error",
            "code": error.get("code"),
            "message": error.get("message"),
            "param": error.get("param"),
            "sequence_number": seq,
        }
        return _event("error", payload)

    async def _take_reply(self, rec: RecordedRequest) -> Reply | None:
        if self._queue:
            return self._queue.popleft()
        if self.responder is None:
            return None
        result = self.responder(rec)
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, Reply):
            raise TypeError(f"responder must return a Reply, got {type(result).__name__}")
        return result

    def _check_auth(self, api: Api, headers: dict[str, str]) -> str | None:
        if api == "anthropic":
            key = headers.get("x-api-key")
            if not key:
                return "x-api-key header is required"
            if self.api_key is not None and key != self.api_key:
                return "invalid x-api-key"
            return None
        if self.api_key is None:
            return None
        auth = headers.get("authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            return (
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
            )
        if auth[7:].strip() != self.api_key:
            return "Incorrect API key provided."
        return None

    @staticmethod
    def _error(
        api: Api,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        recorded: dict[str, Any] | None = None,
    ) -> web.Response:
        body: dict[str, Any]
        if recorded is not None:
            body = recorded
        elif api == "anthropic":
            etype = _ANTHROPIC_ERROR.get(status, "api_error")
            body = {"type": "error", "error": {"type": etype, "message": message}}
        else:
            default = ("server_error", None) if status >= 500 else ("invalid_request_error", None)
            etype, code = _OPENAI_ERROR.get(status, default)
            body = {"error": {"message": message, "type": etype, "param": None, "code": code}}
        return web.json_response(body, status=status, headers=headers, dumps=_dumps)

    async def _stream(
        self, request: web.Request, reply: Reply, events: list[bytes]
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers=_SSE_HEADERS)
        fault = reply.fault
        # A stream error ends the stream where it stands: `cut_after` placed it, no cut.
        cut = fault.cut_after if fault is not None and fault.stream_error is None else None
        delay = reply.chunk_delay
        try:
            await resp.prepare(request)  # sends the headers right away
            if cut is None and delay == 0:
                # Fast path for benchmarks: the events are still separate SSE events.
                await resp.write(b"".join(events))
            else:
                for i, event in enumerate(events):
                    if cut is not None and i >= cut:
                        break
                    if i and delay:
                        await asyncio.sleep(delay)
                    await resp.write(event)
                if cut is not None:
                    # Drop the connection abruptly: no final events, no chunked terminator.
                    if request.transport is not None:
                        request.transport.close()
                    return resp
            await resp.write_eof()
        except ConnectionError:
            self.disconnects += 1
            self._notify()
        return resp

    # ------------------------------------------------------------------ validation

    def _validate_responses(self, body: dict[str, Any]) -> None:
        _require_str(body, "model")
        _require_stream(body)
        if "input" not in body:
            raise _Invalid("Missing required parameter: 'input'.")
        items = body["input"]
        if isinstance(items, str):
            return
        if not isinstance(items, list):
            raise _Invalid("Invalid type for 'input': expected a string or an array.")
        required: dict[str, None] = {}
        prev = body.get("previous_response_id")
        if prev is not None:
            if prev not in self._response_calls:
                raise _Invalid(f"Previous response with id '{prev}' not found.")
            required.update(dict.fromkeys(self._response_calls[prev]))
        answered: set[str] = set()
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise _Invalid(f"Invalid type for 'input[{i}]': expected an object.")
            kind = item.get("type")
            if kind == "function_call":
                call_id = item.get("call_id")
                if not isinstance(call_id, str) or not call_id:
                    raise _Invalid(f"Missing required parameter: 'input[{i}].call_id'.")
                if not isinstance(item.get("name"), str):
                    raise _Invalid(f"Missing required parameter: 'input[{i}].name'.")
                if not isinstance(item.get("arguments"), str):
                    raise _Invalid(f"Invalid type for 'input[{i}].arguments': expected a string.")
                required[call_id] = None
            elif kind == "function_call_output":
                call_id = item.get("call_id")
                if call_id not in required:
                    raise _Invalid(
                        f"No tool call found for function call output with call_id {call_id}."
                    )
                if "output" not in item:
                    raise _Invalid(f"Missing required parameter: 'input[{i}].output'.")
                answered.add(call_id)
            elif kind in (None, "message") and item.get("role") not in _RESPONSES_ROLES:
                raise _Invalid(
                    f"Invalid value for 'input[{i}].role': expected one of 'user', "
                    "'assistant', 'system', 'developer'."
                )
        for call_id in required:
            if call_id not in answered:
                raise _Invalid(f"No tool output found for function call {call_id}.")

    # ------------------------------------------------------------------ wire formats

    @staticmethod
    def _usage(reply: Reply, body_len: int) -> tuple[int, int]:
        if reply.usage is not None:
            return reply.usage
        generated = len(reply.text) + len(reply.reasoning)
        generated += sum(len(tc.arguments_json()) + len(tc.name) for tc in reply.tool_calls)
        return max(1, body_len // 4), max(1, generated // 4)

    def _chat_events(self, body: dict[str, Any], reply: Reply, body_len: int) -> Iterator[bytes]:
        prompt, completion = self._usage(reply, body_len)
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        include_usage = include_usage and not reply.omit_usage
        base: dict[str, Any] = {
            "id": self._next_id("chatcmpl-"),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body["model"],
            "system_fingerprint": "fp_fake",
        }
        size = reply.chunk_size

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            obj = {
                **base,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if include_usage:
                obj["usage"] = None
            return _data(obj)

        yield chunk({"role": "assistant", "content": ""})
        for frag in _split(reply.reasoning, size):
            yield chunk({"content": None, "reasoning_content": frag})
        for frag in _split(reply.text, size):
            yield chunk({"content": frag})
        for frag in _split(reply.refusal, size):
            yield chunk({"content": None, "refusal": frag})
        for index, tc in enumerate(reply.tool_calls):
            call_id = tc.id or self._next_call_id()
            head = {
                "index": index,
                "id": call_id,
                "type": "function",
                "function": {"name": tc.name, "arguments": ""},
            }
            yield chunk({"tool_calls": [head]})
            for frag in _split(tc.arguments_json(), size):
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": frag}}]})
        yield chunk({}, "tool_calls" if reply.tool_calls else "stop")
        if include_usage:
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": reply.cached_tokens, "audio_tokens": 0},
            }
            yield _data({**base, "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"

    def _responses_events(
        self, body: dict[str, Any], reply: Reply, body_len: int
    ) -> Iterator[bytes]:
        prompt, completion = self._usage(reply, body_len)
        size = reply.chunk_size
        resp_id = self._next_id("resp_")
        seq = 0

        def ev(name: str, payload: dict[str, Any]) -> bytes:
            nonlocal seq
            obj = {"type": name, "sequence_number": seq, **payload}
            seq += 1
            return _event(name, obj)

        def response(status: str, output: list[Any], usage: Any) -> dict[str, Any]:
            return {
                "id": resp_id,
                "object": "response",
                "created_at": int(time.time()),
                "status": status,
                "error": None,
                "incomplete_details": None,
                "instructions": body.get("instructions"),
                "model": body["model"],
                "output": output,
                "parallel_tool_calls": True,
                "previous_response_id": body.get("previous_response_id"),
                "tools": body.get("tools", []),
                "usage": usage,
            }

        output: list[dict[str, Any]] = []
        yield ev("response.created", {"response": response("in_progress", [], None)})
        yield ev("response.in_progress", {"response": response("in_progress", [], None)})

        if reply.reasoning:
            index, item_id = len(output), self._next_id("rs_")
            part: dict[str, Any] = {"type": "summary_text", "text": reply.reasoning}
            ids: dict[str, Any] = {"item_id": item_id, "output_index": index, "summary_index": 0}
            item: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": []}
            yield ev("response.output_item.added", {"output_index": index, "item": item})
            yield ev(
                "response.reasoning_summary_part.added",
                {**ids, "part": {"type": "summary_text", "text": ""}},
            )
            for frag in _split(reply.reasoning, size):
                yield ev("response.reasoning_summary_text.delta", {**ids, "delta": frag})
            yield ev("response.reasoning_summary_text.done", {**ids, "text": reply.reasoning})
            yield ev("response.reasoning_summary_part.done", {**ids, "part": part})
            item = {**item, "summary": [part]}
            output.append(item)
            yield ev("response.output_item.done", {"output_index": index, "item": item})

        if reply.text or reply.refusal or not reply.tool_calls:
            index, item_id = len(output), self._next_id("msg_")
            item = {
                "id": item_id,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            yield ev("response.output_item.added", {"output_index": index, "item": item})
            parts: list[dict[str, Any]] = []
            if reply.text or not reply.refusal:
                part = {"type": "output_text", "text": reply.text, "annotations": []}
                ids = {"item_id": item_id, "output_index": index, "content_index": len(parts)}
                yield ev("response.content_part.added", {**ids, "part": {**part, "text": ""}})
                for frag in _split(reply.text, size):
                    yield ev("response.output_text.delta", {**ids, "delta": frag, "logprobs": []})
                yield ev("response.output_text.done", {**ids, "text": reply.text, "logprobs": []})
                yield ev("response.content_part.done", {**ids, "part": part})
                parts.append(part)
            if reply.refusal:
                part = {"type": "refusal", "refusal": reply.refusal}
                ids = {"item_id": item_id, "output_index": index, "content_index": len(parts)}
                yield ev("response.content_part.added", {**ids, "part": {**part, "refusal": ""}})
                for frag in _split(reply.refusal, size):
                    yield ev("response.refusal.delta", {**ids, "delta": frag})
                yield ev("response.refusal.done", {**ids, "refusal": reply.refusal})
                yield ev("response.content_part.done", {**ids, "part": part})
                parts.append(part)
            item = {**item, "status": "completed", "content": parts}
            output.append(item)
            yield ev("response.output_item.done", {"output_index": index, "item": item})

        call_ids: list[str] = []
        for tc in reply.tool_calls:
            index, item_id = len(output), self._next_id("fc_")
            call_id = tc.id or self._next_call_id()
            call_ids.append(call_id)
            arguments = tc.arguments_json()
            item = {
                "id": item_id,
                "type": "function_call",
                "status": "in_progress",
                "arguments": "",
                "call_id": call_id,
                "name": tc.name,
            }
            ids = {"item_id": item_id, "output_index": index}
            yield ev("response.output_item.added", {"output_index": index, "item": item})
            for frag in _split(arguments, size):
                yield ev("response.function_call_arguments.delta", {**ids, "delta": frag})
            yield ev("response.function_call_arguments.done", {**ids, "arguments": arguments})
            item = {**item, "status": "completed", "arguments": arguments}
            output.append(item)
            yield ev("response.output_item.done", {"output_index": index, "item": item})

        self._response_calls[resp_id] = tuple(call_ids)
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": reply.cached_tokens},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": len(reply.reasoning) // 4},
            "total_tokens": prompt + completion,
        }
        final_usage = None if reply.omit_usage else usage
        yield ev("response.completed", {"response": response("completed", output, final_usage)})

    def _anthropic_events(
        self, body: dict[str, Any], reply: Reply, body_len: int
    ) -> Iterator[bytes]:
        prompt, completion = self._usage(reply, body_len)
        size = reply.chunk_size
        message = {
            "id": self._next_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                # Anthropic's input_tokens leave out the cache reads and writes
                "input_tokens": prompt - reply.cached_tokens - reply.cache_write_tokens,
                "cache_creation_input_tokens": reply.cache_write_tokens,
                "cache_read_input_tokens": reply.cached_tokens,
                "output_tokens": 1,
            },
        }
        yield _event("message_start", {"type": "message_start", "message": message})
        yield _event("ping", {"type": "ping"})
        index = 0

        def start(block: dict[str, Any]) -> bytes:
            return _event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": block},
            )

        def delta(payload: dict[str, Any]) -> bytes:
            return _event(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": payload},
            )

        def stop() -> bytes:
            return _event("content_block_stop", {"type": "content_block_stop", "index": index})

        if reply.reasoning:
            yield start({"type": "thinking", "thinking": "", "signature": ""})
            for frag in _split(reply.reasoning, size):
                yield delta({"type": "thinking_delta", "thinking": frag})
            signature = f"fakesig-{len(reply.reasoning)}-{message['id']}"
            yield delta({"type": "signature_delta", "signature": signature})
            yield stop()
            index += 1
        for tc in reply.server_tool_calls:
            call_id = tc.id or self._next_id("srvtoolu_")
            block = {"type": reply.server_tool_type, "id": call_id, "name": tc.name, "input": {}}
            yield start(block)
            for frag in _split(tc.arguments_json(), size):
                yield delta({"type": "input_json_delta", "partial_json": frag})
            yield stop()
            index += 1
            yield start(_server_tool_result(tc.name, call_id))
            yield stop()
            index += 1
        if reply.text or reply.refusal or not reply.tool_calls:
            yield start({"type": "text", "text": ""})
            for frag in _split(reply.text + reply.refusal, size):
                yield delta({"type": "text_delta", "text": frag})
            yield stop()
            index += 1
        for tc in reply.tool_calls:
            call_id = tc.id or self._next_call_id()
            yield start({"type": "tool_use", "id": call_id, "name": tc.name, "input": {}})
            for frag in _split(tc.arguments_json(), size):
                yield delta({"type": "input_json_delta", "partial_json": frag})
            yield stop()
            index += 1
        yield _event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": (
                        "refusal"
                        if reply.refusal
                        else "tool_use"
                        if reply.tool_calls
                        else "end_turn"
                    ),
                    "stop_sequence": None,
                },
                "usage": {"output_tokens": completion},
            },
        )
        yield _event("message_stop", {"type": "message_stop"})


def _echo(api: Api, headers: dict[str, str]) -> str:
    """`ECHO` for the credential in `headers` (see `Fault.echo_key`)."""
    name = "x-api-key" if api == "anthropic" else "authorization"
    header = headers.get(name, "")
    key = header.removeprefix("Bearer ")
    line = f"{name}: {header}".encode()
    return ECHO.format(
        header=header,
        quoted=urllib.parse.quote(key, safe=""),
        line_b64=base64.b64encode(line).decode(),
        headers_json=json.dumps({name: header}),
    )


def _server_tool_result(name: str, call_id: str) -> dict[str, Any]:
    """The result block a server tool's use is followed by (no deltas of its own)."""
    if name == "web_search":
        result = {
            "type": "web_search_result",
            "title": "Fake result",
            "url": "https://example.com/fake",
            "encrypted_content": "ZmFrZQ==",
            "page_age": None,
        }
        return {"type": "web_search_tool_result", "tool_use_id": call_id, "content": [result]}
    return {"type": f"{name}_tool_result", "tool_use_id": call_id, "content": []}


# ---------------------------------------------------------------------- validators


def _require_str(body: dict[str, Any], key: str) -> None:
    if not isinstance(body.get(key), str) or not body[key]:
        raise _Invalid(f"Missing required parameter: '{key}'.")


def _require_stream(body: dict[str, Any]) -> None:
    if body.get("stream") is not True:
        raise _Invalid("fake LLM only serves streaming requests: set 'stream': true.")


def _validate_chat(body: dict[str, Any]) -> None:
    _require_str(body, "model")
    _require_stream(body)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _Invalid("Missing required parameter: 'messages'.")
    if not messages:
        raise _Invalid("Invalid 'messages': empty array. Expected an array with minimum length 1.")
    if "tools" in body:
        tools = body["tools"]
        if not isinstance(tools, list):
            raise _Invalid("Invalid type for 'tools': expected an array.")
        if not tools:
            raise _Invalid(
                "Invalid 'tools': empty array. Expected an array with minimum length 1, "
                "but got an empty array instead."
            )
    pending: dict[str, None] = {}  # call ids still waiting for their tool message, in order
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise _Invalid(f"Invalid type for 'messages[{i}]': expected an object.")
        role = msg.get("role")
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if call_id not in pending:
                raise _Invalid(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    f"preceeding message with 'tool_calls' (messages[{i}].tool_call_id="
                    f"{call_id!r} matches no pending tool call)."
                )
            del pending[call_id]
            continue
        if pending:
            raise _Invalid(_chat_unanswered(pending, i))
        if role not in _CHAT_ROLES:
            raise _Invalid(f"Invalid value for 'messages[{i}].role': {role!r}.")
        if role != "assistant" or msg.get("tool_calls") is None:
            continue
        calls = msg["tool_calls"]
        if not isinstance(calls, list) or not calls:
            raise _Invalid(
                f"Invalid 'messages[{i}].tool_calls': empty array. Expected an array with "
                "minimum length 1, but got an empty array instead."
            )
        for j, call in enumerate(calls):
            where = f"messages[{i}].tool_calls[{j}]"
            if not isinstance(call, dict) or not isinstance(call.get("id"), str):
                raise _Invalid(f"Missing required parameter: '{where}.id'.")
            if call.get("type") != "function":
                raise _Invalid(f"Missing required parameter: '{where}.type'.")
            function = call.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise _Invalid(f"Missing required parameter: '{where}.function.name'.")
            if not isinstance(function.get("arguments"), str):
                raise _Invalid(f"Invalid type for '{where}.function.arguments': expected a string.")
            if call["id"] in pending:
                raise _Invalid(f"Duplicate tool call id {call['id']!r} in '{where}'.")
            pending[call["id"]] = None
    if pending:
        raise _Invalid(_chat_unanswered(pending, len(messages)))


def _chat_unanswered(pending: dict[str, None], index: int) -> str:
    return (
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
        f"{', '.join(pending)} (before messages[{index}])."
    )


MAX_CACHE_BREAKPOINTS = 4


def _cache_marks(body: dict[str, Any]) -> int:
    """The `cache_control` breakpoints of an Anthropic request: on tools, system blocks and
    message content blocks."""
    blocks: list[Any] = list(body.get("tools") or [])
    if isinstance(body.get("system"), list):
        blocks += body["system"]
    for message in body.get("messages") or []:
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            blocks += message["content"]
    return sum(1 for b in blocks if isinstance(b, dict) and "cache_control" in b)


def _validate_anthropic(body: dict[str, Any], headers: dict[str, str]) -> None:
    if not headers.get("anthropic-version"):
        raise _Invalid("anthropic-version: header is required")
    _require_str(body, "model")
    if not isinstance(body.get("max_tokens"), int):
        raise _Invalid("max_tokens: Field required")
    _require_stream(body)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _Invalid("messages: Field required")
    if not messages:
        raise _Invalid("messages: at least one message is required")
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise _Invalid("system: Input should be a valid string or list of text blocks")
    marks = _cache_marks(body)
    if marks > MAX_CACHE_BREAKPOINTS:
        raise _Invalid(
            f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {marks}."
        )
    expected: list[str] = []  # tool_use ids of the previous assistant message
    last = len(messages) - 1
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise _Invalid(f"messages.{i}: Input should be a valid dictionary")
        role = msg.get("role")
        if role == "system":
            raise _Invalid(
                'messages: Unexpected role "system". The Messages API accepts a top-level '
                '`system` parameter, not "system" as an input message role.'
            )
        if role not in ("user", "assistant"):
            raise _Invalid(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        content = msg.get("content")
        optional_empty = i == last and role == "assistant"
        if isinstance(content, str):
            blocks: list[Any] = []
            if not content and not optional_empty:
                raise _Invalid(
                    f"messages.{i}: all messages must have non-empty content except for the "
                    "optional final assistant message"
                )
        elif isinstance(content, list):
            blocks = content
            if not blocks and not optional_empty:
                raise _Invalid(
                    f"messages.{i}: all messages must have non-empty content except for the "
                    "optional final assistant message"
                )
        else:
            raise _Invalid(f"messages.{i}.content: Field required")

        results: set[str] = set()
        uses: list[str] = []
        for j, block in enumerate(blocks):
            where = f"messages.{i}.content.{j}"
            if not isinstance(block, dict):
                raise _Invalid(f"{where}: Input should be a valid dictionary")
            kind = block.get("type")
            if kind == "text":
                if not isinstance(block.get("text"), str) or not block["text"]:
                    raise _Invalid("messages: text content blocks must be non-empty")
            elif kind == "tool_result":
                if role != "user":
                    raise _Invalid(f"{where}: `tool_result` blocks can only be in user messages")
                use_id = block.get("tool_use_id")
                if use_id not in expected:
                    raise _Invalid(
                        f"{where}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{use_id}. Each `tool_result` block must have a corresponding "
                        "`tool_use` block in the previous message."
                    )
                results.add(use_id)
            elif kind == "tool_use":
                if role != "assistant":
                    raise _Invalid(f"{where}: `tool_use` blocks can only be in assistant messages")
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                    raise _Invalid(f"{where}.tool_use: `id` and `name` are required")
                if not isinstance(block.get("input"), dict):
                    raise _Invalid(f"{where}.tool_use.input: Input should be a valid dictionary")
                uses.append(block["id"])
            elif kind in ("thinking", "redacted_thinking"):
                if role != "assistant":
                    raise _Invalid(f"{where}: thinking blocks can only be in assistant messages")
                if kind == "thinking" and not isinstance(block.get("signature"), str):
                    raise _Invalid(f"{where}.thinking.signature: Field required")
        missing = [use_id for use_id in expected if use_id not in results]
        if missing:
            raise _Invalid(
                f"messages.{i - 1}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message."
            )
        expected = uses
    if expected:
        raise _Invalid(
            f"messages.{last}: `tool_use` ids were found without `tool_result` blocks "
            f"immediately after: {', '.join(expected)}. Each `tool_use` block must have a "
            "corresponding `tool_result` block in the next message."
        )
