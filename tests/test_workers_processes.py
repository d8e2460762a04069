"""Three `parley run` workers on one PostgreSQL schema (SPEC §14, issue 15), the hard way:
real processes against the fake Slack in HTTP Events API mode and the fake LLM. The test
posts 300 messages across 50 conversations to the workers' HTTP endpoints round robin, as a
load balancer would, and re-posts a delivery another worker's way when one fails (as Slack
retries). One worker is killed with SIGKILL midway.

Every message must end in exactly one outcome — its answer, or (for a turn the dead worker
was in the middle of) the "interrupted — /resume" notice, posted once — answers in each
conversation come in the order of its messages, and nothing is lost. The one exception is
inherent to a crash: a turn killed after its whole (short) answer was posted as a preview
and before the preview was recorded leaves that answer in the chat besides the notice,
since nobody can know to retract it; the test checks that such turns left no record."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from core.agent.recovery import PREVIEW_RETRACTED
from core.store import RunRow, Store, open_store
from tests.channels.test_stored_before_ack import Parley, free_port
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply
from tests.fakes.slack import Envelope, FakeSlack
from tests.process import child_env, fake_llm_config, start_parley
from tests.store.conftest import postgres_schema

SIGNING_SECRET = "signing-secret"
CONVERSATIONS, PER_CONVERSATION = 50, 6
INTERRUPTED = re.compile(r"I was interrupted while working on your last request \(run (\w+)\)")


def worker_config(
    tmp_path: Path, n: int, llm: FakeLLM, slack: FakeSlack, url: str, port: int
) -> Path:
    """Worker `n`'s config.toml: the shared store, its own HTTP port and state dir."""
    state = tmp_path / f"w{n}"
    state.mkdir()
    text = fake_llm_config(
        llm.base_url,
        state,
        f"""
        [channels.slack]
        enabled = true
        mode = "http"
        http_port = {port}
        base_url = "{slack.url}"
        allow_users = ["U1"]
        """,
    )
    store = (
        f'url = "{url}"\nheartbeat_seconds = 0.3\nworker_timeout_seconds = 2\nsweep_seconds = 0.5'
    )
    text = re.sub(r'^path = ".*parley\.db"$', store, text, flags=re.MULTILINE)
    config = state / "config.toml"
    config.write_text(text)
    return config


async def history(store: Store, slack: FakeSlack, channel: str, runs: list[RunRow]) -> str:
    """What happened in one conversation: its runs, their events and the posts."""
    lines = [channel]
    for run in sorted(
        (r for r in runs if r.conv == f"slack:{channel}:"), key=lambda r: r.created_at
    ):
        lines.append(f"  run {run.id} {run.state} {run.reason} {run.worker} {run.text!r}")
        lines += [f"    {name} {data}" for _, name, _, data in await store.events(run.id)]
    lines += [f"  post {m.ts} {m.texts}" for m in slack.live_messages() if m.channel == channel]
    return "\n".join(lines)


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


class Balancer:
    """Posts each delivery to the next worker; a worker that fails it (down, dying, or
    answering an error) gets it no more: Slack retries, and this balancer sends the retry
    to the next worker."""

    def __init__(self, slack: FakeSlack, ports: list[int]) -> None:
        self.slack, self.ports = slack, ports
        self.down: set[int] = set()
        self.turn = 0

    async def post(self, envelope: Envelope) -> None:
        for attempt in range(len(self.ports) * 3):
            live = [p for p in self.ports if p not in self.down] or self.ports
            port = live[self.turn % len(live)]
            self.turn += 1
            envelope.retry_attempt = attempt
            self.slack.http_target = (f"http://127.0.0.1:{port}/slack/events", SIGNING_SECRET)
            try:
                status, _ = await self.slack.post_http(envelope)  # reads the target at once
            except (aiohttp.ClientError, OSError):
                self.down.add(port)
                continue
            if status == 200:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"no worker took {envelope.payload['event']['text']!r}")


async def test_three_workers_answer_every_message_once_in_order_when_one_is_killed(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async def pong(request: RecordedRequest) -> Reply:
        await asyncio.sleep(0.1)  # turns take a while: some are running when a worker dies
        return Reply(text=f"pong: {request.json['messages'][-1]['content']}")

    fake_llm.responder = pong
    ports = [free_port() for _ in range(3)]
    async with FakeSlack() as slack, postgres_schema() as url:
        env = child_env(
            SLACK_BOT_TOKEN=slack.bot_token,
            SLACK_APP_TOKEN=slack.app_token,
            SLACK_SIGNING_SECRET=SIGNING_SECRET,
        )
        configs = [worker_config(tmp_path, n, fake_llm, slack, url, p) for n, p in enumerate(ports)]
        balancer = Balancer(slack, ports)
        async with (
            worker(configs[0], env) as first,
            worker(configs[1], env) as second,
            worker(configs[2], env) as third,
        ):
            sent: dict[str, str] = {}  # message text → its DM channel

            async def kill_midway() -> None:
                """Once a turn of the second worker is past its first checkpoint (while
                deliveries are on their way to it), SIGKILL it."""
                mark = f":{second.proc.pid}:"
                async with await open_store(url) as watch, asyncio.timeout(30):
                    while True:
                        running = await watch.runs(states=["running"], limit=100)
                        mine = [r for r in running if mark in (r.worker or "")]
                        if [r for r in mine if await watch.last_checkpoint(r.id)]:
                            break
                        await asyncio.sleep(0.01)
                await second.kill()

            for n in range(PER_CONVERSATION):
                round_ = [kill_midway()] if n == PER_CONVERSATION // 2 else []
                for c in range(CONVERSATIONS):
                    text = f"c{c} m{n}"
                    sent[text] = f"D{c}"
                    payload = slack._event_payload(
                        slack._message(text, f"D{c}", "im", None, user="U1")
                    )
                    round_.append(balancer.post(Envelope(f"e{c}.{n}", "events_api", payload)))
                await asyncio.gather(*round_)
            # Every message has an outcome: an answer, or the interrupted run's notice.
            async with await open_store(url) as store:

                async def outcomes() -> tuple[dict[str, int], dict[str, int], list[str]]:
                    answers: dict[str, int] = {}
                    notices: dict[str, int] = {}
                    for message in slack.live_messages():
                        if message.text.startswith("pong: "):
                            key = message.text.removeprefix("pong: ")
                            answers[key] = answers.get(key, 0) + 1
                        elif found := INTERRUPTED.search(message.text):
                            notices[found[1]] = notices.get(found[1], 0) + 1
                    texts = []
                    for run_id in notices:
                        run = await store.run(run_id)
                        assert run is not None
                        texts.append(run.text or "")
                    return answers, notices, texts

                try:
                    async with asyncio.timeout(90):
                        while True:
                            answers, notices, interrupted = await outcomes()
                            if set(answers) | set(interrupted) >= set(sent):
                                break
                            await asyncio.sleep(0.2)
                except TimeoutError:
                    runs = await store.runs(limit=1000)
                    states: dict[str, int] = {}
                    for r in runs:
                        states[r.state] = states.get(r.state, 0) + 1
                    logs = "\n---\n".join(w.err.decode()[-3000:] for w in (first, second, third))
                    raise AssertionError(
                        f"{len(answers)} answered, {len(interrupted)} interrupted of "
                        f"{len(sent)}; runs {states}\n{logs}"
                    ) from None
                runs = await store.runs(limit=1000)
                # A turn killed after its whole answer was posted as a preview, before the
                # preview was recorded, leaves it in the chat: it cannot be retracted.
                both = set(answers) & set(interrupted)
                unrecorded = {
                    run.text
                    for run in runs
                    if run.text in both
                    and "channel.preview.posted" not in [e[1] for e in await store.events(run.id)]
                }
                story = [await history(store, slack, sent[text], runs) for text in sorted(both)]
            assert await first.stop() == 0
            assert await third.stop() == 0
    assert set(answers) | set(interrupted) == set(sent), "a message was lost"
    assert both == unrecorded, "an interrupted message was also answered:\n" + "\n".join(story)
    assert set(answers.values()) == {1}, "a message was answered twice"
    assert set(notices.values()) == {1}, "an interruption was announced twice"
    assert interrupted, "the killed worker was running nothing: the test proves nothing"
    for c in range(CONVERSATIONS):
        replies = [
            m.text.removeprefix("pong: ")
            for m in slack.live_messages()
            if m.channel == f"D{c}" and m.text.startswith("pong: ")
        ]
        wanted = [f"c{c} m{n}" for n in range(PER_CONVERSATION)]
        answered = [t for t in wanted if t not in interrupted or t in unrecorded]
        assert replies == answered, f"D{c} out of order"
    assert len(runs) == len(sent)
    assert {r.state for r in runs} <= {"completed", "timed_out"}
    retracted = [m for m in slack.live_messages() if m.text == PREVIEW_RETRACTED]
    assert len(retracted) <= len(interrupted)
