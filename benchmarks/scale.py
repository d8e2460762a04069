"""Scale-out (docs/scale-out.md): `parley run` workers on one PostgreSQL against one process on
SQLite, end to end, and how long a dead Telegram poller takes to be replaced.

**Throughput.** Each phase starts fresh `parley run` worker processes (`python -m bot run`)
on a fresh store — a new SQLite file, or a new schema on the PostgreSQL server
`PARLEY_TEST_POSTGRES_URL` names (default `postgresql://postgres@127.0.0.1:5432/test`) —
with the fake LLM (`tests.fakes.llm.FakeLLM`, one streamed answer per turn, no tools) and
the fake Telegram (`tests.fakes.telegram.FakeTelegram`) in this process. Telegram runs in
webhook mode, the cheapest end-to-end path: this script is the load balancer and POSTs each
update, with the secret header, straight to a worker's webhook port. C conversations (C
users' DMs, default 200) run closed loops: send a message, wait until the bot's message in
that chat reads the answer, send the next; `--turns` per conversation after one warm-up
turn each (not measured).

* turns/s: measured turns / wall time of the phase.
* p50 / p99: a turn from the POST of its update to the fake Telegram recording the answer
  (nearest rank).
* CPU/turn, workers: user + system CPU of the worker processes over the phase
  (`/proc/PID/stat`) / turns; SQLite's engine runs inside the worker, so its work is here.
* CPU/turn, PostgreSQL: the same for the server processes of the workers' connections
  (found in `pg_stat_activity` by their application_name, sampled every 0.2 s; the server
  must run on this machine).
* CPU/turn, this script: the fake LLM, the fake Telegram and the load, in this process
  (`time.process_time()`); when it nears one core it, not Parley, bounds turns/s.

Routing: `sticky` sends a conversation always to worker `c % N` (a load balancer with
session affinity; works with any Parley), `random` to any worker per message — that needs
workers that claim queued runs from the store (one running run per conversation across
workers, in order), i.e. the workers' claim loop; without it two workers may run one
conversation's turns at once.

**Failover.** Two workers on PostgreSQL in polling mode (Telegram long polling is a leased
singleton, `telegram:poll:<bot id>`). The holder is killed with SIGKILL and a message is
sent at once; failover = kill → the answer recorded by the fake (another worker took the
lease, polled, ran the turn). Then the killed worker is started again as the standby, and
the next repetition kills the new holder. With `lease_seconds = L` the successor waits for
the lease to expire (up to L after the holder's last renewal, which was at most L/3 before
the kill) plus its next try (every L/3): expect about 2L/3 to 4L/3.

Usage (from the repo root)::

    .venv/bin/python benchmarks/scale.py [--quick] [--conversations C] [--turns T]
        [--workers 1,2,4] [--routing sticky|random] [--reps R] [--lease-seconds L]
        [--failover-reps R]
        [--skip-throughput] [--skip-failover] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("PTB_TIMEDELTA", "1")

from channels.telegram import SECRET_HEADER  # noqa: E402
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply  # noqa: E402
from tests.fakes.telegram import FakeTelegram, TgUser  # noqa: E402
from tests.process import fake_llm_config  # noqa: E402

TOKEN = "123456:BENCH-token"
SECRET = "bench-secret"
POSTGRES_URL = os.environ.get(
    "PARLEY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
TICKS = os.sysconf("SC_CLK_TCK")
# The reply streamer's edit throttle (1 s by default, Telegram's budget) would make every
# turn last a second and measure the throttle, not the workers: lowered here.
EDIT_INTERVAL = 0.05


def _answer(request: RecordedRequest) -> Reply:
    return Reply(text=f"pong: {request.json['messages'][-1]['content']}", chunk_size=64)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- stores ----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def postgres_store() -> AsyncIterator[tuple[str, str]]:
    """(URL, schema): a fresh schema of the test server, dropped afterwards; the workers'
    connections carry the schema as their application_name."""
    import psycopg

    schema = f"parley_bench_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as admin:
        await admin.execute(f"CREATE SCHEMA {schema}")
        try:
            sep = "&" if "?" in POSTGRES_URL else "?"
            query = f"options=-csearch_path%3D{schema}&application_name={schema}"
            yield f"{POSTGRES_URL}{sep}{query}", schema
        finally:
            await admin.execute(f"DROP SCHEMA {schema} CASCADE")


def proc_cpu(pid: int) -> float | None:
    """User + system CPU seconds of process `pid`; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class BackendCpu:
    """The CPU of the PostgreSQL server processes serving the workers (their connections
    are named after the schema), sampled every 0.2 s so a backend that closes mid-phase is
    counted up to its last sample. Readable when the server runs on this machine."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def _pids(self, conn: Any) -> list[int]:
        cursor = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (self.schema,)
        )
        return [int(row[0]) for row in await cursor.fetchall()]

    async def start(self) -> None:
        import psycopg

        conn = await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True)
        for pid in await self._pids(conn):
            if (cpu := proc_cpu(pid)) is not None:
                self.first[pid] = self.last[pid] = cpu
        self._task = asyncio.create_task(self._sample(conn))

    async def _sample(self, conn: Any) -> None:
        try:
            while True:
                for pid in await self._pids(conn):
                    if (cpu := proc_cpu(pid)) is not None:
                        self.last[pid] = cpu
                await asyncio.sleep(0.2)
        finally:
            await conn.close()

    async def stop(self) -> float:
        """CPU seconds the backends used since `start`."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        return sum(cpu - self.first.get(pid, 0.0) for pid, cpu in self.last.items())


# --- workers ---------------------------------------------------------------------------------


class Worker:
    """One `parley run` process; its stderr is collected."""

    def __init__(self, name: str, config: Path, port: int | None) -> None:
        self.name, self.config, self.port = name, config, port
        self.proc: asyncio.subprocess.Process | None = None
        self.err = bytearray()
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.endswith("_PROXY")}
        env |= {"TELEGRAM_BOT_TOKEN": TOKEN, "TELEGRAM_WEBHOOK_SECRET": SECRET}
        env |= {"PARLEY_LOG_LEVEL": "warning", "NO_PROXY": "127.0.0.1,localhost"}
        self.err.clear()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot",
            "--config",
            str(self.config),
            "run",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        assert self.proc.stderr is not None
        self._reader = asyncio.create_task(self._collect(self.proc.stderr))
        await self.until(b"parley: ready", 60)

    async def _collect(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(4096):
            self.err.extend(chunk)

    async def until(self, text: bytes, within: float) -> float:
        """Wait until stderr holds `text`; the time it was seen (monotonic)."""
        async with asyncio.timeout(within):
            while text not in self.err:
                if self.proc is not None and self.proc.returncode is not None:
                    raise RuntimeError(f"worker {self.name} exited:\n{self.err.decode()}")
                await asyncio.sleep(0.01)
        return time.monotonic()

    def cpu(self) -> float:
        """User + system CPU seconds of the process so far."""
        assert self.proc is not None
        return proc_cpu(self.proc.pid) or 0.0

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
        if self._reader is not None:
            await self._reader

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                await self.kill()
        if self._reader is not None:
            await self._reader


def worker_config(
    state: Path, store: str, llm: str, telegram: str, *, port: int | None, lease: float
) -> Path:
    state.mkdir(parents=True, exist_ok=True)
    where = f'url = "{store}"' if "://" in store else f'path = "{store}"'
    mode = (
        f'mode = "webhook"\nwebhook_url = "http://127.0.0.1:{port}/telegram"\n'
        f"webhook_port = {port}\n"
        if port is not None
        else 'mode = "polling"\n'
    )
    if "://" in store:
        where += f"\nlease_seconds = {lease}"
    config = state / "config.toml"
    config.write_text(
        fake_llm_config(
            llm,
            state,
            f'[channels.telegram]\nenabled = true\nopen = true\nbase_url = "{telegram}"\n'
            f"edit_interval_seconds = {EDIT_INTERVAL}\n" + mode,
            store=where,
        )
    )
    return config


# --- load ------------------------------------------------------------------------------------


class Answers:
    """Watches the fake Telegram's calls for the bot's answer in each chat."""

    def __init__(self, telegram: FakeTelegram) -> None:
        self.telegram = telegram
        self.waiting: dict[int, tuple[str, asyncio.Future[float]]] = {}
        self._seen = 0
        self._task = asyncio.create_task(self._watch())

    def expect(self, chat_id: int, text: str) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[chat_id] = (text, future)
        return future

    async def _watch(self) -> None:
        while True:
            calls = self.telegram.calls
            for call in calls[self._seen :]:
                if call.method not in ("sendMessage", "editMessageText"):
                    continue
                chat = int(call.params.get("chat_id") or 0)
                expected = self.waiting.get(chat)
                if expected and str(call.params.get("text", "")).strip() == expected[0]:
                    del self.waiting[chat]
                    if not expected[1].done():
                        expected[1].set_result(time.monotonic())
            self._seen = len(calls)
            await self.telegram.log.changed()

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class Load:
    """C conversations posting updates to the workers' webhooks."""

    def __init__(self, telegram: FakeTelegram, workers: list[Worker], routing: str) -> None:
        self.telegram, self.workers, self.routing = telegram, workers, routing
        self.answers = Answers(telegram)
        self._update_id = 0
        self._message_id = 0

    def user(self, c: int) -> TgUser:
        user = TgUser(500_000 + c, f"user{c}")
        self.telegram.chats[user.id] = {
            "id": user.id,
            "type": "private",
            "first_name": user.first_name,
        }
        return user

    async def turn(self, session: aiohttp.ClientSession, c: int, text: str) -> float:
        """One message in conversation `c`; seconds until its answer was recorded."""
        user = self.user(c)
        self._update_id += 1
        self._message_id += 1
        update = {
            "update_id": self._update_id,
            "message": {
                "message_id": self._message_id,
                "date": int(time.time()),
                "chat": self.telegram.chats[user.id],
                "from": user.to_dict(),
                "text": text,
            },
        }
        index = (
            c % len(self.workers)
            if self.routing == "sticky"
            else random.randrange(len(self.workers))
        )
        answered = self.answers.expect(user.id, f"pong: {text}")
        started = time.monotonic()
        url = f"http://127.0.0.1:{self.workers[index].port}/telegram"
        for _ in range(20):  # 500: not taken in (the store was busy); Telegram would retry
            async with session.post(url, json=update, headers={SECRET_HEADER: SECRET}) as response:
                if response.status == 200:
                    break
            await asyncio.sleep(0.2)
        else:
            raise RuntimeError(f"conversation {c}: update refused 20 times")
        async with asyncio.timeout(120):
            return await answered - started

    async def conversation(self, session: aiohttp.ClientSession, c: int, turns: int) -> list[float]:
        return [await self.turn(session, c, f"m{c}-{n}") for n in range(turns)]


@dataclass
class Phase:
    store: str
    workers: int
    routing: str
    conversations: int
    turns: int
    turns_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_turn: float
    db_cpu_ms_per_turn: float | None
    harness_cpu_ms_per_turn: float


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


async def throughput(
    kind: str, n_workers: int, conversations: int, turns: int, routing: str, base: Path
) -> Phase:
    async with contextlib.AsyncExitStack() as stack:
        llm = await stack.enter_async_context(FakeLLM())
        llm.responder = _answer
        telegram = await stack.enter_async_context(FakeTelegram(token=TOKEN))
        backends = None
        if kind == "postgresql":
            store, schema = await stack.enter_async_context(postgres_store())
            backends = BackendCpu(schema)
        else:
            store = str(base / f"sqlite-{n_workers}" / "parley.db")
        workers = []
        for i in range(n_workers):
            port = free_port()
            state = base / f"{kind}-{n_workers}-w{i}"
            config = worker_config(state, store, llm.base_url, telegram.url, port=port, lease=10)
            worker = Worker(f"w{i}", config, port)
            stack.push_async_callback(worker.stop)
            await worker.start()
            workers.append(worker)
        load = Load(telegram, workers, routing)
        stack.push_async_callback(load.answers.close)
        connector = aiohttp.TCPConnector(limit=0)
        session = await stack.enter_async_context(aiohttp.ClientSession(connector=connector))
        await asyncio.gather(*(load.turn(session, c, f"warm{c}") for c in range(conversations)))
        cpu_before = sum(w.cpu() for w in workers)
        if backends is not None:
            await backends.start()
        started, own_before = time.monotonic(), time.process_time()
        runs = await asyncio.gather(
            *(load.conversation(session, c, turns) for c in range(conversations))
        )
        wall, own = time.monotonic() - started, time.process_time() - own_before
        cpu = sum(w.cpu() for w in workers) - cpu_before
        db_cpu = await backends.stop() if backends is not None else None
    latencies = [t for run in runs for t in run]
    return Phase(
        store=kind,
        workers=n_workers,
        routing=routing,
        conversations=conversations,
        turns=len(latencies),
        turns_per_s=len(latencies) / wall,
        p50_ms=statistics.median(latencies) * 1000,
        p99_ms=nearest_rank(latencies, 0.99) * 1000,
        cpu_ms_per_turn=cpu / len(latencies) * 1000,
        db_cpu_ms_per_turn=None if db_cpu is None else db_cpu / len(latencies) * 1000,
        harness_cpu_ms_per_turn=own / len(latencies) * 1000,
    )


# --- failover --------------------------------------------------------------------------------


async def failover(lease: float, reps: int, base: Path) -> list[float]:
    """Seconds from SIGKILL of the polling lease's holder to the answer of a message sent
    right after it, `reps` times."""
    times: list[float] = []
    taken = f"parley: lease telegram:poll:{TOKEN.partition(':')[0]} taken".encode()
    async with contextlib.AsyncExitStack() as stack:
        llm = await stack.enter_async_context(FakeLLM())
        llm.responder = _answer
        telegram = await stack.enter_async_context(FakeTelegram(token=TOKEN))
        store, _ = await stack.enter_async_context(postgres_store())
        workers = []
        for name in ("a", "b"):
            state = base / f"failover-{name}"
            config = worker_config(state, store, llm.base_url, telegram.url, port=None, lease=lease)
            worker = Worker(name, config, None)
            stack.push_async_callback(worker.stop)
            await worker.start()
            if name == "a":
                await worker.until(taken, 60)
            workers.append(worker)
        answers = Answers(telegram)
        stack.push_async_callback(answers.close)
        user = TgUser(900_001, "Failover")
        for rep in range(reps + 1):
            text = f"still there {rep}?"
            answered = answers.expect(user.id, f"pong: {text}")
            if rep == 0:  # a warm-up: the holder answers
                telegram.dm(user, text)
                await asyncio.wait_for(answered, 60)
                continue
            holder = next(w for w in workers if w.err.count(taken) > 0)
            standby = next(w for w in workers if w is not holder)
            await asyncio.sleep(random.uniform(0, lease / 3))  # anywhere in a renewal period
            killed = time.monotonic()
            await holder.kill()
            telegram.dm(user, text)
            times.append(await asyncio.wait_for(answered, 10 * lease + 60) - killed)
            await standby.until(taken, 5)
            await holder.start()  # back as the standby
    return times


# --- report ----------------------------------------------------------------------------------


def table(phases: list[Phase]) -> str:
    rows = [
        "| store | workers | routing | conversations | turns | turns/s | p50 ms | p99 ms "
        "| CPU ms/turn: workers | PostgreSQL | this script |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows += [
        f"| {p.store} | {p.workers} | {p.routing} | {p.conversations} | {p.turns} | "
        f"{p.turns_per_s:.1f} | {p.p50_ms:.0f} | {p.p99_ms:.0f} | {p.cpu_ms_per_turn:.1f} | "
        + ("–" if p.db_cpu_ms_per_turn is None else f"{p.db_cpu_ms_per_turn:.1f}")
        + f" | {p.harness_cpu_ms_per_turn:.1f} |"
        for p in phases
    ]
    return "\n".join(rows)


def median_phase(runs: list[Phase]) -> Phase:
    """Each figure's median over the repetitions of one setup."""
    first = runs[0]
    figures = {
        name: statistics.median(getattr(r, name) for r in runs)
        for name in (
            "turns_per_s",
            "p50_ms",
            "p99_ms",
            "cpu_ms_per_turn",
            "harness_cpu_ms_per_turn",
        )
    }
    db = [r.db_cpu_ms_per_turn for r in runs if r.db_cpu_ms_per_turn is not None]
    return Phase(
        store=first.store,
        workers=first.workers,
        routing=first.routing,
        conversations=first.conversations,
        turns=first.turns,
        db_cpu_ms_per_turn=statistics.median(db) if db else None,
        **figures,
    )


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"cpus": os.cpu_count(), "reps": args.reps}
    with tempfile.TemporaryDirectory(prefix="parley-scale-") as tmp:
        if not args.skip_throughput:
            setups = [("sqlite", 1, "sticky")] + [
                ("postgresql", n, args.routing) for n in args.workers
            ]
            runs: dict[tuple[str, int, str], list[Phase]] = {setup: [] for setup in setups}
            for rep in range(args.reps):  # interleaved: the machine's noise spreads over all
                for kind, n, routing in setups:
                    base = Path(tmp) / f"rep{rep}"
                    phase = await throughput(kind, n, args.conversations, args.turns, routing, base)
                    runs[(kind, n, routing)].append(phase)
                    if args.verbose:
                        print(table([phase]), flush=True)
            phases = [median_phase(runs[setup]) for setup in setups]
            print(table(phases))
            spread = "; ".join(
                f"{k} ×{n}: {min(p.turns_per_s for p in r):.1f}–{max(p.turns_per_s for p in r):.1f}"
                for (k, n, _), r in runs.items()
            )
            print(f"\nturns/s range over {args.reps} rep(s): {spread}")
            results["throughput"] = {
                "median": [asdict(p) for p in phases],
                "runs": [asdict(p) for r in runs.values() for p in r],
            }
        base = Path(tmp)
        if not args.skip_failover:
            times = await failover(args.lease_seconds, args.failover_reps, base)
            print(
                f"\n| failover | lease_seconds | reps | median s | min s | max s |\n"
                f"|---|---:|---:|---:|---:|---:|\n"
                f"| kill -9 the Telegram poller → first answer by another worker | "
                f"{args.lease_seconds:g} | {len(times)} | {statistics.median(times):.2f} | "
                f"{min(times):.2f} | {max(times):.2f} |"
            )
            results["failover"] = {"lease_seconds": args.lease_seconds, "seconds": times}
    return results


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: small and short")
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--turns", type=int, default=5, help="measured turns per conversation")
    parser.add_argument("--reps", type=int, default=1, help="repetitions (medians reported)")
    parser.add_argument("--workers", default="1,2,4", help="PostgreSQL worker counts")
    parser.add_argument("--routing", choices=("sticky", "random"), default="sticky")
    parser.add_argument("--lease-seconds", type=float, default=10.0)
    parser.add_argument("--failover-reps", type=int, default=3)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-failover", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="print the table after each phase")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    args.workers = [int(n) for n in str(args.workers).split(",") if n]
    if args.quick:
        args.conversations, args.turns, args.workers = 10, 2, [1]
        args.lease_seconds, args.failover_reps = 2.0, 1
    return args


if __name__ == "__main__":
    arguments = parse_args()
    figures = asyncio.run(main(arguments))
    if arguments.json:
        arguments.json.write_text(json.dumps(figures, indent=2))
