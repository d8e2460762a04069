"""LLM requests start at most `per_tick` per turn of the event loop (docs/providers.md,
"Pacing"): answers already arriving are read between the starts of new requests, and a
request on an idle loop never waits."""

from __future__ import annotations

import asyncio

from core.messages import Message
from core.providers.transport import STARTS_PER_TICK, SendGate, send_gate
from tests.conftest import provider_for
from tests.fakes.llm import FakeLLM, Reply


async def _entered_per_tick(gate: SendGate, n: int) -> tuple[list[int], list[int]]:
    """Start `n` entrants at once; how many had entered after each turn of the loop, and
    the order they entered in."""
    order: list[int] = []

    async def one(i: int) -> None:
        await gate.enter()
        order.append(i)

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    counts = []
    while len(order) < n:
        await asyncio.sleep(0)  # one turn of the loop
        counts.append(len(order))
    await asyncio.gather(*tasks)
    return counts, order


async def test_a_burst_enters_a_few_per_turn_of_the_loop_in_order() -> None:
    gate = SendGate(asyncio.get_running_loop(), per_tick=2)
    counts, order = await _entered_per_tick(gate, 9)
    steps = [b - a for a, b in zip([0, *counts], counts, strict=False)]
    assert max(steps) <= 2 * gate.per_tick  # a turn's own and its woken waiters, at most
    assert len(counts) >= 9 // (2 * gate.per_tick)
    assert order == sorted(order)  # first come, first started


async def test_a_lone_request_on_an_idle_loop_does_not_wait() -> None:
    gate = SendGate(asyncio.get_running_loop(), per_tick=2)
    for _ in range(3):
        entered = asyncio.ensure_future(gate.enter())
        await asyncio.sleep(0)  # its first step: through at once
        assert entered.done()
        await asyncio.sleep(0)  # the loop goes on; the next turn has its places back
        await asyncio.sleep(0)


async def test_a_cancelled_waiter_leaves_the_queue_and_the_next_one_goes() -> None:
    gate = SendGate(asyncio.get_running_loop(), per_tick=1)
    first, cancelled, waiting = (asyncio.create_task(gate.enter()) for _ in range(3))
    await asyncio.sleep(0)  # all three have asked: the first took this turn's place
    assert [first.done(), cancelled.done(), waiting.done()] == [True, False, False]
    cancelled.cancel()
    await asyncio.wait_for(waiting, timeout=10)
    assert cancelled.cancelled()
    assert not gate._waiters


async def test_every_request_of_a_burst_is_answered_through_the_gate(fake_llm: FakeLLM) -> None:
    provider = provider_for(fake_llm, max_retries=0)
    n = STARTS_PER_TICK * 20
    fake_llm.script(*(Reply(text="ok") for _ in range(n)))
    done = await asyncio.gather(*(provider.complete([Message.user("hi")]) for _ in range(n)))
    assert len(done) == len(fake_llm.requests) == n
    assert send_gate() is send_gate()  # one gate per loop, shared by every endpoint
    await provider.aclose()
