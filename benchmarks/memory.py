"""Long-term memory recall (docs/delegation-memory.md): quality and latency of lexical recall, per
backend.

A generated set: 200 memories made from seven templates (favourites, on-call rotas,
backups, contact preferences, release dates, decisions, allergies) over 20 people, 12
services and 10 projects, so most memories share words with many others. 50 of them
answer 50 questions phrased as a person would ask them (other word forms, words the memory does
not hold: "which editor does Dana like best?" for "Dana's favourite editor is Helix.";
"what can't Dana eat?" for "Dana is allergic to sesame.", which shares only the name).
The memories are spread over the four scopes a DM sees (its user, conversation, channel,
team) plus other people's user scopes, which a recall must never return.

For each backend (SQLite, and PostgreSQL if one answers at `PARLEY_BENCH_POSTGRES_URL`,
default `postgresql://postgres@127.0.0.1:5432/test`, in a schema of its own, dropped
after) and each size (the 200, then the same with 4,800 filler notes that share their
words but answer no question): recall@1 and recall@5 (the answer is the first / among the
first five results), mean and p95 latency of one `recall` through the real store, and
results from scopes the asker is not in (must be 0).

**Idle conversations** (`--idle N`, default 10,000; `--quick`: 500): what a conversation
costs the process once its turn is over. One process runs the real agent (`App` +
`open_agent()` on a fresh SQLite store, the shipped defaults, the fake LLM in process
answering each turn with a short text), N conversations each take one message (200 at a
time, `agent.submit` then `agent.wait_idle()`), and the table gives the RSS before and
after, per conversation, and how many of them still hold a lane in memory (`[agent]`
keeps up to 1,000; older idle ones are evicted and reload from the store). `--tool-calls K`
makes each turn K `read_file` calls of ~1 KB results first (a held conversation of 2K+2
messages). With `--heap`, the Python heap the conversations hold (`tracemalloc`) is
printed beside it, in a run of its own: its traces would inflate the RSS. RSS also holds
what the allocator keeps after a turn's temporaries are freed, and SQLite's page cache.

**A big message** (`--big N`, default 3; `--big-only`): what a worker keeps after taking
in 100 KB messages (a pasted log), each in a conversation of its own, through the same
real agent with a 128,000-token window (the fake LLM answers each with a short text). The
first one loads the tokenizer (tiktoken's `cl100k_base`), which the process keeps; the
table gives the RSS after each message and what it added.

Usage (from the repo root)::

    .venv/bin/python benchmarks/memory.py [--quick] [--idle N] [--tool-calls K] [--idle-only]
        [--big N] [--big-only]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from core.chat import Asker  # noqa: E402
from core.memory.scopes import visible_scopes  # noqa: E402
from core.store import Scope, Store, open_store  # noqa: E402

POSTGRES_URL = os.environ.get(
    "PARLEY_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
MEMORIES, QUERIES, FILLER = 200, 50, 4_800
ASKER = Asker("slack", "D1", "U1", True, "slack:D1:")

PEOPLE = [
    "Dana",
    "Ravi",
    "Mei",
    "Tomas",
    "Aisha",
    "Lukas",
    "Priya",
    "Omar",
    "Greta",
    "Kenji",
    "Sofia",
    "Mateo",
    "Ines",
    "Yusuf",
    "Hana",
    "Pavel",
    "Chloe",
    "Arjun",
    "Nora",
    "Felix",
]
SERVICES = "billing search auth payments gateway ledger inventory mailer reports api chat sso"
PROJECTS = [
    "Atlas",
    "Borealis",
    "Cobalt",
    "Delta",
    "Ember",
    "Falcon",
    "Granite",
    "Helios",
    "Iris",
    "Juniper",
]
THINGS = {
    "editor": ["Helix", "Vim", "Emacs", "Zed", "Kate"],
    "colour": ["teal", "ochre", "crimson", "navy", "olive"],
    "lunch spot": ["Nonna's", "Pho-King", "Bento-Box", "Falafel-Hut", "Curry-Leaf"],
    "keyboard": ["Ergodox", "Moonlander", "Kinesis", "HHKB", "Planck"],
}
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
]
TECH = ["Kafka", "Redis", "SQLite", "Rust", "Terraform", "Postgres", "gRPC", "Celery"]
FOODS = ("peanuts", "shellfish", "gluten", "sesame", "soy")
REASONS = (
    "it is cheaper to run",
    "the team already knows it",
    "latency matters most there",
    "it needs no extra servers",
)

# (memory, question) per template; the question shares only some words with its memory.
TEMPLATES: tuple[tuple[str, str], ...] = (
    ("{p}'s favourite {thing} is {value}.", "Which {thing} does {p} like best?"),
    ("{p} is on call for the {svc} service in {month}.", "Who covers {svc} on-call in {month}?"),
    (
        "The {svc} database is backed up every {n} hours to bucket {svc}-bk-{n}.",
        "How often are {svc} backups taken?",
    ),
    (
        "{p} prefers to be contacted on Signal after {n} pm.",
        "How should I contact {p} in the evening?",
    ),
    ("The {project} release is planned for {month} {n}.", "When is {project} going to release?"),
    (
        "We chose {tech} for {project} because {reason}.",
        "Why did we pick {tech} for the {project} project?",
    ),
    # No word in common but the name: what lexical recall cannot bridge.
    ("{p} is allergic to {food}.", "What can't {p} eat?"),
)


# Filler: notes that share the questions' words (people, services, months, projects) but
# answer none of them.
FILLER_TEMPLATES = (
    "{p} asked about the {svc} dashboard on {month} {n}.",
    "{p} and {p2} paired on the {project} {svc} tests.",
    "Reminder: {svc} maintenance window on {month} {n}.",
    "{p} moved the {project} planning meeting to {month} {n}.",
    "{p} shared a {thing} tip in the {project} channel.",
    "The {svc} alerts were noisy during the {project} demo with {p}.",
)


@dataclass(frozen=True, slots=True)
class Case:
    text: str
    question: str


def slots(rng: random.Random) -> dict[str, str]:
    thing = rng.choice(list(THINGS))
    return {
        "p": rng.choice(PEOPLE),
        "p2": rng.choice(PEOPLE),
        "thing": thing,
        "value": rng.choice(THINGS[thing]),
        "svc": rng.choice(SERVICES.split()),
        "month": rng.choice(MONTHS),
        "n": str(rng.randint(2, 11)),
        "project": rng.choice(PROJECTS),
        "tech": rng.choice(TECH),
        "reason": rng.choice(REASONS),
        "food": rng.choice(FOODS),
    }


def generate(count: int, rng: random.Random) -> list[Case]:
    """`count` memories, each the only answer to its question."""
    cases: dict[str, Case] = {}
    while len(cases) < count:
        memory, question = rng.choice(TEMPLATES)
        values = slots(rng)
        asked = question.format(**values)
        cases.setdefault(asked, Case(memory.format(**values), asked))
    return list(cases.values())


def filler(count: int, rng: random.Random) -> list[str]:
    """`count` distinct notes that answer no question."""
    notes: dict[str, None] = {}
    while len(notes) < count:
        notes[rng.choice(FILLER_TEMPLATES).format(**slots(rng))] = None
    return list(notes)


def scope_of(index: int) -> Scope:
    """Spread over the asker's four scopes, and (one in six) other people's."""
    visible = visible_scopes(ASKER)
    if index % 6 == 5:
        return Scope("user", f"slack:U{100 + index}")
    return visible[index % len(visible)]


@dataclass(frozen=True, slots=True)
class Row:
    backend: str
    memories: int
    at1: float
    at5: float
    mean_ms: float
    p95_ms: float
    leaks: int


async def measure(store: Store, backend: str, extra: int, rng: random.Random) -> list[Row]:
    """Store the set, ask every question; then add `extra` filler notes and ask again."""
    cases = generate(MEMORIES, rng)
    answers: list[tuple[str, int]] = []
    targets = set(rng.sample(range(MEMORIES), QUERIES))
    for index, case in enumerate(cases):
        scope = scope_of(index) if index not in targets else visible_scopes(ASKER)[index % 4]
        row = await store.remember(scope, case.text, made_by="U1", conv=ASKER.conv)
        if index in targets:
            answers.append((case.question, row.id))
    rows = [await ask(store, backend, answers, MEMORIES)]
    if extra:
        for index, note in enumerate(filler(extra, rng)):
            await store.remember(scope_of(index), note, made_by="U9", conv="slack:C9:")
        rows.append(await ask(store, backend, answers, MEMORIES + extra))
    return rows


async def ask(store: Store, backend: str, answers: list[tuple[str, int]], size: int) -> Row:
    scopes = visible_scopes(ASKER)
    at1 = at5 = leaks = 0
    times: list[float] = []
    for _ in range(3):  # latency over three passes; quality from the last (they agree)
        at1 = at5 = leaks = 0
        for question, answer in answers:
            start = time.perf_counter()
            hits = await store.recall(question, scopes, 5)
            times.append(time.perf_counter() - start)
            ids = [hit.id for hit in hits]
            at1 += ids[:1] == [answer]
            at5 += answer in ids
            leaks += sum(hit.scope not in scopes for hit in hits)
    times.sort()
    return Row(
        backend,
        size,
        at1 / len(answers),
        at5 / len(answers),
        statistics.mean(times) * 1e3,
        times[int(0.95 * (len(times) - 1))] * 1e3,
        leaks,
    )


@contextlib.asynccontextmanager
async def postgres_store() -> AsyncIterator[Store | str]:
    """A store in a fresh PostgreSQL schema, or why there is none."""
    try:
        import psycopg
    except ImportError as exc:
        yield f"psycopg is not installed ({exc})"
        return
    try:
        admin = await psycopg.AsyncConnection.connect(
            POSTGRES_URL, autocommit=True, connect_timeout=3
        )
    except psycopg.OperationalError as exc:
        yield f"no PostgreSQL at {POSTGRES_URL} ({str(exc).strip()})"
        return
    schema = f"parley_bench_{uuid.uuid4().hex[:12]}"
    async with admin:
        await admin.execute(f"CREATE SCHEMA {schema}")
        try:
            joiner = "&" if "?" in POSTGRES_URL else "?"
            store = await open_store(f"{POSTGRES_URL}{joiner}options=-csearch_path%3D{schema}")
            async with store:
                yield store
        finally:
            await admin.execute(f"DROP SCHEMA {schema} CASCADE")


async def run(quick: bool) -> None:
    extra = 0 if quick else FILLER
    rows: list[Row] = []
    with TemporaryDirectory() as tmp:
        async with await open_store(Path(tmp) / "memory.db") as store:
            rows += await measure(store, "SQLite (FTS5)", extra, random.Random(7))
    async with postgres_store() as pg:
        if isinstance(pg, str):
            print(f"PostgreSQL skipped: {pg}\n")
        else:
            rows += await measure(pg, "PostgreSQL (tsvector)", extra, random.Random(7))
    print(
        "| backend | memories | recall@1 | recall@5 | mean recall latency (ms) | p95 (ms) | "
        "results from other scopes |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.backend} | {r.memories:,} | {r.at1:.2f} | {r.at5:.2f} | {r.mean_ms:.2f} | "
            f"{r.p95_ms:.2f} | {r.leaks} |"
        )
    print(f"\n{QUERIES} questions with known answers; lexical recall, top 5 per question.")


def rss_kb() -> int:
    """This process's resident set now (Linux), in KB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


async def idle_conversations(
    n: int, batch: int = 200, tool_calls: int = 0, heap: bool = False
) -> None:
    import gc
    import tracemalloc

    from bot.app import App, build_registry
    from core.agent import QuietResponder
    from tests.agentkit import agent_config, inbound
    from tests.fakes.llm import FakeLLM, RecordedRequest, Reply, ToolCallSpec

    def answer(request: RecordedRequest) -> Reply:
        done = sum(m["role"] == "tool" for m in request.json["messages"])
        if done < tool_calls:  # `--tool-calls`: a turn of that many tool iterations first
            return Reply(tool_calls=[ToolCallSpec("read_file", {"path": f"notes{done}.txt"})])
        return Reply(text="Noted: the release is on Thursday.")

    with TemporaryDirectory() as tmp:
        async with FakeLLM() as fake:
            fake.responder = answer
            config = agent_config(fake, Path(tmp))
            for i in range(tool_calls):  # ~1 KB each, as a short file or command output is
                (Path(tmp) / "workspace" / f"notes{i}.txt").write_text(f"note {i}: " + "x" * 1000)
            app = App(config, {}, build_registry(config, {}))
            agent = await app.open_agent()
            responder = QuietResponder()

            async def converse(first: int, count: int, prefix: str) -> None:
                for i in range(first, first + count):
                    key = ("bench", f"{prefix}{i}", "")
                    message = inbound("When is the release?", key=key, event_id=f"{prefix}{i}")
                    await agent.submit(message, responder)
                await agent.wait_idle()
                fake.requests.clear()  # the fake shares the process: keep only Parley's

            try:
                await converse(0, 20, "warm")  # imports, caches, the first connections
                gc.collect()
                before = rss_kb()
                if heap:  # its own traces would inflate the RSS figure
                    tracemalloc.start()
                for first in range(0, n, batch):
                    await converse(first, min(batch, n - first), "idle")
                gc.collect()
                after = rss_kb()
                traced, _ = tracemalloc.get_traced_memory() if heap else (0, 0)
                tracemalloc.stop()
                held = len(agent.lanes)
            finally:
                await app.close_agent(agent)
                await app.aclose()
    print(
        "| idle conversations | lanes held | RSS before (MB) | RSS after (MB) | "
        "RSS per conversation (KB) | Python heap per conversation (KB) |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {n:,} | {held:,} | {before / 1024:.1f} | {after / 1024:.1f} | "
        f"{(after - before) / n:.1f} | {f'{traced / 1024 / n:.1f}' if heap else '–'} |"
    )
    if tool_calls:
        print(f"\nEach conversation's turn made {tool_calls} tool calls (~1 KB results).")
    print("\nGoal: an idle conversation (its lane evicted or not) costs ≤ 20 KB.")


BIG_MESSAGE = 100_000


async def big_messages(count: int) -> None:
    """RSS after each of `count` 100 KB messages, after 20 short turns (imports, caches,
    the first connections): the first loads the tokenizer, once per process
    (docs/benchmarks.md#memory-after-a-big-message)."""
    import gc

    from bot.app import App, build_registry
    from core.agent import QuietResponder
    from tests.agentkit import agent_config, inbound
    from tests.fakes.llm import FakeLLM, Reply

    text = ("Our deploy log, pasted whole: step ok; " * (BIG_MESSAGE // 38 + 1))[:BIG_MESSAGE]
    rows: list[tuple[str, int, bool]] = []
    with TemporaryDirectory() as tmp:
        async with FakeLLM() as fake:
            fake.responder = lambda _request: Reply(text="Noted.")
            window = {"providers": {"fake": {"context_window": 128_000}}}
            config = agent_config(fake, Path(tmp), **window)
            app = App(config, {}, build_registry(config, {}))
            agent = await app.open_agent()
            responder = QuietResponder()

            async def converse(name: str, message: str) -> None:
                key = ("bench", name, "")
                await agent.submit(inbound(message, key=key, event_id=name), responder)
                await agent.wait_idle()
                fake.requests.clear()  # the fake shares the process: keep only Parley's
                gc.collect()

            try:
                for i in range(20):
                    await converse(f"short{i}", "When is the release?")
                rows.append(("20 short turns (warm-up)", rss_kb(), app.counter.loaded))
                for i in range(1, count + 1):
                    await converse(f"big{i}", text)
                    rows.append((f"100 KB message {i}", rss_kb(), app.counter.loaded))
            finally:
                await app.close_agent(agent)
                await app.aclose()
    print("| after | RSS (MB) | RSS added (MB) | tokenizer loaded |")
    print("|---|---:|---:|---|")
    previous = None
    for label, rss, loaded in rows:
        added = "–" if previous is None else f"{(rss - previous) / 1024:+.1f}"
        print(f"| {label} | {rss / 1024:.1f} | {added} | {'yes' if loaded else 'no'} |")
        previous = rss
    print(
        "\nThe first big message loads the tokenizer (~40 MB, kept for the process's life); "
        "later ones add what their conversations hold."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the 200 memories only")
    parser.add_argument(
        "--idle", type=int, default=None, help="idle conversations to hold (default 10,000)"
    )
    parser.add_argument(
        "--tool-calls", type=int, default=0, help="tool iterations in each idle conversation's turn"
    )
    parser.add_argument("--idle-only", action="store_true", help="only the idle conversations")
    parser.add_argument(
        "--heap", action="store_true", help="also trace the Python heap (a second run is better)"
    )
    parser.add_argument(
        "--big", type=int, default=3, help="100 KB messages after the warm-up (0: none)"
    )
    parser.add_argument("--big-only", action="store_true", help="only the big messages")
    args = parser.parse_args(argv)
    if args.big_only:
        asyncio.run(big_messages(args.big))
        return 0
    if not args.idle_only:
        asyncio.run(run(args.quick))
        print()
        if args.big:  # before the idle conversations: a process that never loaded tiktoken
            asyncio.run(big_messages(args.big))
            print()
    n = args.idle or (500 if args.quick else 10_000)
    asyncio.run(idle_conversations(n, tool_calls=args.tool_calls, heap=args.heap))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
