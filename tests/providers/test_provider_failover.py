"""Provider failover (docs/providers.md#failover) against the fake LLM: a turn goes on on the
next provider after a retryable failure outlives the provider's own retries; the breaker
keeps a failing provider out for its cool-down (injected clock); a thinking conversation
moves cleanly to an OpenAI-format provider; with nobody left the run waits and says so.

(Not tests/test_failover.py: that one is about workers taking over leased singletons.)"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.config import parse_config
from core.agent.commands import _failover_lines
from core.errors import ConfigError, ProviderError
from core.events import LoopEvent, Notice, Observed, StreamRestarted
from core.messages import Message
from core.providers import build_provider
from core.providers.base import Provider, ProviderSettings
from core.providers.failover import (
    Breakers,
    CircuitBreaker,
    FailoverProvider,
    FailoverSettings,
    NoProvidersAvailable,
    strip_foreign_reasoning,
)
from core.tools.base import ToolSpec
from tests.conftest import _OPEN_PROVIDERS
from tests.fakes.clock import FakeClock
from tests.fakes.llm import FakeLLM, Fault, Reply, ToolCallSpec

TOOLS = [ToolSpec("grep", "search files", {"type": "object", "properties": {}})]


@pytest.fixture
async def fakes() -> AsyncIterator[list[FakeLLM]]:
    servers = [FakeLLM() for _ in range(4)]
    for s in servers:
        await s.start()
    yield servers
    for s in servers:
        await s.stop()


def refused_url() -> str:
    """A port nobody listens on: the connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def provider(name: str, kind: str, url: str, clock: FakeClock, retries: int = 1) -> Provider:
    settings = ProviderSettings(
        name=name, kind=kind, base_url=url, model="fake-model", api_key="k", max_retries=retries
    )
    built = build_provider(settings, clock=clock)
    _OPEN_PROVIDERS.append(built)
    return built


def url_of(fake: FakeLLM, kind: str) -> str:
    return fake.root_url if kind == "anthropic" else fake.base_url


class Events:
    def __init__(self) -> None:
        self.all: list[LoopEvent] = []

    def __call__(self, event: LoopEvent) -> None:
        self.all.append(event)

    def observed(self, name: str) -> list[dict[str, object]]:
        return [e.data for e in self.all if isinstance(e, Observed) and e.name == name]


async def test_529_then_503_then_a_cut_stream_then_a_refused_connection_then_an_answer(
    fakes: list[FakeLLM],
) -> None:
    clock = FakeClock()
    a, b, c, d = fakes
    a.script(*[Reply(fault=Fault(status=529, message="Overloaded"))] * 2)  # its own retry too
    b.script(*[Reply(fault=Fault(status=503))] * 2)
    c.script(*[Reply(text="half an answer that is cut", fault=Fault(cut_after=3))] * 2)
    d.script(Reply(text="the answer"))
    chain = [
        provider("claude", "anthropic", url_of(a, "anthropic"), clock),
        provider("gpt", "openai_chat", url_of(b, "chat"), clock),
        provider("resp", "openai_chat", url_of(c, "chat"), clock),
        provider("down", "openai_chat", refused_url(), clock),
        provider("local", "openai_chat", url_of(d, "chat"), clock),
    ]
    failover = FailoverProvider(chain[0], chain[1:], Breakers(FailoverSettings(), clock))
    events = Events()
    messages = [Message.system("be brief"), Message.user("hello")]
    done = await failover.complete(messages, TOOLS, events)
    assert done.message.content == "the answer"
    assert done.message.origin == "local"
    hops = events.observed("agent.provider.failover")
    assert [(h["from"], h["to"]) for h in hops] == [
        ("claude", "gpt"),
        ("gpt", "resp"),
        ("resp", "down"),
        ("down", "local"),
    ]
    assert "529" in str(hops[0]["reason"])
    assert "503" in str(hops[1]["reason"])
    assert (
        "refused" in str(hops[3]["reason"]).lower() or "connect" in str(hops[3]["reason"]).lower()
    )
    restarts = [e for e in events.all if isinstance(e, StreamRestarted) and e.delay == 0.0]
    assert restarts[2].discard  # the cut stream had shown text: channels drop it
    assert [len(f.requests) for f in fakes] == [2, 2, 2, 1]  # each provider's own retries ran
    assert failover.turn_note is not None
    assert failover.turn_note.startswith("local (claude (HTTP 529")
    assert _failover_lines(failover)[0].startswith("Last turn answered by fallback local")
    # The rest of the turn stays on the fallback; the next turn starts on the channel's own.
    d.script(Reply(text="again"))
    assert (await failover.complete(messages, TOOLS)).message.content == "again"
    failover.begin_turn()
    assert failover.current is chain[0]
    assert failover.turn_note is None


async def test_the_breaker_keeps_a_failing_provider_out_then_probes_it(
    fakes: list[FakeLLM],
) -> None:
    clock = FakeClock()
    a, b, _, _ = fakes
    primary = provider("claude", "anthropic", url_of(a, "anthropic"), clock, retries=0)
    fallback = provider("gpt", "openai_chat", url_of(b, "chat"), clock)
    breakers = Breakers(FailoverSettings(cooldown_secs=30), clock)
    failover = FailoverProvider(primary, [fallback], breakers)
    messages = [Message.user("hi")]
    a.script(Reply(fault=Fault(status=529)))
    b.script(Reply(text="one"), Reply(text="two"), Reply(text="three"))
    assert (await failover.complete(messages)).message.content == "one"
    assert breakers.of("claude").state() == "open"
    failover.begin_turn()
    clock.now += 29  # within the cool-down: the primary is not even asked
    assert (await failover.complete(messages)).message.content == "two"
    assert len(a.requests) == 1
    assert "kept out" in (failover.turn_note or "")
    assert _failover_lines(failover)[-1] == "Providers kept out: claude: open"
    failover.begin_turn()
    clock.now += 2  # past it: one probe goes to the primary, which fails again
    a.script(Reply(fault=Fault(status=503)))
    assert (await failover.complete(messages)).message.content == "three"
    assert len(a.requests) == 2
    assert breakers.of("claude").state() == "open"  # opened again, for a new cool-down
    failover.begin_turn()
    clock.now += 31
    a.script(Reply(text="back"))
    assert (await failover.complete(messages)).message.content == "back"
    assert breakers.of("claude").state() == "closed"
    assert failover.turn_note is None


def test_breaker_states_on_an_injected_clock() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(cooldown=10, threshold=2, clock=clock)
    assert breaker.allow()
    breaker.failure()
    assert breaker.state() == "closed"  # below the threshold
    breaker.failure()
    assert breaker.state() == "open"
    assert not breaker.allow()
    clock.now += 10
    assert breaker.state() == "half_open"
    assert breaker.allow()  # the probe
    assert not breaker.allow()  # only one at a time
    breaker.success()
    assert breaker.state() == "closed"
    assert breaker.failures == 0


async def test_a_thinking_conversation_fails_over_to_openai_with_a_valid_request(
    fakes: list[FakeLLM],
) -> None:
    clock = FakeClock()
    a, b, _, _ = fakes
    claude = provider("claude", "anthropic", url_of(a, "anthropic"), clock, retries=0)
    gpt = provider("gpt", "openai_chat", url_of(b, "chat"), clock)
    failover = FailoverProvider(claude, [gpt], Breakers(FailoverSettings(), clock))
    a.script(Reply(reasoning="let me look for it", tool_calls=[ToolCallSpec("grep", {})]))
    messages = [Message.system("s"), Message.user("find it")]
    first = (await failover.complete(messages, TOOLS)).message
    assert first.reasoning_blocks
    assert first.reasoning_blocks[0]["type"] == "thinking"
    assert first.origin == "claude"
    messages += [first, Message.tool_result(first.tool_calls[0], "found: core/x.py")]
    a.script(Reply(fault=Fault(status=529, message="Overloaded")))
    b.script(Reply(text="It is in core/x.py."))
    done = await failover.complete(messages, TOOLS)
    assert done.message.content == "It is in core/x.py."
    (request,) = b.requests
    assert request.error is None  # the fake validates as OpenAI does: pairs, fields
    sent = json.dumps(request.json)
    assert "thinking" not in sent
    assert "signature" not in sent
    assistant = [m for m in request.json["messages"] if m["role"] == "assistant"]
    assert assistant[0]["tool_calls"][0]["id"] == first.tool_calls[0].id
    assert messages[2].reasoning_blocks  # the history keeps them for the provider that made them


def test_reasoning_goes_back_only_to_the_provider_that_made_it() -> None:
    block = {"type": "thinking", "thinking": "t", "signature": "sig"}
    made = Message(role="assistant", content="x", reasoning_blocks=(block,), origin="claude")
    older = Message(role="assistant", content="y", reasoning_blocks=(block,))  # no failover
    assert strip_foreign_reasoning([made], "claude")[0] is made
    assert strip_foreign_reasoning([made], "claude-eu")[0].reasoning_blocks == ()
    assert strip_foreign_reasoning([older], "claude", native=True)[0] is older
    assert strip_foreign_reasoning([older], "gpt")[0].reasoning_blocks == ()


async def test_all_providers_down_waits_then_names_the_providers_tried(
    fakes: list[FakeLLM],
) -> None:
    clock = FakeClock()
    a, _, _, _ = fakes
    a.script(*[Reply(fault=Fault(status=529))] * 2)
    claude = provider("claude", "anthropic", url_of(a, "anthropic"), clock)
    down = provider("gpt", "openai_chat", refused_url(), clock, retries=0)
    breakers = Breakers(FailoverSettings(no_providers_backoff_secs=2), clock)
    failover = FailoverProvider(claude, [down], breakers)
    events = Events()
    with pytest.raises(NoProvidersAvailable) as caught:
        await failover.complete([Message.user("hi")], (), events)
    text = str(caught.value)
    assert "no LLM provider is available" in text
    assert "claude (HTTP 529" in text
    assert "gpt (" in text
    assert clock.sleeps[-1] == 2  # the visible wait before the message
    notices = [e.text for e in events.all if isinstance(e, Notice)]
    assert len(notices) == 1
    assert notices[0].startswith("No LLM provider is available (tried claude (HTTP 529")
    assert notices[0].endswith("waiting 2s.")
    assert events.observed("agent.provider.unavailable")[0]["wait"] == 2
    # Both breakers are open now: the next call tries nobody and says so at once.
    with pytest.raises(NoProvidersAvailable, match="kept out after recent failures"):
        await failover.complete([Message.user("hi")])
    assert len(a.requests) == 2


async def test_a_non_retryable_error_is_the_answer_not_a_failover(fakes: list[FakeLLM]) -> None:
    clock = FakeClock()
    a, b, _, _ = fakes
    a.script(Reply(fault=Fault(status=400, message="bad request")))
    claude = provider("claude", "anthropic", url_of(a, "anthropic"), clock)
    gpt = provider("gpt", "openai_chat", url_of(b, "chat"), clock)
    failover = FailoverProvider(claude, [gpt], Breakers(FailoverSettings(), clock))
    with pytest.raises(ProviderError, match="bad request"):
        await failover.complete([Message.user("hi")])
    assert b.requests == []
    assert failover.breakers.of("claude").state() == "closed"  # it answered: it is up


async def test_a_cancelled_probe_leaves_the_next_call_to_probe(fakes: list[FakeLLM]) -> None:
    clock = FakeClock()
    a, b, _, _ = fakes
    claude = provider("claude", "anthropic", url_of(a, "anthropic"), clock, retries=0)
    gpt = provider("gpt", "openai_chat", url_of(b, "chat"), clock)
    breakers = Breakers(FailoverSettings(cooldown_secs=5), clock)
    failover = FailoverProvider(claude, [gpt], breakers)
    breakers.of("claude").failure()
    clock.now += 5  # half-open: the next call is the probe
    a.script(Reply(text="slow answer", chunk_size=2, chunk_delay=30))
    task = asyncio.ensure_future(failover.complete([Message.user("hi")]))
    await a.wait_for_requests(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert breakers.of("claude").state() == "half_open"  # not stuck open on a lost probe


def _raw(**providers: dict[str, object]) -> dict[str, object]:
    base = {"kind": "openai_chat", "model": "m", "base_url": "http://x"}
    return {
        "default_provider": "a",
        "providers": {name: {**base, **extra} for name, extra in providers.items()},
    }


def test_fallbacks_must_name_other_configured_providers() -> None:
    config = parse_config(_raw(a={"fallbacks": ["b"]}, b={}))
    assert config.providers["a"].fallbacks == ["b"]
    assert config.failover.no_providers_backoff_secs == 2
    for bad in (["c"], ["a"]):
        with pytest.raises(ConfigError) as caught:
            parse_config(_raw(a={"fallbacks": bad}, b={}))
        assert "providers.a.fallbacks" in str(caught.value)


def test_a_conversation_of_a_provider_with_fallbacks_fails_over() -> None:
    from bot.app import App, build_registry

    config = parse_config(_raw(a={"fallbacks": ["b"]}, b={}))
    app = App(config, {}, build_registry(config, {}))
    conversation = app.conversation("a")
    assert isinstance(conversation.provider, FailoverProvider)
    assert conversation.provider.breakers is app.breakers  # one per worker
    assert not isinstance(app.conversation("b").provider, FailoverProvider)


async def test_the_agent_fails_over_and_says_so_in_the_footer_status_and_events(
    fakes: list[FakeLLM], tmp_path: Path
) -> None:
    from tests.agentkit import RecordingResponder, inbound, running_agent

    fake = fakes[0]
    fake.script(Reply(fault=Fault(status=529, message="Overloaded")), Reply(text="from other"))
    providers = {"fake": {"max_retries": 0, "fallbacks": ["other"]}}
    async with running_agent(fake, tmp_path, providers=providers) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("hi"), chat)
        await agent.wait_idle()
        (final,) = chat.finals
        assert final is not None
        assert final.startswith("from other")
        assert "_(answered by fallback other (fake (HTTP 529" in final
        assert [r.json["model"] for r in fake.requests] == ["fake-model", "other-model"]
        await agent.submit(inbound("/status"), chat)
        status = await chat.wait_sent("Provider:")
        assert "Provider: fake (fake-model)" in status  # the channel's choice is kept
        assert "Last turn answered by fallback other (fake (HTTP 529" in status
        assert "Providers kept out: fake: open" in status
    lines = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    (hop,) = [e for e in lines if e.get("event") == "agent.provider.failover"]
    assert hop["from"] == "fake"
    assert hop["to"] == "other"
