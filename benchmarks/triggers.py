"""Triggers (docs/triggers.md): signed webhook deliveries one `parley run` accepts per
second, and the time from the sender's 2xx to the first post in the delivery's thread.

Each phase starts a fresh `parley run` (`python -m bot run`, as `tests/triggers/hookkit.py`
starts it, at its default log level) serving one trigger, `ci` (`tests.triggers.hookkit.
CI_TRIGGER`: GitHub `check_run` deliveries, `thread_by` the repository and head SHA,
posting into the Slack channel C1) with `rate_per_minute = 100000`, so the shared rate
limit never answers 429. The store is a new SQLite file, and with `--postgres URL` also,
in a second column, a new schema on that PostgreSQL server. The fake Slack
(`tests.fakes.slack.FakeSlack`, Socket Mode) and the fake LLM (`tests.fakes.llm.FakeLLM`:
one short answer in one chunk, no tool call, no delay) run in this process. Deliveries
are signed as GitHub signs them (`tests.triggers.hookkit.signed`, before any clock starts)
and POSTed to `/hooks/ci` over one `httpx.AsyncClient` (`trust_env=False`). Each phase
begins with 5 warm-up deliveries, not measured, each answered before the next is sent.

* **deliveries accepted per second**: N deliveries (500; 100 with `--quick`) sent by 16
  senders (16 in flight, one connection each): 202s / (first send → last response). Two
  variants: *distinct keys* (each delivery a thread and conversation of its own) and *one
  key* (all N in one thread: one conversation, its runs queued in order). The worker runs
  the accepted runs while deliveries still arrive, on the same event loop and store: that
  is one worker's intake. **2xx latency**: each delivery's send → its response
  (p50 / p99, nearest rank). **answers other than 202**: counted, not sent again.
  **first send → all N answered**: until the fake Slack has recorded every run's answer
  (intake and runs together), waited for up to 60 s (10 s with `--quick`); past that, how
  many were answered by then. With one key that wait runs out: a run ends only after
  its final edit (`channels.stream.ReplyStreamer.finish`), which waits the Slack
  adapter's `edit_interval_seconds` (1 s) after the answer's post even when the edit
  changes nothing a reader sees, so one conversation's runs go at about one a second.
  That is the default users run, so it is measured as it is. **CPU per delivery**: user
  and system CPU from the first send to the end of that wait, / N: of the `parley run`
  process (`/proc/PID/stat`), and of this script (`time.process_time()`: the fakes and
  the senders; near one core per second, the harness and not Parley bounds the rate).
* **2xx to first post** / **2xx to the answer**: M deliveries (50; 20 with `--quick`), each
  its own key, sent one at a time: send, wait for its answer, pause 50 ms. From the moment
  this script has read the 202 to the fake Slack's record of the thread's header
  `chat.postMessage` (`[ci] <key>` in C1), and of the first call after which a message in
  that thread reads the model's answer. The record's time is `Call.at`
  (`time.monotonic()` in this process, stamped when the request reaches the fake, before
  it is answered), so both ends are read on one clock; with this process idle between
  deliveries, the stamp lags the request's arrival by well under a millisecond.

Usage (from the repo root)::

    .venv/bin/python benchmarks/triggers.py [--quick] [--n N] [--m M] [--postgres URL]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.channels.test_stored_before_ack import Parley, free_port, parley_run  # noqa: E402
from tests.fakes.calls import Call  # noqa: E402
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply  # noqa: E402
from tests.fakes.slack import FakeSlack  # noqa: E402
from tests.process import child_env, fake_llm_config  # noqa: E402
from tests.triggers.hookkit import CI_TRIGGER, SECRET, check_run, signed  # noqa: E402

N, QUICK_N = 500, 100  # deliveries per intake variant
M, QUICK_M = 50, 20  # deliveries timed one at a time
DRAIN, QUICK_DRAIN = 60.0, 10.0  # seconds to wait for every run's answer
IN_FLIGHT = 16
WARMUP = 5
GAP = 0.05  # seconds between the one-at-a-time deliveries
ANSWER = "looked at it: the test is flaky"
CHANNEL = "C1"
TICKS = os.sysconf("SC_CLK_TCK")
TRIGGER = CI_TRIGGER + "rate_per_minute = 100000\n"
VARIANTS = ("distinct keys", "one key")


def _answer(request: RecordedRequest) -> Reply:
    return Reply(text=ANSWER, chunk_size=len(ANSWER))


def header(key: str) -> str:
    return f"[ci] acme/widgets#{key}"


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


# ---------------------------------------------------------------------- the worker


@contextlib.asynccontextmanager
async def postgres_schema(url: str) -> AsyncIterator[str]:
    """The store URL of a fresh schema on the server at `url`, dropped afterwards."""
    import psycopg

    schema = f"parley_bench_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        await admin.execute(f"CREATE SCHEMA {schema}")
        try:
            sep = "&" if "?" in url else "?"
            yield f"{url}{sep}options=-csearch_path%3D{schema}"
        finally:
            await admin.execute(f"DROP SCHEMA {schema} CASCADE")


def write_config(state: Path, llm: FakeLLM, slack: FakeSlack, port: int, store: str) -> Path:
    """config.toml: the fake LLM, the fake Slack (C1 allowed), `[server] listen` on `port`
    and the `ci` trigger; `store`: the TOML line of a PostgreSQL store, "" for SQLite."""
    state.mkdir(parents=True)
    section = f"""
        [channels.slack]
        enabled = true
        base_url = "{slack.url}"
        allow_users = ["U1"]
        allow_channels = ["{CHANNEL}"]
        [server]
        listen = "127.0.0.1:{port}"
        """
    config = state / "config.toml"
    config.write_text(fake_llm_config(llm.base_url, state, section + TRIGGER, store=store))
    return config


class Watch:
    """Follows the fake Slack's calls as they are recorded: when each header was posted,
    when each thread first read the answer (`Call.at`), and how many answers there are."""

    def __init__(self, slack: FakeSlack) -> None:
        self.slack = slack
        self.headers: dict[str, tuple[float, str]] = {}  # header text → (at, its ts)
        self.answered_at: dict[str, float] = {}  # thread ts → its first answer's Call.at
        self.answers = 0
        self._edited: set[tuple[str, str]] = set()  # messages an edit made the answer
        self._seen = 0
        self._task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            calls = self.slack.calls
            for call in calls[self._seen :]:
                if call.method == "chat.postMessage":
                    self._posted(call)
                elif call.method == "chat.update":
                    self._edit(call)
            self._seen = len(calls)
            await self.slack.log.changed()

    def _posted(self, call: Call) -> None:
        channel, text = str(call.params.get("channel")), str(call.params.get("text") or "")
        thread = call.params.get("thread_ts")
        if thread:
            if text == ANSWER:
                self.answers += 1
                self.answered_at.setdefault(str(thread), call.at)
        elif text.startswith("[ci] ") and text not in self.headers:
            # the fake stored the message before this wakes; a header's text is unique
            messages = reversed(self.slack.messages.values())
            ts = next(m.ts for m in messages if m.channel == channel and m.texts[0] == text)
            self.headers[text] = (call.at, ts)

    def _edit(self, call: Call) -> None:
        where = (str(call.params.get("channel")), str(call.params.get("ts")))
        posted = self.slack.messages.get(where)
        if posted is None or posted.thread_ts is None or call.params.get("text") != ANSWER:
            return
        if posted.texts[0] != ANSWER and where not in self._edited:  # posted unfinished
            self._edited.add(where)
            self.answers += 1
            self.answered_at.setdefault(posted.thread_ts, call.at)

    async def until(self, condition: Callable[[], object], what: str, within: float) -> None:
        await self.slack.until(condition, within, what)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


@dataclass
class Served:
    """A running `parley run`, where its trigger is, the sender and the watch."""

    parley: Parley
    url: str
    client: httpx.AsyncClient
    watch: Watch

    def cpu(self) -> float:
        """User + system CPU seconds of the `parley run` process so far."""
        stat = Path(f"/proc/{self.parley.proc.pid}/stat").read_text()
        user, system = stat.rsplit(")", 1)[1].split()[11:13]
        return (int(user) + int(system)) / TICKS

    async def post(self, body: bytes, headers: dict[str, str]) -> int:
        response = await self.client.post(self.url, content=body, headers=headers)
        return response.status_code

    async def one(self, key: str) -> tuple[float, float, float]:
        """Deliver one event of `key` and wait for its answer: seconds from the send to the
        202, from the 202 to the header's post, from the 202 to the answer."""
        body, headers = signed(check_run(sha=key))
        sent = time.monotonic()
        status = await self.post(body, headers)
        accepted = time.monotonic()
        if status != 202:
            raise RuntimeError(f"delivery {key}: answered {status}")
        watch, line = self.watch, header(key)
        await watch.until(lambda: line in watch.headers, f"the header of {key}", 30)
        posted, ts = watch.headers[line]
        await watch.until(lambda: ts in watch.answered_at, f"the answer of {key}", 30)
        return accepted - sent, posted - accepted, watch.answered_at[ts] - accepted


@contextlib.asynccontextmanager
async def serving(state: Path, postgres: str | None) -> AsyncIterator[Served]:
    """A fresh `parley run` serving the `ci` trigger, with its fakes, warmed up."""
    async with contextlib.AsyncExitStack() as stack:
        llm = await stack.enter_async_context(FakeLLM())
        llm.responder = _answer
        slack = await stack.enter_async_context(FakeSlack())
        store = ""
        if postgres:
            store = f'url = "{await stack.enter_async_context(postgres_schema(postgres))}"'
        port = free_port()
        env = child_env(
            SLACK_BOT_TOKEN=slack.bot_token,
            SLACK_APP_TOKEN=slack.app_token,
            SLACK_SIGNING_SECRET="signing-secret",
            GITHUB_WEBHOOK_SECRET=SECRET,
        )
        config = write_config(state, llm, slack, port, store)
        parley = await stack.enter_async_context(parley_run(config, env))
        await slack.connected()
        watch = Watch(slack)
        stack.push_async_callback(watch.close)
        limits = httpx.Limits(max_connections=IN_FLIGHT, max_keepalive_connections=IN_FLIGHT)
        client = await stack.enter_async_context(
            httpx.AsyncClient(trust_env=False, timeout=60, limits=limits)
        )
        served = Served(parley, f"http://127.0.0.1:{port}/hooks/ci", client, watch)
        for i in range(WARMUP):
            await served.one(f"warm{i}")
        yield served


# ---------------------------------------------------------------------- the phases


@dataclass
class Intake:
    variant: str
    deliveries: int
    in_flight: int
    seconds: float
    per_second: float
    p50_ms: float
    p99_ms: float
    not_202: dict[str, int]
    answered: int  # runs answered by the end of the wait
    drained_s: float | None  # first send → the last answer; None: not within the wait
    waited_s: float
    cpu_ms_per_delivery: float
    harness_cpu_ms_per_delivery: float


@dataclass
class OneByOne:
    deliveries: int
    accepted_p50_ms: float
    first_post_p50_ms: float
    first_post_p99_ms: float
    answer_p50_ms: float
    answer_p99_ms: float


async def intake(variant: str, n: int, drain: float, state: Path, pg: str | None) -> Intake:
    """N deliveries, IN_FLIGHT at a time, of distinct keys or of one key (`variant`)."""
    keys = [f"k{i}" if variant == "distinct keys" else "one" for i in range(n)]
    queue = [signed(check_run(sha=key)) for key in reversed(keys)]
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    async with serving(state, pg) as served:
        watch = served.watch
        before = watch.answers

        async def sender() -> None:
            while queue:
                body, headers = queue.pop()
                sent = time.monotonic()
                status = await served.post(body, headers)
                latencies.append(time.monotonic() - sent)
                statuses[str(status)] = statuses.get(str(status), 0) + 1

        cpu, own, started = served.cpu(), time.process_time(), time.monotonic()
        async with asyncio.TaskGroup() as senders:
            for _ in range(IN_FLIGHT):
                senders.create_task(sender())
        seconds = time.monotonic() - started
        accepted = statuses.get("202", 0)
        drained_s: float | None = None
        with contextlib.suppress(AssertionError):  # the fake's WaitTimeout
            await watch.until(lambda: watch.answers - before >= accepted, "every answer", drain)
            drained_s = time.monotonic() - started
        waited_s = time.monotonic() - started
        cpu, own = served.cpu() - cpu, time.process_time() - own
        answered = watch.answers - before
    return Intake(
        variant=variant,
        deliveries=n,
        in_flight=IN_FLIGHT,
        seconds=seconds,
        per_second=accepted / seconds,
        p50_ms=statistics.median(latencies) * 1000,
        p99_ms=nearest_rank(latencies, 0.99) * 1000,
        not_202={k: v for k, v in statuses.items() if k != "202"},
        answered=answered,
        drained_s=drained_s,
        waited_s=waited_s,
        cpu_ms_per_delivery=cpu / n * 1000,
        harness_cpu_ms_per_delivery=own / n * 1000,
    )


async def one_by_one(m: int, state: Path, pg: str | None) -> OneByOne:
    """M deliveries, each its own key, one at a time (see the module doc)."""
    timings = []
    async with serving(state, pg) as served:
        for i in range(m):
            timings.append(await served.one(f"lat{i}"))
            await asyncio.sleep(GAP)
    accepted, posts, answers = ([t[k] * 1000 for t in timings] for k in range(3))
    return OneByOne(
        deliveries=m,
        accepted_p50_ms=statistics.median(accepted),
        first_post_p50_ms=statistics.median(posts),
        first_post_p99_ms=nearest_rank(posts, 0.99),
        answer_p50_ms=statistics.median(answers),
        answer_p99_ms=nearest_rank(answers, 0.99),
    )


# ---------------------------------------------------------------------- report


def rows(intakes: list[Intake], timed: OneByOne) -> list[tuple[str, str]]:
    """(figure, value) of one store, in the table's order."""
    out: list[tuple[str, str]] = []
    for r in intakes:
        other = ", ".join(f"{count}× {status}" for status, count in sorted(r.not_202.items()))
        drained = (
            f"{r.drained_s:.1f}"
            if r.drained_s is not None
            else f"> {r.waited_s:.0f} ({r.answered} answered)"
        )
        out += [
            (
                f"deliveries accepted per second, {r.variant} (N={r.deliveries}, "
                f"{r.in_flight} in flight)",
                f"{r.per_second:.0f}",
            ),
            (f"2xx latency p50 / p99 ms, {r.variant}", f"{r.p50_ms:.1f} / {r.p99_ms:.1f}"),
            (f"answers other than 202, {r.variant}", other or "0"),
            (f"first send → all N answered s, {r.variant}", drained),
            (
                f"CPU ms per delivery, worker / this script, {r.variant}",
                f"{r.cpu_ms_per_delivery:.1f} / {r.harness_cpu_ms_per_delivery:.1f}",
            ),
        ]
    what = f"M={timed.deliveries} one at a time"
    return [
        *out,
        (f"2xx latency p50 ms, {what}", f"{timed.accepted_p50_ms:.1f}"),
        (
            f"2xx to first post (the thread's header) p50 / p99 ms, {what}",
            f"{timed.first_post_p50_ms:.1f} / {timed.first_post_p99_ms:.1f}",
        ),
        (
            f"2xx to the answer in the thread p50 / p99 ms, {what}",
            f"{timed.answer_p50_ms:.1f} / {timed.answer_p99_ms:.1f}",
        ),
    ]


def table(columns: dict[str, list[tuple[str, str]]]) -> str:
    """`| figure | <store> … |`, one column per store."""
    names = list(columns)
    lines = [f"| figure | {' | '.join(names)} |", "|---|" + "---:|" * len(names)]
    for i, (figure, _) in enumerate(columns[names[0]]):
        lines.append(f"| {figure} | {' | '.join(columns[n][i][1] for n in names)} |")
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    stores: list[tuple[str, str | None]] = [("SQLite", None)]
    if args.postgres:
        stores.append(("PostgreSQL", args.postgres))
    results: dict[str, Any] = {"cpus": os.cpu_count(), "stores": {}}
    columns: dict[str, list[tuple[str, str]]] = {}
    with tempfile.TemporaryDirectory(prefix="parley-triggers-") as tmp:
        for name, pg in stores:
            base = Path(tmp) / name
            intakes = [
                await intake(variant, args.n, args.drain, base / variant.replace(" ", "-"), pg)
                for variant in VARIANTS
            ]
            timed = await one_by_one(args.m, base / "one-by-one", pg)
            columns[name] = rows(intakes, timed)
            results["stores"][name] = {
                "intake": [asdict(r) for r in intakes],
                "one_by_one": asdict(timed),
            }
    print(table(columns))
    return results


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: small and short")
    parser.add_argument("--n", type=int, default=N, help="deliveries per intake variant")
    parser.add_argument("--m", type=int, default=M, help="deliveries timed one at a time")
    parser.add_argument(
        "--postgres", metavar="URL", help="also on PostgreSQL (a fresh schema of this server)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    args.drain = DRAIN
    if args.quick:
        args.n, args.m, args.drain = QUICK_N, QUICK_M, QUICK_DRAIN
    return args


if __name__ == "__main__":
    arguments = parse_args()
    figures = asyncio.run(main(arguments))
    if arguments.json:
        arguments.json.write_text(json.dumps(figures, indent=2))
