"""What the process tests of several `parley run` workers on one PostgreSQL schema share
(tests/test_workers_processes.py, docs/scale-out.md, issue 15): starting a worker on the shared
store, killing one with SIGKILL while it runs turns, and the outcome rules every message
is held to, whatever the platform.

A platform's side is two things: `sent`, each message's text → its conversation (in the
order sent), and `posts()`, the bot's live messages as (conversation, text), each
conversation's oldest first. Every message must end in exactly one outcome — its answer
("pong: <text>"), or (for a turn the dead worker was in the middle of) the "interrupted —
/resume" notice, posted once — answers in each conversation come in the order of its
messages, and nothing is lost. The one exception is inherent to a crash: a turn killed
after its whole (short) answer was posted as a preview and before the preview was
recorded leaves that answer in the chat besides the notice, since nobody can know to
retract it; such turns must have left no record of a preview. A turn that ended but whose
answer the dead worker had not seen taken by the platform is answered by the worker that
takes over (its preview retracted first), in its place in the conversation's order. That
answer may show twice — the second right after the first — only when the dead worker's
post had reached the platform and it died before recording so: no platform takes a post
idempotently, and a lost answer is worse than a repeated one."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from core.agent.recovery import PREVIEW_RETRACTED
from core.store import RunRow, Store, open_store
from tests.channels.test_stored_before_ack import Parley
from tests.fakes.llm import RecordedRequest, Reply
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
    notices: dict[str, int] = field(default_factory=dict)  # run id → notices posted
    interrupted: set[str] = field(default_factory=set)  # the texts of the announced runs
    unrecorded: set[str] = field(default_factory=set)  # both: answered by an unrecorded preview
    runs: list[RunRow] = field(default_factory=list)
    redelivered: set[str] = field(default_factory=set)  # runs whose answer a takeover posted
    reposted: set[str] = field(default_factory=set)  # the message texts of those runs
    story: list[str] = field(default_factory=list)  # the history of each message with both


async def _outcomes(store: Store, posts: Posts) -> Outcomes:
    found = Outcomes()
    for _, text in posts():
        if text.startswith(ANSWER):
            key = text.removeprefix(ANSWER)
            found.answers[key] = found.answers.get(key, 0) + 1
        elif match := INTERRUPTED.search(text):
            found.notices[match[1]] = found.notices.get(match[1], 0) + 1
    for run_id in found.notices:
        run = await store.run(run_id)
        assert run is not None
        found.interrupted.add(run.text or "")
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


async def await_outcomes(
    url: str, posts: Posts, sent: dict[str, str], channel: str, workers: Iterable[Parley]
) -> Outcomes:
    """Until every message in `sent` has an outcome (90 s at most, then what the store and
    the workers' logs say); then which were answered by an unrecorded preview as well."""
    async with await open_store(url) as store:
        try:
            async with asyncio.timeout(90):
                while True:
                    found = await _outcomes(store, posts)
                    if set(found.answers) | found.interrupted >= set(sent):
                        break
                    await asyncio.sleep(0.2)
        except TimeoutError:
            states: dict[str, int] = {}
            for r in await store.runs(limit=1000):
                states[r.state] = states.get(r.state, 0) + 1
            logs = "\n---\n".join(w.err.decode()[-3000:] for w in workers)
            runs = await store.runs(limit=1000)
            lost = sorted(set(sent) - set(found.answers) - found.interrupted)
            stories = [await history(store, posts, channel, sent[t], runs) for t in lost]
            raise AssertionError(
                f"{len(found.answers)} answered, {len(found.interrupted)} interrupted of "
                f"{len(sent)}; runs {states}; no outcome for {lost}:\n"
                + "\n".join(stories)
                + f"\n{logs}"
            ) from None
        found.runs = await store.runs(limit=1000)
        # A turn killed after its whole answer was posted as a preview, before the preview
        # was recorded, leaves it in the chat: it cannot be retracted.
        both = set(found.answers) & found.interrupted
        for run in found.runs:
            events = [e[1] for e in await store.events(run.id)]
            if run.text in both and "channel.preview.posted" not in events:
                found.unrecorded.add(run.text)
            if "channel.reply.redelivered" in events:
                found.redelivered.add(run.id)
                found.reposted.add((run.text or "").removeprefix(ANSWER))
        twice = {text for text, n in found.answers.items() if n > 1}
        found.story = [
            await history(store, posts, channel, sent[text], found.runs)
            for text in sorted(both | twice)
        ]
    return found


def check_outcomes(found: Outcomes, posts: Posts, sent: dict[str, str]) -> None:
    """The outcome rules of the module doc."""
    interrupted = found.interrupted
    assert set(found.answers) | interrupted == set(sent), "a message was lost"
    both = set(found.answers) & interrupted
    assert both == found.unrecorded, "an interrupted message was also answered:\n" + "\n".join(
        found.story
    )
    twice = {text for text, n in found.answers.items() if n > 1}
    assert twice <= found.reposted, "a message was answered twice:\n" + "\n".join(found.story)
    assert set(found.answers.values()) <= {1, 2}, "a message was answered three times"
    assert set(found.notices.values()) == {1}, "an interruption was announced twice"
    assert interrupted, "the killed worker was running nothing: the test proves nothing"
    for conversation in dict.fromkeys(sent.values()):
        replies = [
            text.removeprefix(ANSWER)
            for where, text in posts()
            if where == conversation and text.startswith(ANSWER)
        ]
        replies = [
            t for n, t in enumerate(replies) if n == 0 or t not in twice or replies[n - 1] != t
        ]
        wanted = [text for text, where in sent.items() if where == conversation]
        answered = [t for t in wanted if t not in interrupted or t in found.unrecorded]
        assert replies == answered, f"{conversation} out of order"
    assert len(found.runs) == len(sent)
    assert {r.state for r in found.runs} <= {"completed", "timed_out"}
    retracted = [text for _, text in posts() if text == PREVIEW_RETRACTED]
    assert len(retracted) <= len(interrupted) + len(found.redelivered)
