"""A canary API key and bot token put through every failure path, as an attacker (or a
careless gateway) would: the provider answers 401, 400, 403 and 500 with the key echoed
raw, URL-quoted, base64 and JSON-escaped (`Fault.echo_key`), or sends it in a stream
error; a chat platform refuses a post with the bot token in its error text. Whatever
Parley prints, logs, stores or posts then holds `[redacted:NAME]` and no spelling of the
secret. The leak check is the test's own (it decodes what looks like base64 itself), not
the code under test's list of spellings."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
import signal
import sqlite3
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest

from core.errors import ProviderAuthError
from core.secrets import SecretRegistry, scrub
from tests.channels.test_stored_before_ack import ALICE, parley_run
from tests.fakes.llm import FakeLLM, Fault, RecordedRequest, Reply
from tests.fakes.telegram import FakeTelegram
from tests.process import child_env, fake_llm_config, parley, start_parley, telegram_run_config

CANARY = 'sk-canary-Zq8/x+Y"w\\Tv=3&Pk_9LmN0pQ'  # `"` and `\` so JSON escaping shows
TOKEN = "123456789:AAF-canary_tg_token-Wx7Yz0123456789abcd"
KEY_NAME = "OPENAI_API_KEY"
PIECE = 12  # a run of this many characters of a secret is a leak (a key cut short)
BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{16,}")


def leaks(text: str | bytes, secret: str = CANARY) -> list[str]:
    """The spellings of `secret` found in `text` (empty: none): whole or a piece of it,
    in any case, quoted, escaped, hex or base64."""
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    spellings = {
        "raw": secret,
        "url-quoted": quote(secret, safe=""),
        "url-quoted path": quote(secret),
        "quote_plus": quote_plus(secret),
        "json-escaped": json.dumps(secret)[1:-1],
        "hex": secret.encode().hex(),
        "upper-case hex": secret.encode().hex().upper(),
    }
    found = [name for name, spelling in spellings.items() if spelling in text]
    pieces = {secret[i : i + PIECE] for i in range(len(secret) - PIECE + 1)}
    lower = text.lower()  # PTB rewords Telegram's errors in lower case
    if any(piece.lower() in lower for piece in pieces):
        found.append("a piece")
    if _in_base64(text, {p.encode() for p in pieces}):
        found.append("base64")
    return found


def _in_base64(text: str, pieces: set[bytes]) -> bool:
    """Whether a base64 run of `text` (standard or URL-safe, read from any of its first
    four characters) decodes to bytes holding one of `pieces`."""
    for run in BASE64_RUN.findall(text):
        run = run.replace("-", "+").replace("_", "/")
        for start in range(4):
            chunk = run[start:]
            try:
                decoded = base64.b64decode(chunk[: len(chunk) // 4 * 4])
            except binascii.Error:
                continue
            if any(piece in decoded for piece in pieces):
                return True
    return False


def test_the_leak_check_sees_every_spelling() -> None:
    """The checker itself must catch what the fake echoes (else the tests prove nothing)."""
    line = f"authorization: Bearer {CANARY}".encode()
    for text in (
        CANARY,
        quote(CANARY, safe=""),
        json.dumps({"authorization": CANARY}),
        base64.b64encode(line).decode(),
        base64.urlsafe_b64encode(b"xy" + line).decode(),
        "cut: " + CANARY[:PIECE],
    ):
        assert leaks(f"error ({text}) end"), text
    assert not leaks("HTTP 401: bad key [redacted:OPENAI_API_KEY]")


def canary_config(base_url: str, state: Path) -> str:
    """`fake_llm_config` whose provider sends `$OPENAI_API_KEY` and retries once."""
    return with_key(fake_llm_config(base_url, state))


def with_key(config: str) -> str:
    """config.toml text whose fake provider sends `$OPENAI_API_KEY` and retries once."""
    provider = 'model = "fake-model"\n'
    assert provider in config
    return config.replace(provider, f'{provider}api_key_env = "{KEY_NAME}"\nmax_retries = 1\n', 1)


PAD = "x" * 461  # with `Fault.echo_key`, the key then starts 20 characters before the cut
FAULTS = {
    "401": Fault(status=401, message="Incorrect API key provided", echo_key=True),
    "400": Fault(status=400, message="Invalid request", echo_key=True),
    "403": Fault(status=403, message="Forbidden", echo_key=True),
    "500": Fault(status=500, message="Gateway failure", echo_key=True),  # retried once
    "400 cut at 500 characters": Fault(status=400, message=PAD, echo_key=True),
    "stream error": Fault(
        stream_error={
            "message": f"bad key {CANARY} ({base64.b64encode(CANARY.encode()).decode()})",
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }
    ),
}


@pytest.mark.parametrize("case", list(FAULTS))
async def test_chat_m_never_prints_a_key_the_provider_echoes(
    fake_llm: FakeLLM, tmp_path: Path, case: str
) -> None:
    fake_llm.responder = lambda _request: Reply(text="never shown", fault=FAULTS[case])
    config = tmp_path / "config.toml"
    config.write_text(canary_config(fake_llm.base_url, tmp_path))
    env = child_env(OPENAI_API_KEY=CANARY, PARLEY_LOG_LEVEL="debug")
    code, out, err = await parley("--config", str(config), "chat", "-m", "hi", env=env)
    assert code == 1, err
    assert fake_llm.requests[0].headers["authorization"] == f"Bearer {CANARY}"  # it was sent
    assert leaks(out + err) == [], out + err
    assert "[redacted:OPENAI_API" in err  # the marker itself may be cut at 500 characters


def _failed_runs(db: Path) -> int:
    try:
        with sqlite3.connect(db) as conn:
            row = conn.execute("SELECT COUNT(*) FROM runs WHERE state = 'failed'").fetchone()
    except sqlite3.OperationalError:  # not created yet
        return 0
    return int(row[0])


async def test_the_store_events_and_parley_runs_hold_no_echoed_key(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """Two failed runs in `parley chat` (a 401 echoing the key, then a stream error
    carrying it), the process killed before SQLite folds its log into the database: the
    database file and its WAL, the events log, the terminal and `parley runs` hold none
    of it."""
    faults = iter([FAULTS["401"], FAULTS["stream error"]])

    def answer(_request: RecordedRequest) -> Reply:
        return Reply(text="never shown", fault=next(faults))

    fake_llm.responder = answer
    config = tmp_path / "config.toml"
    config.write_text(canary_config(fake_llm.base_url, tmp_path))
    env = child_env(OPENAI_API_KEY=CANARY, PARLEY_LOG_LEVEL="debug")
    proc = await start_parley("--config", str(config), "chat", env=env)
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(b"one\ntwo\n")
    await proc.stdin.drain()
    db = tmp_path / "parley.db"
    out = b""
    async with asyncio.timeout(60):
        while out.count(b"Sorry, that failed") < 2:
            out += await proc.stdout.readline()
        while _failed_runs(db) < 2:
            await asyncio.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # the WAL stays as it is
    rest, err = await proc.communicate()
    out += rest
    wal = db.with_name("parley.db-wal")
    assert wal.exists()
    for name, data in (
        ("terminal", out + err),
        ("parley.db", db.read_bytes()),
        ("parley.db-wal", wal.read_bytes()),
        ("events.jsonl", (tmp_path / "events.jsonl").read_bytes()),
    ):
        assert leaks(data) == [], name
    assert f"[redacted:{KEY_NAME}]".encode() in out
    assert f"[redacted:{KEY_NAME}]".encode() in wal.read_bytes() + db.read_bytes()

    code, listing, list_err = await parley("--config", str(config), "runs", env=env)
    assert code == 0, list_err
    assert leaks(listing + list_err) == []
    with sqlite3.connect(db) as conn:
        run_ids = [r[0] for r in conn.execute("SELECT id FROM runs ORDER BY created_at")]
    shown = ""
    for run_id in run_ids:
        code, text, show_err = await parley(
            "--config", str(config), "runs", "show", run_id, env=env
        )
        assert code == 0, show_err
        shown += text + show_err
    assert leaks(shown) == []
    assert f"[redacted:{KEY_NAME}]" in shown


async def test_parley_runs_show_masks_a_key_stored_before_redaction_existed(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """A store written by an older Parley may hold the key: the terminal masks it."""
    fake_llm.script(Reply(text="fine"))
    config = tmp_path / "config.toml"
    config.write_text(canary_config(fake_llm.base_url, tmp_path))
    env = child_env(OPENAI_API_KEY=CANARY)
    code, _, err = await parley("--config", str(config), "chat", env=env, stdin=b"hello\n")
    assert code == 0, err
    db = tmp_path / "parley.db"
    with sqlite3.connect(db) as conn:
        run_id = conn.execute("SELECT id FROM runs").fetchone()[0]
        conn.execute("UPDATE runs SET text = ? WHERE id = ?", (f"old leak: {CANARY}", run_id))
    code, shown, err = await parley("--config", str(config), "runs", "show", run_id, env=env)
    assert code == 0, err
    assert leaks(shown + err) == []
    assert f"old leak: [redacted:{KEY_NAME}]" in shown


def _telegram_config(tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram) -> Path:
    config = telegram_run_config(tmp_path, fake_llm.base_url, telegram.url, ALICE.id)
    config.write_text(with_key(config.read_text()))
    return config


def _everything_telegram_got(telegram: FakeTelegram) -> str:
    return json.dumps([c.params for c in telegram.calls], default=str)


async def test_a_key_echoed_in_a_provider_error_is_not_posted_to_the_chat(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = lambda _request: Reply(text="never shown", fault=FAULTS["403"])
    async with FakeTelegram(token=TOKEN) as telegram:
        config = _telegram_config(tmp_path, fake_llm, telegram)
        env = child_env(TELEGRAM_BOT_TOKEN=TOKEN, OPENAI_API_KEY=CANARY)
        async with parley_run(config, env) as running:
            telegram.dm(ALICE, "hi")
            await telegram.wait_until(
                lambda: any("Sorry, that failed" in t for t in telegram.texts(ALICE.id)),
                timeout=30,
                what="the failure notice",
            )
            await running.stop()
        posted = _everything_telegram_got(telegram)
    assert leaks(posted) == [], posted
    assert any(f"[redacted:{KEY_NAME}]" in t for t in telegram.texts(ALICE.id))
    assert leaks(bytes(running.err)) == []
    assert leaks((tmp_path / "parley.db").read_bytes()) == []


async def test_a_bot_token_echoed_by_the_chat_platform_is_not_logged_or_stored(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """Telegram refuses the answer with an error text that holds the bot token (as a
    proxy in front of it may): the refusal, its traceback and the events carry
    `[redacted:TELEGRAM_BOT_TOKEN]`, never the token."""
    fake_llm.script(Reply(text="the answer"))
    async with FakeTelegram(token=TOKEN) as telegram:
        telegram.fail_next(
            "sendMessage", 400, times=10, description=f"Bad Request: no chat for /bot{TOKEN}/"
        )
        config = _telegram_config(tmp_path, fake_llm, telegram)
        env = child_env(TELEGRAM_BOT_TOKEN=TOKEN, OPENAI_API_KEY=CANARY)
        async with parley_run(config, env) as running:
            telegram.dm(ALICE, "hi")
            await running.until(lambda: b"was not delivered" in running.err, "the refusal")
            await running.stop()
    logged = bytes(running.err)
    assert leaks(logged, TOKEN) == [], logged.decode()
    assert b"[redacted:TELEGRAM_BOT_TOKEN]" in logged
    for stored in ("parley.db", "events.jsonl"):
        assert leaks((tmp_path / stored).read_bytes(), TOKEN) == [], stored


# ---- the store's write path, on both backends ------------------------------------------

STORE_CANARY = "store-canary-Kq7Wz2Rt5Yp9"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_no_store_write_path_keeps_a_registered_secret(tmp_path: Path, backend: str) -> None:
    """Queued writes (a run's row, an event), a write that returns rows (a memory) and a
    message: read back, each holds `[redacted:…]`."""
    from core.messages import Message
    from core.secrets import SECRETS
    from core.store import Scope
    from tests.store.conftest import BACKENDS

    SECRETS.add("STORE_CANARY", STORE_CANARY)
    said = f"echo {STORE_CANARY} {quote(STORE_CANARY)} {json.dumps({'k': STORE_CANARY})}"
    async with BACKENDS[backend](tmp_path) as reopen:
        store = await reopen()
        try:
            await store.create_run("r1", "test:c1:", "user")
            ending = {"state": "failed", "reason": "failed", "iterations": 1}
            store.finish_run("r1", text=said, input_tokens=0, output_tokens=0, **ending)
            where = {"run_id": "r1", "conv": "test:c1:", "iteration": 1, "at": 1.0}
            store.add_event("agent_run.failed", {"failure": said}, **where)
            store.save_messages("test:c1:", [Message.user(said)])
            memory = await store.remember(Scope("team", "test"), said, made_by="u", conv="c")
            await store.flush()
            run = await store.run("r1")
            events = await store.events("r1")
            messages = await store.load_messages("test:c1:")
        finally:
            await store.aclose()
    texts = [run.text if run else "", json.dumps(events), messages[0].content, memory.text]
    for text in texts:
        assert leaks(text, STORE_CANARY) == [], text
        assert "[redacted:STORE_CANARY]" in text


# ---- the registry itself ---------------------------------------------------------------


def test_every_alignment_of_base64_and_every_escape_is_found() -> None:
    registry = SecretRegistry()
    registry.add(KEY_NAME, CANARY)
    for lead in range(6):
        line = ("h" * lead + f"Bearer {CANARY};").encode()
        for encoded in (base64.b64encode(line), base64.urlsafe_b64encode(line)):
            assert leaks(registry.scrub(f"[{encoded.decode()}]")) == [], lead
    hexed = CANARY.encode().hex()
    for spelling in (
        quote(CANARY),
        quote_plus(CANARY),
        json.dumps(json.dumps(CANARY)),
        CANARY.upper(),
        hexed,
        hexed.upper(),
    ):
        assert registry.scrub(spelling).count(f"[redacted:{KEY_NAME}]") == 1, spelling


def test_clean_text_comes_back_untouched_and_short_values_are_not_secrets() -> None:
    registry = SecretRegistry()
    registry.add("SHORT", "abc1234")  # under 8 characters: would mask ordinary words
    assert registry.names() == []
    registry.add("LONG_ONE", "correct-horse-battery")
    text = "nothing to see here " * 40  # long text: the `in` path
    assert registry.scrub(text) is text
    assert registry.scrub("tiny") == "tiny"
    long_hit = text + "correct-horse-battery"
    assert registry.scrub(long_hit).endswith("[redacted:LONG_ONE]")


def test_an_error_made_with_a_registered_secret_carries_only_its_name() -> None:
    from core.secrets import SECRETS

    SECRETS.add("PARLEY_TEST_CANARY", "canary-in-an-error-9f8e7d")
    error = ProviderAuthError(
        "HTTP 401: canary-in-an-error-9f8e7d", code="canary-in-an-error-9f8e7d"
    )
    assert str(error) == "HTTP 401: [redacted:PARLEY_TEST_CANARY]"
    assert error.code == "[redacted:PARLEY_TEST_CANARY]"
    assert scrub("x canary-in-an-error-9f8e7d") == "x [redacted:PARLEY_TEST_CANARY]"
