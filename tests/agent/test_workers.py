"""Several workers on one PostgreSQL store, in process (docs/scale-out.md): two or three real
`Agent`s, each with its own store connection pool and worker id, on one schema, with the
fake LLM. Every worker answers through the same conversation ends (the platform), as every
`parley run` has every channel's outbound side. tests/test_workers_processes.py runs real
processes and kills one."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from bot.app import App, build_registry
from core.agent import Agent
from core.agent.journal import JournalBox
from core.messages import Message
from core.store import Checkpoint, open_store
from tests.agent.test_approvals_restart import RM, Board, PromptResponder, junk_dir
from tests.agentkit import RecordingResponder, agent_config, inbound
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply, ToolCallSpec
from tests.store.conftest import postgres_schema
from tests.store.test_postgres import sql

FAST = {"heartbeat_seconds": 0.2, "worker_timeout_seconds": 1.0, "sweep_seconds": 0.3}


class Platform:
    """The conversation ends every worker posts to (one per conversation key)."""

    def __init__(self, make: Callable[[], RecordingResponder] = RecordingResponder) -> None:
        self.ends: dict[tuple[str, str, str], RecordingResponder] = {}
        self._make = make

    def __call__(self, key: tuple[str, str, str]) -> RecordingResponder:
        return self.ends.setdefault(key, self._make())

    def answered(self) -> int:
        """Replies delivered in full, in every conversation."""
        return sum(f is not None for end in self.ends.values() for f in end.finals)


@contextlib.asynccontextmanager
async def workers(
    fake_llm: FakeLLM,
    tmp_path: Path,
    url: str,
    responders: Callable[[Any], Any],
    count: int,
    shared_channels: tuple[str, ...] = ("test",),
    **config: Any,
) -> AsyncIterator[list[Agent]]:
    """`count` agents sharing the store at `url` (and the conversations of
    `shared_channels`), each joined (`reconcile`)."""
    apps: list[App] = []
    agents: list[Agent] = []
    try:
        for n in range(count):
            store = {"path": None, "url": url, **FAST}
            cfg = agent_config(fake_llm, tmp_path, store=store, **config)
            app = App(cfg, {}, build_registry(cfg, {}))
            apps.append(app)
            agent = await app.open_agent(
                responders if callable(responders) else responders[n],
                shared_channels=list(shared_channels),
            )
            agents.append(agent)
            await agent.reconcile()
        yield agents
    finally:
        for app, agent in zip(apps, agents, strict=False):
            await app.close_agent(agent, grace=1.0)
            await app.aclose()


async def until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Wait for `condition` (checked often), failing after `timeout` seconds."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


def user_texts(request: RecordedRequest) -> list[str]:
    users = [m["content"] for m in request.json["messages"] if m["role"] == "user"]
    return [c if isinstance(c, str) else c[0]["text"] for c in users]


def last_user_text(request: RecordedRequest) -> str:
    return user_texts(request)[-1]


async def test_messages_taken_in_anywhere_are_answered_once_in_order(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async def answer(request: RecordedRequest) -> Reply:
        await asyncio.sleep(0.02)  # runs overlap, so several workers are busy at once
        return Reply(text=f"re: {last_user_text(request)}")

    fake_llm.responder = answer
    platform = Platform()
    convs, per_conv = 6, 5
    async with postgres_schema() as url, workers(fake_llm, tmp_path, url, platform, 3) as agents:
        for n in range(per_conv):
            for c in range(convs):
                message = inbound(f"c{c} m{n}", key=("test", f"c{c}", ""), event_id=f"e{c}.{n}")
                # round robin, like a load balancer; each message also redelivered elsewhere
                assert await agents[(n + c) % 3].submit(message, platform(message.key))
                assert not await agents[(n + c + 1) % 3].submit(message, platform(message.key))
        await until(lambda: platform.answered() >= convs * per_conv)
        for c in range(convs):
            assert platform(("test", f"c{c}", "")).finals == [
                f"re: c{c} m{n}" for n in range(per_conv)
            ]
        store = agents[0].store
        runs = await store.runs(limit=1000)
        assert len(runs) == convs * per_conv
        assert {r.state for r in runs} == {"completed"}
        assert len({r.worker for r in runs}) >= 2, "one worker answered everything"
        for c in range(convs):
            mine = sorted((r for r in runs if r.conv == f"test:c{c}:"), key=lambda r: r.created_at)
            for before, after in itertools.pairwise(mine):
                assert before.ended_at is not None
                assert after.started_at is not None
                assert before.ended_at <= after.started_at, "two runs of one conversation at once"
            # whichever worker ran a turn had the whole history, also of turns run elsewhere
            history = await store.load_messages(f"test:c{c}:")
            assert [m.content for m in history if m.role == "user"] == [
                f"c{c} m{n}" for n in range(per_conv)
            ]
        for request in fake_llm.requests:  # each turn saw the turns before, wherever they ran
            c, n = (int(part[1:]) for part in last_user_text(request).split())
            assert user_texts(request) == [f"c{c} m{k}" for k in range(n + 1)]


async def test_a_message_two_workers_take_in_at_once_is_answered_once(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """A redelivery reaching another worker while the first still stores the message (a
    Telegram poller that lost its lease mid-batch, a Slack retry after a slow answer):
    both found it unseen, and each queued a run of it."""
    fake_llm.responder = lambda request: Reply(text=f"re: {last_user_text(request)}")
    platform = Platform()
    key = ("test", "c1", "")
    async with postgres_schema() as url, workers(fake_llm, tmp_path, url, platform, 2) as agents:
        for n in range(5):
            message = inbound(f"m{n}", key=key, event_id=f"e{n}")
            taken = await asyncio.gather(*(a.submit(message, platform(key)) for a in agents))
            assert sorted(taken) == [False, True]
        await until(lambda: platform.answered() >= 5)
        assert len(await agents[0].store.runs(limit=100)) == 5
    assert platform(key).finals == [f"re: m{n}" for n in range(5)]


async def test_a_stop_on_one_worker_cancels_the_run_on_another(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="word " * 600, chunk_size=5, chunk_delay=0.05))  # 30 s unstopped
    platform = Platform()
    key = ("test", "c1", "")
    async with postgres_schema() as url, workers(fake_llm, tmp_path, url, platform, 2) as agents:
        end = platform(key)
        await agents[0].submit(inbound("talk a lot"), end)
        await fake_llm.wait_for_requests(1)
        await until(lambda: bool(end.streams and end.streams[0].deltas))
        store = agents[0].store
        [run] = await store.runs(conv="test:c1:")
        holder = next(a for a in agents if a.workers and a.workers.id == run.worker)
        other = next(a for a in agents if a is not holder)
        await agents[1].submit(inbound("next one"), end)  # queued behind the run: dropped
        await other.submit(inbound("/status"), end)
        assert f"Run: idle here; running on {run.worker} (run {run.id}), 1 queued" in end.sent[0]
        t0 = time.monotonic()
        await other.submit(inbound("/stop"), end)
        await until(lambda: end.streams[0].final is not None)
        # The bound, from /stop taken in here to "Stopped." there (unstopped, the
        # run would stream for 30 s). It takes ~30 ms, also on a loaded machine: a few
        # round trips to PostgreSQL, the notice, and the run's final commit.
        assert time.monotonic() - t0 < 2.0
        assert end.streams[0].final == "Stopped."
        assert "Dropped 1 queued message." in end.sent  # "Stopped." once: the run says it
        assert not [s for s in end.sent if "Stopped" in s]
        await store.flush()
        states = {r.text: r.state for r in await store.runs(conv="test:c1:")}
        assert sorted(states.values()) == ["cancelled", "cancelled"]
        assert len(fake_llm.requests) == 1  # the dropped message never ran


async def test_an_approval_clicked_on_one_worker_resumes_the_run_on_another(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = junk_dir(tmp_path)
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", RM, id="c_rm")]), Reply(text="Removed the junk.")
    )
    board = Board()
    ends = [PromptResponder(board=board), PromptResponder(board=board)]  # one per worker
    responders = [lambda key, e=e: e for e in ends]
    async with postgres_schema() as url, workers(fake_llm, tmp_path, url, responders, 2) as agents:
        await agents[0].submit(inbound("clean up"), ends[0])
        await until(lambda: any(e.asked for e in ends))
        asker = next(n for n, e in enumerate(ends) if e.asked)
        request = ends[asker].asked[0]
        clicker = 1 - asker

        async def prompt_stored() -> bool:  # a click comes once the prompt is there
            row = await agents[clicker].store.approval(request.id)
            return row is not None and row.prompt is not None

        async with asyncio.timeout(10):
            while not await prompt_stored():
                await asyncio.sleep(0.02)
        assert await ends[clicker].click(agents[clicker], request.id) == "ok"
        await until(lambda: "Removed the junk." in ends[asker].finals)
        row = await agents[0].store.approval(request.id)
        assert row is not None
        assert (row.state, row.answered_by) == ("approved", "ann")
    assert list(board.prompts.values()) == [f"Approve bash {json.dumps(RM)}? ✅ Approved by ann"]
    assert not junk.exists()


def prompt_hash(fake_llm: FakeLLM, tmp_path: Path) -> str:
    """The prompt hash of the workers' conversations (what a resumed run checks)."""
    cfg = agent_config(fake_llm, tmp_path)
    app = App(cfg, {}, build_registry(cfg, {}))
    return app.conversation("fake", JournalBox()).prompt_hash()


async def test_a_dead_worker_s_run_is_resumed_at_once_by_one_worker(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    platform = Platform()
    hashed = prompt_hash(fake_llm, tmp_path)
    async with postgres_schema() as url:
        # What a worker killed mid-turn leaves: its heartbeat, a run `running` with a
        # checkpoint and a half-streamed preview, and a queued message of another
        # conversation that nobody claimed yet.
        async with await open_store(url) as dead:
            dead.set_worker("elsewhere:1:dead")
            await dead.worker_heartbeat("elsewhere:1:dead")
            history = [Message.system("s"), Message.user("long task")]
            dead.save_messages("test:c1:", history)
            await dead.create_run("deadbeef00000001", "test:c1:", "user")
            cp = Checkpoint("deadbeef00000001", 1, "input", 0, 1, 2, hashed, (), 0.0)
            dead.checkpoint(cp)
            dead.add_event(
                "channel.preview.posted",
                {"message_id": "p1"},
                run_id="deadbeef00000001",
                conv="test:c1:",
                iteration=0,
                at=time.time(),
            )
            await dead.create_run(
                "deadbeef00000002", "test:c2:", "user", state="queued", text="hello", shared=True
            )
        answers = {"long task": "done, at last", "hello": "hi there"}
        fake_llm.responder = lambda request: Reply(text=answers[last_user_text(request)])
        async with workers(fake_llm, tmp_path, url, platform, 3) as agents:
            first, second = platform(("test", "c1", "")), platform(("test", "c2", ""))
            await until(lambda: "done, at last" in first.finals and second.finals == ["hi there"])
            sweeping = [a.workers for a in agents if a.workers]
            swept = [w.sweeps for w in sweeping]
            await until(lambda: all(w.sweeps > n + 1 for w, n in zip(sweeping, swept, strict=True)))
            # every worker swept twice more: it went on once, and nobody said "interrupted"
            assert first.sent == []
            assert first.finals.count("done, at last") == 1
            assert len(fake_llm.requests) == 2
            store = agents[0].store
            run = await store.run("deadbeef00000001")
            assert run is not None
            assert (run.state, run.resumable) == ("completed", False)
            assert run.worker in {a.workers.id for a in agents if a.workers}
            assert await store.dead_workers(0.0) != ["elsewhere:1:dead"]
            names = [e[1] for e in await store.events("deadbeef00000001")]
            assert names.count("agent_run.resumed") == 1


async def test_a_resume_sent_to_two_workers_at_once_goes_on_once(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    platform = Platform()
    hashed = prompt_hash(fake_llm, tmp_path)
    async with postgres_schema() as url:
        async with await open_store(url) as crashed:
            history = [Message.system("s"), Message.user("long task")]
            crashed.save_messages("test:c1:", history)
            await crashed.create_run("deadbeef00000003", "test:c1:", "user")
            crashed.set_run_state("deadbeef00000003", "timed_out", "interrupted", resumable=True)
            cp = Checkpoint("deadbeef00000003", 1, "input", 0, 1, 2, hashed, (), 0.0)
            crashed.checkpoint(cp)
        fake_llm.script(Reply(text="resumed"))
        async with workers(fake_llm, tmp_path, url, platform, 2) as agents:
            end = platform(("test", "c1", ""))
            await asyncio.gather(
                *(a.submit(inbound("/resume", key=("test", "c1", "")), end) for a in agents)
            )
            await until(lambda: end.finals == ["resumed"] and len(end.sent) == 1)
            # the other one finds it going on, or no longer resumable: either way, once
            assert any(s in end.sent[0] for s in ("already going on", "no interrupted run"))
            assert len(fake_llm.requests) == 1


async def test_a_run_awaited_on_one_worker_and_answered_by_another_reports_there(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="from afar"))
    platform = Platform()
    async with postgres_schema() as url, workers(fake_llm, tmp_path, url, platform, 2) as agents:
        taker, answerer = agents
        assert taker.workers is not None
        assert answerer.workers is not None
        taker.workers.stop_claiming()  # it takes messages in, the other one answers them
        report = await asyncio.wait_for(taker.run(inbound("hello")), 20)
        assert (report.state, report.text) == ("completed", "from afar")
        run = await taker.store.run(report.run_id)
        assert run is not None
        assert run.worker == answerer.workers.id
        assert platform(("test", "c1", "")).finals == ["from afar"]


async def test_a_worker_wrongly_taken_for_dead_does_not_deliver_the_run_taken_over(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="late " * 40, chunk_size=5, chunk_delay=0.05))
    platform = Platform()
    async with postgres_schema() as url, workers(fake_llm, tmp_path, url, platform, 1) as agents:
        [slow] = agents
        assert slow.workers is not None
        end = platform(("test", "c1", ""))
        await slow.submit(inbound("take your time"), end)
        await until(lambda: bool(end.streams and end.streams[0].deltas))
        async with await open_store(url) as other:  # a worker that missed its heartbeats
            [taken] = await other.take_over_runs(slow.workers.id, "other:1:x")
        await until(lambda: slow.lanes[("test", "c1", "")].idle)
        assert end.streams[0].final is None  # withheld: the run goes on elsewhere
        run = await slow.store.run(taken.id)
        assert run is not None
        assert (run.state, run.worker) == ("running", "other:1:x")  # not "completed"
        # nothing written over the history the other worker goes on with
        history = await slow.store.load_messages("test:c1:")
        assert [m.role for m in history if m.role != "system"] == ["user"]
        await slow.store.flush()  # events are queued (write_soon): read them once committed
        names = [e[1] for e in await slow.store.events(taken.id)]
        assert "agent_run.lost" in names


async def test_workers_listen_again_after_losing_the_server_and_miss_nothing(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    import psycopg

    fake_llm.responder = lambda request: Reply(text=f"re: {last_user_text(request)}")
    platform = Platform()
    async with postgres_schema() as url, workers(fake_llm, tmp_path, url, platform, 2) as agents:
        sweeping = [a.workers for a in agents if a.workers]
        schema = url.rsplit("application_name=", 1)[1]
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            await admin.execute(  # what a server restart or a network cut does to listeners
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s AND query LIKE 'LISTEN%%' AND pid <> pg_backend_pid()",
                (schema,),
            )
        await until(lambda: all(w.listens >= 2 for w in sweeping))
        end = platform(("test", "c1", ""))
        await agents[0].submit(inbound("still there?"), end)
        await agents[1].submit(inbound("/status"), end)
        await until(lambda: end.finals == ["re: still there?"])
        assert "Provider: fake" in end.sent[0]


async def test_a_provider_chosen_on_one_worker_is_the_one_every_worker_uses(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    platform = Platform()
    main, thread = ("test", "c1", ""), ("test", "c1", "t2")
    async with postgres_schema() as url, workers(fake_llm, tmp_path, url, platform, 2) as agents:
        await agents[0].submit(inbound("/status", key=thread), platform(thread))
        assert platform(thread).sent[-1].startswith("Provider: fake ")  # worker 0 keeps it
        await agents[0].submit(inbound("/status", key=main), platform(main))
        await agents[1].submit(inbound("/provider other", key=main), platform(main))
        assert platform(main).sent[-1] == "This channel now uses other."
        # Worker 1's notice has reached worker 0 once worker 0 takes the lane for stale.
        await until(lambda: agents[0].lanes[main].stale)
        # The whole channel's choice changed, so the other thread's too.
        await agents[0].submit(inbound("/status", key=thread), platform(thread))
        assert platform(thread).sent[-1].startswith("Provider: other ")


async def test_the_queue_cap_counts_the_messages_queued_on_every_worker(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="word " * 600, chunk_size=5, chunk_delay=0.05))
    platform = Platform()
    limits = {"agent": {"max_queued": 2}}
    async with (
        postgres_schema() as url,
        workers(fake_llm, tmp_path, url, platform, 2, **limits) as agents,
    ):
        end = platform(("test", "c1", ""))
        await agents[0].submit(inbound("talk a lot"), end)
        await until(lambda: bool(end.streams and end.streams[0].deltas))
        for n, agent in enumerate([agents[0], agents[1], agents[0]]):
            await agent.submit(inbound(f"more {n}"), end)
        assert end.sent == [
            "I already have 2 messages waiting in this conversation, so I did not queue that "
            "one. Send it again once I have caught up (/stop drops the queue)."
        ]
        queued = await agents[1].store.runs(conv="test:c1:", states=["queued"])
        assert sorted(r.text for r in queued) == ["more 0", "more 1"]
        await agents[1].submit(inbound("/stop"), end)
        await until(lambda: end.streams[0].final == "Stopped.")


async def test_messages_run_in_arrival_order_whatever_the_clocks_of_the_workers(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gate = asyncio.Event()

    async def answer(request: RecordedRequest) -> Reply:
        if last_user_text(request) == "hold on":
            await gate.wait()  # the conversation is busy while the others arrive
        return Reply(text=f"re: {last_user_text(request)}")

    fake_llm.responder = answer
    platform = Platform()
    end = platform(("test", "c1", ""))
    async with postgres_schema() as url, workers(fake_llm, tmp_path, url, platform, 2) as agents:
        ahead, behind = agents
        await ahead.submit(inbound("hold on"), end)
        await fake_llm.wait_for_requests(1)
        for n, agent in enumerate([ahead, behind, ahead, behind]):
            await agent.submit(inbound(f"m{n}"), end)
        # as `ahead`'s clock, an hour fast, wrote them (`behind`'s is right)
        await sql(url, "UPDATE runs SET created_at = created_at + 3600 WHERE text IN ('m0', 'm2')")
        gate.set()
        await until(lambda: len(end.finals) == 5 and None not in end.finals)
        assert end.finals == ["re: hold on", "re: m0", "re: m1", "re: m2", "re: m3"]


HOLD_CLAIMS = """
CREATE FUNCTION hold_claims() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state = 'queued' AND NEW.state = 'running' THEN
        PERFORM pg_advisory_xact_lock(4242);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER hold_claims BEFORE UPDATE ON runs FOR EACH ROW EXECUTE FUNCTION hold_claims();
"""


async def test_a_shutdown_during_a_claim_puts_the_claimed_run_back_in_the_queue(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    import psycopg

    platform = Platform()
    end = platform(("test", "c1", ""))
    async with postgres_schema() as url, workers(fake_llm, tmp_path, url, platform, 1) as agents:
        await sql(url, HOLD_CLAIMS)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as blocker:
            await blocker.execute("SELECT pg_advisory_lock(4242)")  # claims wait inside
            await agents[0].submit(inbound("hi"), end)
            waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            async with asyncio.timeout(10):
                while (await sql(url, waiting))[0][0] == 0:
                    await asyncio.sleep(0.01)
            shutdown = asyncio.ensure_future(agents[0].shutdown(grace=0.1))
            await asyncio.sleep(0.2)
            await blocker.execute("SELECT pg_advisory_unlock(4242)")  # the claim goes through
            await asyncio.wait_for(shutdown, 10)
        [(state, worker)] = await sql(url, "SELECT state, worker FROM runs")
    # back in the queue for another worker at once, not held by a worker that has gone
    assert (state, worker) == ("queued", None)
    assert not fake_llm.requests


async def test_a_turn_a_stopping_worker_cuts_off_is_gone_on_with_by_another(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """A deploy stops a worker (SIGTERM) while a turn runs past the grace: the turn stays
    that worker's, and the worker that finds it gone goes on with it — no "send /resume"
    notice, and the message behind it waits for it."""
    gate = asyncio.Event()
    asked: list[str] = []

    async def answer(request: RecordedRequest) -> Reply:
        text = last_user_text(request)
        asked.append(text)
        if asked.count(text) == 1 and text == "long task":
            await gate.wait()  # the stopping worker's turn never gets its answer
        return Reply(text=f"re: {text}")

    fake_llm.responder = answer
    platform = Platform()
    end = platform(("test", "c1", ""))
    async with postgres_schema() as url, workers(fake_llm, tmp_path, url, platform, 2) as agents:
        await agents[0].submit(inbound("long task"), end)
        await fake_llm.wait_for_requests(1)
        [running] = await agents[0].store.runs(conv="test:c1:", states=["running"])
        stopping = next(a for a in agents if a.workers and a.workers.id == running.worker)
        other = next(a for a in agents if a is not stopping)
        assert other.workers is not None
        await stopping.submit(inbound("then this"), end)
        await stopping.shutdown(grace=0.1)
        await until(lambda: end.finals[-1:] == ["re: then this"], timeout=30)
        gate.set()
        run = (await other.store.runs(conv="test:c1:", limit=5))[-1]
    assert [f for f in end.finals if f] == ["re: long task", "re: then this"]
    assert end.sent == []  # no "I am restarting … send /resume"
    assert (run.state, run.worker) == ("completed", other.workers.id)
