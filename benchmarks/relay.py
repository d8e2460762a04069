"""Relay of a long streamed answer to each chat platform: first-call delay, posts, edits and
the highest edit rate in any window, against the platform's budget (docs/channels.md).

One DM per platform, three platforms one after the other. The path is the production one:
the fake LLM (``tests.fakes.llm.FakeLLM``, OpenAI Chat Completions wire format) streams a
~2,000-token English answer (about 8,000 characters, counted with ``core.context.tokens.
TokenCounter``) in 16-character chunks 10 ms apart (about 5 s) to the real agent
(``tests.agentkit.running_agent``), which streams it through the real adapter
(``TelegramChannel`` / ``SlackChannel`` / ``DiscordChannel`` on python-telegram-bot,
slack-bolt, discord.py) to the platform's fake server (``tests.fakes.telegram`` / ``slack`` /
``discord``), which records every call with its time (``Call.at``, ``time.monotonic()``).
Every adapter keeps its default edit interval (``edit_interval_seconds = 1.0``; Discord also
its 5-edits-per-5-s channel budget): the point is to show the budgets hold.

* **first-call delay**: from the provider's first text chunk to the first platform call that
  carries text (``sendMessage`` / ``chat.postMessage`` / ``POST …/messages``). The first
  chunk's time is taken in process: the fake LLM's responder notes ``time.monotonic()`` right
  before it returns the ``Reply``; the fake then writes the role event at once and the first
  text chunk one ``chunk_delay`` later, so first chunk = that time + ``chunk_delay`` (the
  event loop may add up to about a millisecond to that sleep).
* **posts / edits**: the text-carrying calls to the DM (the answer is longer than Telegram's
  4,096 characters, Slack's ~3,900 bytes and Discord's 2,000 characters, so it continues in
  new messages: those are posts).
* **max edits in window**: the most edit calls whose times fall in any sliding window: 1 s per
  message for Telegram and Slack, 5 s per channel for Discord; ``budget`` is the platform's
  allowance for that window.
* **final text complete**: the platform's messages read exactly the final pieces (the answer
  split at the platform's limit and formatted as the adapter formats final text: Telegram
  HTML as parsed by the fake, Slack mrkdwn, Discord markdown), and the last message ends with
  the answer's last sentence. **final text ms**: first chunk to the last post or edit.

The script exits with status 1 if any platform did not end with the complete final text.

Usage (from the repo root)::

    .venv/bin/python benchmarks/relay.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("PTB_TIMEDELTA", "1")  # as tests/conftest.py: PTB's datetime warning

from channels import discord as discord_adapter  # noqa: E402
from channels import discord_api, discord_reply  # noqa: E402
from channels.discord import DiscordChannel  # noqa: E402
from channels.discord_config import DiscordConfig  # noqa: E402
from channels.slack import SlackChannel  # noqa: E402
from channels.slack_api import LIMIT_BYTES, slack_size  # noqa: E402
from channels.slack_config import SlackConfig  # noqa: E402
from channels.telegram import TelegramChannel  # noqa: E402
from channels.telegram_config import TelegramConfig  # noqa: E402
from channels.telegram_reply import MESSAGE_LIMIT as TELEGRAM_LIMIT  # noqa: E402
from channels.text import split_message, to_discord, to_slack_mrkdwn, to_telegram_html  # noqa: E402
from core.agent import Agent  # noqa: E402
from core.context.tokens import TokenCounter  # noqa: E402
from tests.agentkit import running_agent  # noqa: E402
from tests.fakes import discord as fake_discord  # noqa: E402
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply  # noqa: E402
from tests.fakes.slack import FakeSlack  # noqa: E402
from tests.fakes.telegram import FakeTelegram, TgUser, parse_html  # noqa: E402

CHUNK_SIZE = 16  # characters per SSE event (about four tokens)
CHUNK_DELAY = 0.01  # seconds between events
TOKENS, QUICK_TOKENS = 2_000, 600
QUESTION = "Explain how to move a small team's services to a new cloud region, step by step."
WAIT = 60.0  # seconds to wait for the final text before calling it incomplete

ALICE = TgUser(111, "Alice", "alice")
TELEGRAM_TOKEN = "123456:TEST-token"
SLACK_SECRET = "signing-secret"
SLACK_USER, SLACK_DM = "U1", "D1"

# ---------------------------------------------------------------------- the answer

_TOPICS = (
    ("inventory", "list every service, its owner, its data stores and its traffic"),
    ("dependencies", "draw which service calls which, and which ones share a database"),
    ("network", "reserve address ranges in the new region that do not overlap the old ones"),
    ("data", "copy the databases with replication running, so the cut-over is short"),
    ("secrets", "move keys and certificates through the vault, never through chat or email"),
    ("images", "push every container image to a registry in the new region"),
    ("pipelines", "teach the build system to deploy to both regions for a while"),
    ("monitoring", "put dashboards and alerts in place before any traffic moves"),
    ("rehearsal", "run the whole cut-over once on a staging copy and time each step"),
    ("traffic", "shift a small share of requests first, then more as the numbers hold"),
    ("rollback", "write down the exact steps that send traffic back to the old region"),
    ("clean-up", "switch off the old region only after a full week of quiet operation"),
)
_WHY = (
    "Skipping this is the most common reason a move takes twice as long as planned.",
    "It costs an afternoon now and saves a night of guessing later.",
    "Nobody remembers these details under pressure, so the list has to exist on paper.",
    "The people who run the service day to day should check it, not only the planners.",
    "A small mistake here is cheap to fix before the move and expensive after it.",
)
_DETAIL = (
    "Keep the notes in the same repository as the code, so they change together.",
    "Give each item a single owner and a date, and review the open items every morning.",
    "Measure the current numbers first: latency, error rate and cost per day.",
    "Prefer boring, well-known tools over clever ones during a move like this.",
    "Tell the support team what will change and when, in plain words.",
    "Write the result of each check next to the check itself, with the time it was done.",
)


def build_answer(tokens: int, counter: TokenCounter) -> str:
    """Deterministic English prose with light markdown, at least `tokens` tokens long."""
    parts = ["Here is a plan that has worked well for small teams, in the order I would do it."]
    closing = "That is the whole plan: take it one step at a time and the move stays calm."
    step = 0
    while counter.text("\n\n".join([*parts, closing])) < tokens:
        name, what = _TOPICS[step % len(_TOPICS)]
        round_ = step // len(_TOPICS)
        lead = f"**Step {step + 1}: {name}.** First, {what}."
        if round_:
            lead = f"**Step {step + 1}: {name}, again.** Check once more that you {what}."
        body = " ".join(
            (
                _WHY[step % len(_WHY)],
                _DETAIL[step % len(_DETAIL)],
                _DETAIL[(step + 2) % len(_DETAIL)],
                f"When the {name} step is done, note it in the move log and tell the team.",
            )
        )
        bullets = "\n".join(
            f"- {line}"
            for line in (
                f"owner of the {name} step: one named person",
                f"done when: the check for {name} passes twice in a row",
                "time it took: written down for the next move",
            )
        )
        parts.append(f"{lead} {body}\n\n{bullets}")
        step += 1
    parts.append(closing)
    return "\n\n".join(parts)


def last_sentence(answer: str) -> str:
    return answer.rstrip().rsplit("\n\n", 1)[-1]


# ---------------------------------------------------------------------- measuring


class FirstChunk:
    """The fake LLM's responder: answers with the scripted reply, noting when its first text
    chunk goes out (the moment it returns the reply, plus one `chunk_delay`)."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.at: float | None = None
        self.requests = 0

    def __call__(self, rec: RecordedRequest) -> Reply:
        self.requests += 1
        if self.requests > 1:
            return Reply(text="(unexpected extra request)")
        self.at = time.monotonic() + self.reply.chunk_delay
        return self.reply


def llm_errors(stamp: FirstChunk) -> list[str]:
    return [] if stamp.requests == 1 else [f"{stamp.requests} LLM requests (expected 1)"]


@dataclass
class Result:
    platform: str
    first_call_ms: float | None
    posts: int
    edits: int
    max_edits_in_window: int
    budget: str
    budget_calls: int
    complete: bool
    final_ms: float | None
    messages: int
    max_posts_edits_in_window: int = 0
    errors: list[str] = field(default_factory=list)


def max_in_window(times: Iterable[float], window: float) -> int:
    """The most of `times` inside any half-open window of `window` seconds."""
    ordered = sorted(times)
    best = start = 0
    for end, t in enumerate(ordered):
        while ordered[start] <= t - window:
            start += 1
        best = max(best, end - start + 1)
    return best


def max_per_key(calls: Iterable[tuple[Any, float]], window: float) -> int:
    groups: dict[Any, list[float]] = {}
    for key, at in calls:
        groups.setdefault(key, []).append(at)
    return max((max_in_window(ts, window) for ts in groups.values()), default=0)


def ms(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else (end - start) * 1000


async def wait_final(until: Callable[[], Any], what: str) -> bool:
    """Wait on the fake's own condition wait; False if the text did not arrive in time."""
    try:
        await until()
    except (AssertionError, TimeoutError):
        print(f"warning: {what}: final text not seen within {WAIT:.0f} s", file=sys.stderr)
        return False
    return True


def timed_reply(answer: str) -> Reply:
    return Reply(text=answer, chunk_size=CHUNK_SIZE, chunk_delay=CHUNK_DELAY)


@asynccontextmanager
async def agent_and_llm(answer: str, tmp: Path) -> AsyncIterator[tuple[Agent, FirstChunk]]:
    async with FakeLLM() as llm:
        stamp = FirstChunk(timed_reply(answer))
        llm.responder = stamp
        async with running_agent(llm, tmp) as agent:
            yield agent, stamp


def result(
    platform: str,
    *,
    stamp: Any,
    answer: str,
    expected: list[str],
    texts: list[str],
    complete: bool,
    posts: list[Any],
    edits: list[Any],
    window: float,
    max_edits: int,
    budget: str,
    budget_calls: int,
    errors: list[str],
) -> Result:
    """The figures of one platform's run; `max_edits` counts edits the way the platform's
    budget does (per message, or per channel)."""
    complete = complete and texts == expected and texts[-1].endswith(last_sentence(answer))
    return Result(
        platform=platform,
        first_call_ms=ms(stamp.at, posts[0].at if posts else None),
        posts=len(posts),
        edits=len(edits),
        max_edits_in_window=max_edits,
        max_posts_edits_in_window=max_in_window((c.at for c in posts + edits), window),
        budget=budget,
        budget_calls=budget_calls,
        complete=complete,
        final_ms=ms(stamp.at, max((c.at for c in posts + edits), default=None)),
        messages=len(texts),
        errors=errors,
    )


# ---------------------------------------------------------------------- the platforms


async def telegram(answer: str, tmp: Path) -> Result:
    expected = [parse_html(to_telegram_html(p))[0] for p in split_message(answer, TELEGRAM_LIMIT)]
    async with (
        FakeTelegram(token=TELEGRAM_TOKEN) as fake,
        agent_and_llm(answer, tmp) as (
            agent,
            stamp,
        ),
    ):
        config = TelegramConfig(enabled=True, base_url=fake.url, allow_users=[str(ALICE.id)])
        channel = TelegramChannel(config, {config.token_env: TELEGRAM_TOKEN})
        await channel.start(agent)
        try:
            fake.dm(ALICE, QUESTION)
            complete = await wait_final(
                lambda: fake.wait_until(
                    lambda: fake.texts(ALICE.id) == expected, timeout=WAIT, what="final text"
                ),
                "telegram",
            )
            await agent.wait_idle()
        finally:
            await channel.stop()
        calls = [c for c in fake.calls if c.params.get("chat_id") == ALICE.id]
        posts = [c for c in calls if c.method == "sendMessage"]
        edits = [c for c in calls if c.method == "editMessageText"]
        texts = fake.texts(ALICE.id)
        errors = [f"{c.method} {c.status}" for c in posts + edits if c.status != 200]
        errors += llm_errors(stamp)
    return result(
        "telegram",
        stamp=stamp,
        answer=answer,
        expected=expected,
        texts=texts,
        complete=complete,
        posts=posts,
        edits=edits,
        window=1.0,
        max_edits=max_per_key(((c.params["message_id"], c.at) for c in edits), 1.0),
        budget="1 edit / 1 s per message",
        budget_calls=1,
        errors=errors,
    )


async def slack(answer: str, tmp: Path) -> Result:
    expected = [to_slack_mrkdwn(p) for p in split_message(answer, LIMIT_BYTES, slack_size)]
    async with FakeSlack() as fake, agent_and_llm(answer, tmp) as (agent, stamp):
        config = SlackConfig(enabled=True, base_url=fake.url, allow_users=[SLACK_USER])
        environ = {
            config.bot_token_env: fake.bot_token,
            config.app_token_env: fake.app_token,
            config.signing_secret_env: SLACK_SECRET,
        }
        channel = SlackChannel(config, environ)
        await channel.start(agent)
        try:
            await fake.connected()
            await fake.dm(QUESTION, user=SLACK_USER, channel=SLACK_DM)

            def shown() -> list[str]:
                return [m.text for m in fake.thread(SLACK_DM, None)]  # DMs: top level

            complete = await wait_final(
                lambda: fake.until(lambda: shown() == expected, WAIT, "final text"), "slack"
            )
            await agent.wait_idle()
        finally:
            await channel.stop()
        texts = shown()
        calls = [c for c in fake.calls if c.params.get("channel") == SLACK_DM]
        posts = [c for c in calls if c.method == "chat.postMessage"]
        edits = [c for c in calls if c.method == "chat.update"]
    return result(
        "slack",
        stamp=stamp,
        answer=answer,
        expected=expected,
        texts=texts,
        complete=complete,
        posts=posts,
        edits=edits,
        window=1.0,
        max_edits=max_per_key(((c.params["ts"], c.at) for c in edits), 1.0),
        budget="1 edit / 1 s per message",
        budget_calls=1,
        errors=llm_errors(stamp),
    )


async def discord(answer: str, tmp: Path) -> Result:
    expected = [to_discord(p) for p in split_message(answer, discord_reply.MESSAGE_LIMIT)]
    dm = fake_discord.DM_CHANNEL_ID
    with discord_api.library_endpoints_restored():
        async with (
            fake_discord.FakeDiscord() as fake,
            agent_and_llm(answer, tmp) as (
                agent,
                stamp,
            ),
        ):
            config = DiscordConfig(
                enabled=True,
                allow_users=[fake_discord.USER.id],
                api_base_url=fake.url,
                gateway_url=fake.gateway_url,
            )
            channel = DiscordChannel(config, {config.token_env: fake_discord.TOKEN})
            await channel.start(agent)
            try:
                await fake.dm(QUESTION)
                complete = await wait_final(
                    lambda: fake.wait_until(lambda: fake.bot_texts(dm) == expected, WAIT),
                    "discord",
                )
                await agent.wait_idle()
            finally:
                await channel.stop()
            texts = fake.bot_texts(dm)
            calls = [c for c in fake.calls if c.params.get("channel_id") == dm]
            posts = [c for c in calls if c.method == "create_message"]
            edits = [c for c in calls if c.method == "edit_message"]
            errors = [c.method for c in fake.failed] + llm_errors(stamp)
    window = discord_adapter.EDIT_WINDOW
    return result(
        "discord",
        stamp=stamp,
        answer=answer,
        expected=expected,
        texts=texts,
        complete=complete,
        posts=posts,
        edits=edits,
        window=window,
        max_edits=max_in_window((c.at for c in edits), window),
        budget=f"{discord_adapter.EDITS_PER_WINDOW} edits / {window:.0f} s per channel",
        budget_calls=discord_adapter.EDITS_PER_WINDOW,
        errors=errors,
    )


PLATFORMS = {"telegram": telegram, "slack": slack, "discord": discord}


async def bench(answer: str) -> list[Result]:
    results = []
    with tempfile.TemporaryDirectory(prefix="parley-relay-") as tmp:
        for name, run in PLATFORMS.items():
            (Path(tmp) / name).mkdir()
            results.append(await run(answer, Path(tmp) / name))
    return results


# ---------------------------------------------------------------------- output


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def render(results: list[Result]) -> str:
    lines = [
        "| platform | first-call delay ms | posts | edits | max edits in window | budget "
        "| final text complete | final text ms | messages |",
        "|---|--:|--:|--:|--:|---|---|--:|--:|",
    ]
    for r in results:
        ok = r.max_edits_in_window <= r.budget_calls
        lines.append(
            f"| {r.platform} | {_num(r.first_call_ms)} | {r.posts} | {r.edits} "
            f"| {r.max_edits_in_window}{'' if ok else ' (over)'} | {r.budget} "
            f"| {'yes' if r.complete else 'NO'} | {_num(r.final_ms)} | {r.messages} |"
        )
    return "\n".join(lines)


def scrub_proxies() -> None:
    """Proxies would route 127.0.0.1 traffic away (as tests/conftest.py does)."""
    for key in list(os.environ):
        if key.lower().endswith("_proxy"):
            del os.environ[key]
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~600-token answer (smoke run)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the numbers here")
    args = parser.parse_args(argv)
    scrub_proxies()

    counter = TokenCounter()
    answer = build_answer(QUICK_TOKENS if args.quick else TOKENS, counter)
    tokens = counter.text(answer)
    chunks = -(-len(answer) // CHUNK_SIZE)
    stream_s = (chunks - 1) * CHUNK_DELAY

    started = time.perf_counter()
    results = asyncio.run(bench(answer))
    wall = time.perf_counter() - started

    print(
        f"Answer: {len(answer):,} characters, {tokens:,} tokens "
        f"({'exact' if counter.exact else 'estimated'}), streamed by the fake LLM in {chunks} "
        f"chunks of {CHUNK_SIZE} characters {CHUNK_DELAY * 1000:.0f} ms apart "
        f"(~{stream_s:.1f} s); default edit interval 1.0 s; one DM per platform."
    )
    print()
    print(render(results))
    print()
    print(
        "first-call delay: first text chunk (responder time + chunk_delay) to the first "
        "text-carrying call; max edits in window: 1 s per message (Telegram, Slack), 5 s per "
        "channel (Discord); final text ms: first chunk to the last post or edit."
    )
    for r in results:
        extra = f"; errors: {', '.join(r.errors)}" if r.errors else ""
        print(f"{r.platform}: most posts+edits in any window {r.max_posts_edits_in_window}{extra}")
    print(f"wall time: {wall:.1f} s")

    if args.json:
        summary = {
            "answer_chars": len(answer),
            "answer_tokens": tokens,
            "chunk_size": CHUNK_SIZE,
            "chunk_delay_s": CHUNK_DELAY,
            "stream_s": stream_s,
            "platforms": [asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(summary, indent=2) + "\n")

    incomplete = [r.platform for r in results if not r.complete]
    if incomplete:
        print(f"final text incomplete on: {', '.join(incomplete)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
