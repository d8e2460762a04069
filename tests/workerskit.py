"""What the process tests of several `parley run` workers on one PostgreSQL schema share
(tests/test_workers_processes.py, tests/test_takeover_processes.py; docs/scale-out.md,
issues 15 and 23): starting a worker on the shared store, killing one with SIGKILL while it
runs turns, and the outcome rules every message is held to, whatever the platform.

A platform's side is two things: `sent`, each message's text → its conversation (in the
order sent), and `posts()`, the bot's live messages as (conversation, text), each
conversation's oldest first. Every message must end with exactly one visible answer
("pong: <text>"), answers come in each conversation's order, nothing is lost, and nobody
is told "interrupted": a turn the dead worker was in the middle of is gone on with by the
worker that takes it over (no tool call of these turns makes that unsafe), below its
retracted preview. A turn that ended but whose answer the dead worker had not seen taken
by the platform is answered by the taker too (its preview retracted first), in its place
in the conversation's order.

Two repeats are inherent to a kill, and allowed only where they can happen: a post the
platform took just before the kill, which the dead worker could not record as taken, is
posted again right after itself (no platform takes a post idempotently, and a lost answer
is worse than a repeated one); and a preview posted just before the kill, before it was
recorded, cannot be retracted, so a run taken over with no preview recorded before its
takeover may leave that preview (the whole answer, or a start of it) above its answer."""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from core.agent.recovery import PREVIEW_RETRACTED
from core.store import RunRow, Store, open_store
from tests.channels.test_stored_before_ack import Parley
from tests.fakes.llm import RecordedRequest, Reply
from tests.fakes.telegram import FakeTelegram
from tests.process import start_parley

INTERRUPTED = re.compile(r"I was interrupted while working on your last request \(run (\w+)\)")
ANSWER = "pong: "
LLM_SECONDS = 0.3  # per answer
Posts = Callable[[], Iterable[tuple[str, str]]]  # the bot's live messages: (conversation, text)


class SlowPong:
    """The fake LLM's responder: "pong: <the message>", after a while (so some turns are
    running when a worker dies); it knows which messages it is answering, since when."""

    def __init__(self) -> None:
        self.asked: dict[str, float] = {}  # message → monotonic time it was asked

    async def __call__(self, request: RecordedRequest) -> Reply:
        text = request.json["messages"][-1]["content"]
        self.asked[text] = time.monotonic()
        try:
            await asyncio.sleep(LLM_SECONDS)
        finally:
            del self.asked[text]
        return Reply(text=f"{ANSWER}{text}")

    def answering(self, text: str) -> bool:
        """Whether `text` was asked lately: its turn is some way from done."""
        asked = self.asked.get(text)
        return asked is not None and time.monotonic() - asked < LLM_SECONDS * 0.7


def shared_store(config: str, url: str) -> str:
    """`config` (tests.process.fake_llm_config's text) with its SQLite store replaced by
    the shared PostgreSQL one, on timings short enough for a quick takeover: leases of
    1 s, heartbeats every 0.3 s, a worker dead after 2 s, a sweep every 0.5 s."""
    store = (
        f'url = "{url}"\nlease_seconds = 1\nheartbeat_seconds = 0.3\n'
        "worker_timeout_seconds = 2\nsweep_seconds = 0.5"
    )
    return re.sub(r'^path = ".*parley\.db"$', store, config, flags=re.MULTILINE)


@contextlib.asynccontextmanager
async def worker(config: Path, env: dict[str, str]) -> AsyncIterator[Parley]:
    proc = await start_parley("--config", str(config), "run", env=env, stdin=False)
    parley = Parley(proc)
    try:
        await parley.until(lambda: b"parley: ready" in parley.err, "start-up", timeout=60)
        yield parley
    finally:
        if proc.returncode is None:
            await parley.kill()


Ready = Callable[[Store], Awaitable[bool]]
Victim = Callable[[], Parley | None]  # the worker to kill, if any yet


async def _always(watch: Store) -> bool:
    return True


async def _runs_a_turn(watch: Store, llm: SlowPong, victim: Parley) -> bool:
    """Whether a turn of `victim` is past its first checkpoint (recorded: it is resumable)
    and far from done (waiting on the LLM since a moment): killed now, it is interrupted."""
    mark = f":{victim.proc.pid}:"
    for run in await watch.runs(states=["running"], limit=100):
        mine = mark in (run.worker or "") and llm.answering(run.text or "")
        if mine and await watch.last_checkpoint(run.id) and llm.answering(run.text or ""):
            return True
    return False


async def until_running(url: str, llm: SlowPong, victim: Victim, ready: Ready = _always) -> Parley:
    """Until `ready(store)` and a turn of `victim()` waits on the LLM; returns that worker."""
    async with await open_store(url) as watch, asyncio.timeout(30):
        while True:
            chosen = victim()
            if chosen and await ready(watch) and await _runs_a_turn(watch, llm, chosen):
                return chosen
            await asyncio.sleep(0.005)


async def kill_when_running(
    url: str, llm: SlowPong, victim: Victim, ready: Ready = _always
) -> None:
    """Once a turn of `victim()` waits on the LLM (and `ready(store)`), SIGKILL that worker."""
    await (await until_running(url, llm, victim, ready)).kill()


@dataclass
class Outcomes:
    """What the chats show and the store says once every message has an outcome."""

    answers: dict[str, int] = field(default_factory=dict)  # message text → answers posted
    partial: list[tuple[str, str]] = field(default_factory=list)  # (conversation, a start)
    notices: dict[str, int] = field(default_factory=dict)  # run id → notices posted
    runs: list[RunRow] = field(default_factory=list)
    resumed: set[str] = field(default_factory=set)  # the texts of runs a takeover resumed
    unrecorded: set[str] = field(default_factory=set)  # taken over, no preview recorded
    redelivered: set[str] = field(default_factory=set)  # runs whose answer a takeover posted
    reposted: set[str] = field(default_factory=set)  # the message texts of those runs
    story: list[str] = field(default_factory=list)  # the history of each message answered twice


def _outcomes(posts: Posts, sent: dict[str, str]) -> Outcomes:
    found = Outcomes()
    for where, text in posts():
        if text.startswith(ANSWER):
            key = text.removeprefix(ANSWER)
            if key in sent:
                found.answers[key] = found.answers.get(key, 0) + 1
            else:
                found.partial.append((where, key))
        elif match := INTERRUPTED.search(text):
            found.notices[match[1]] = found.notices.get(match[1], 0) + 1
    return found


async def history(
    store: Store, posts: Posts, channel: str, conversation: str, runs: list[RunRow]
) -> str:
    """What happened in one conversation: its runs, their events and the posts."""
    conv = f"{channel}:{conversation}:"
    lines = [conv]
    for run in sorted((r for r in runs if r.conv == conv), key=lambda r: r.created_at):
        lines.append(f"  run {run.id} {run.state} {run.reason} {run.worker} {run.text!r}")
        lines += [f"    {name} {data}" for _, name, _, data in await store.events(run.id)]
    lines += [f"  post {text!r}" for where, text in posts() if where == conversation]
    return "\n".join(lines)


async def _settled(store: Store) -> bool:
    """No run is queued or running any more, and no answer is owed."""
    return not await store.runs(states=["queued", "running"], limit=1)


async def await_outcomes(
    url: str, posts: Posts, sent: dict[str, str], channel: str, workers: Iterable[Parley]
) -> Outcomes:
    """Until every message in `sent` has an answer and every run has ended (120 s at most,
    then what the store and the workers' logs say); then how each run went."""
    async with await open_store(url) as store:
        try:
            async with asyncio.timeout(120):
                while True:
                    found = _outcomes(posts, sent)
                    if set(found.answers) >= set(sent) and await _settled(store):
                        break
                    await asyncio.sleep(0.2)
        except TimeoutError:
            states: dict[str, int] = {}
            runs = await store.runs(limit=1000)
            for r in runs:
                states[r.state] = states.get(r.state, 0) + 1
            logs = "\n---\n".join(w.err.decode()[-3000:] for w in workers)
            lost = sorted(set(sent) - set(found.answers))
            stories = [await history(store, posts, channel, sent[t], runs) for t in lost]
            raise AssertionError(
                f"{len(found.answers)} answered of {len(sent)}; runs {states}; no answer for "
                f"{lost}:\n" + "\n".join(stories) + f"\n{logs}"
            ) from None
        found.runs = await store.runs(limit=1000)
        for run in found.runs:
            events = [e[1] for e in await store.events(run.id)]
            text = (run.text or "").removeprefix(ANSWER)  # an ended run keeps its answer
            if "agent_run.reconcile" in events:  # taken over
                before = events[: events.index("agent_run.reconcile")]
                if "channel.preview.posted" not in before:
                    found.unrecorded.add(text)
            if "agent_run.resumed" in events:
                found.resumed.add(text)
            if "channel.reply.redelivered" in events:
                found.redelivered.add(run.id)
                found.reposted.add(text)
        twice = {text for text, n in found.answers.items() if n > 1}
        partial = {text for where, start in found.partial for text in sent if sent[text] == where}
        found.story = [
            await history(store, posts, channel, sent[text], found.runs)
            for text in sorted(twice | {t for t in partial if t in found.unrecorded})
        ]
    return found


def check_outcomes(found: Outcomes, posts: Posts, sent: dict[str, str]) -> None:
    """The outcome rules of the module doc."""
    story = "\n".join(found.story)
    assert set(found.answers) == set(sent), "a message was lost"
    assert not found.notices, "a run was announced as interrupted"
    twice = {text for text, n in found.answers.items() if n > 1}
    assert twice <= found.reposted | found.unrecorded, f"a message was answered twice:\n{story}"
    assert set(found.answers.values()) <= {1, 2}, "a message was answered three times"
    for where, start in found.partial:  # a preview the kill left: a start of its answer
        owners = [t for t, w in sent.items() if w == where and t.startswith(start)]
        assert set(owners) & found.unrecorded, f"a stray partial answer {start!r} in {where}"
    assert found.resumed, "the killed worker was running nothing: the test proves nothing"
    for conversation in dict.fromkeys(sent.values()):
        replies = [
            text.removeprefix(ANSWER)
            for where, text in posts()
            if where == conversation and text.startswith(ANSWER)
        ]
        replies = [t for t in replies if t in sent]
        replies = [t for n, t in enumerate(replies) if n == 0 or replies[n - 1] != t]
        wanted = [text for text, where in sent.items() if where == conversation]
        assert replies == wanted, f"{conversation} out of order: {replies}"
    assert len(found.runs) == len(sent)
    assert {r.state for r in found.runs} == {"completed"}
    retracted = [text for _, text in posts() if text == PREVIEW_RETRACTED]
    assert len(retracted) <= 2 * (len(found.resumed) + len(found.redelivered))


def check_retractions(telegram: FakeTelegram, chats: Iterable[int]) -> int:
    """Each retracted preview is followed, below it, by its run's whole answer: the first
    answer after it starts with what the preview showed before it was retracted. Returns
    how many were checked."""
    checked = 0
    for chat in chats:
        live = telegram.bot_messages(chat)
        for n, message in enumerate(live):
            if message["text"] != PREVIEW_RETRACTED:
                continue
            shown = _before_retraction(telegram, chat, message["message_id"])
            below = next((m["text"] for m in live[n + 1 :] if m["text"].startswith(ANSWER)), "")
            assert below.startswith(shown.strip()), (
                f"chat {chat}: a preview showing {shown!r} was retracted, and the answer "
                f"below it is {below!r}"
            )
            checked += 1
    return checked


def _before_retraction(telegram: FakeTelegram, chat: int, message_id: int) -> str:
    """What message `message_id` showed before it was retracted, from the fake's call log
    (what each call sent: its result is the message as it is now)."""
    shown = ""
    for call in telegram.calls:
        if call.status != 200 or str(call.params.get("chat_id")) != str(chat):
            continue
        posted = call.method == "sendMessage" and call.result["message_id"] == message_id
        edited = call.method == "editMessageText" and int(call.params["message_id"]) == message_id
        if posted or edited:
            text = html.unescape(str(call.params.get("text", "")))
            if text == PREVIEW_RETRACTED:
                return shown
            shown = text
    return shown
