"""The trigger route of one `parley run` (SQLite) as a sender that gets things wrong, an
attacker, or an unlucky operator meets it (docs/triggers.md): forged and replayed
deliveries, oversized bodies, one delivery id under two triggers, `deliver_only`, a burst
on one thread key, the rate limit, ignored events, and a SIGKILL right after the 202.
Real HTTP to a real process, the fake Slack and the fake LLM; the store read afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from core.audit import read_rows
from core.store import open_store
from tests.channels.test_stored_before_ack import stored_runs
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply
from tests.fakes.slack import FakeSlack, Posted
from tests.process import child_env
from tests.process import parley as parley_cli
from tests.triggers.hookkit import (
    CI_TRIGGER,
    SECRET,
    STD_SECRET,
    accepted_in_order,
    check_run,
    counted,
    deliver,
    serving,
    signed,
    stored_deliveries,
    within_one_minute,
)

HEADER = "[ci] acme/widgets#abc123"
UNAUTHORIZED = {"outcome": "unauthorized", "detail": "unauthorized"}
STD_TRIGGER = """
[triggers.std]
source = "standard"
secret_env = "STD_WEBHOOK_SECRET"
channel = "slack:C2"
deliver_only = true
message = "build {data.id} failed"
"""
NOTIFY_TRIGGER = """
[triggers.notify]
source = "github"
secret_env = "GITHUB_WEBHOOK_SECRET"
events = ["check_run"]
channel = "slack:C1"
thread_by = "{repository.full_name}#{check_run.head_sha}"
deliver_only = true
message = "{check_run.name} failed on {repository.full_name}"
"""


def _answer(request: RecordedRequest) -> Reply:
    users = [m for m in request.json["messages"] if m["role"] == "user"]
    return Reply(text=f"looked at {len(users)} message(s)")


def _delivery_of(request: RecordedRequest) -> str:
    """The delivery id a run's request is about (the last user message names it)."""
    users = [m["content"] for m in request.json["messages"] if m["role"] == "user"]
    found = re.search(r"delivery `([^`]+)`", users[-1])
    assert found is not None, users[-1]
    return found[1]


def _headers(slack: FakeSlack) -> list[Posted]:
    return [m for m in slack.live_messages() if m.text.startswith("[")]


def _answers(slack: FakeSlack) -> list[Posted]:
    return [m for m in slack.live_messages() if m.text.startswith("looked at")]


# ---- 1. refusals ------------------------------------------------------------------------


async def test_forged_expired_and_replayed_deliveries_get_a_bare_401_counted_and_audited(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _answer
    triggers = CI_TRIGGER + STD_TRIGGER
    event = {"type": "build.failed", "data": {"id": "b1"}}
    async with (
        FakeSlack() as slack,
        serving(tmp_path, fake_llm.base_url, slack, triggers) as (
            parley,
            url,
        ),
    ):
        # captured on the wire: genuine, signed 296 s ago, so still inside its 5-minute window
        captured = signed(
            event, source="standard", secret=STD_SECRET, delivery="msg_1", now=time.time() - 296
        )
        first = await deliver(url, "std", *captured)
        assert (first.status_code, first.json()["outcome"]) == (202, "accepted")

        refused: list[httpx.Response] = []
        body, headers = signed(check_run(), delivery="forged-body")
        tampered = body.replace(b'"failure"', b'"success"')
        assert tampered != body
        refused.append(await deliver(url, "ci", tampered, headers))  # signature of another body
        guessed = signed(check_run(), secret="It's a Secret to Everybody", delivery="forged-key")
        refused.append(await deliver(url, "ci", *guessed))  # signed with a secret not ours
        body, headers = signed(check_run(), delivery="unsigned")
        del headers["X-Hub-Signature-256"]
        refused.append(await deliver(url, "ci", body, headers))  # no signature at all
        stale = signed(
            event, source="standard", secret=STD_SECRET, delivery="msg_2", now=time.time() - 600
        )
        refused.append(await deliver(url, "std", *stale))  # genuine, but signed 10 min ago
        # the captured delivery replayed once its window has passed: not even a "duplicate"
        stamp = int(captured[1]["webhook-timestamp"])
        await asyncio.sleep(max(0.0, stamp + 301.5 - time.time()))
        refused.append(await deliver(url, "std", *captured))

        for response in refused:
            assert response.status_code == 401, response.text
            assert response.json() == UNAUTHORIZED  # no reason: that is for the operator
            assert "retry-after" not in response.headers
        counts = await counted(url)
        assert counts[("ci", "unauthorized")] == 3
        assert counts[("std", "unauthorized")] == 2
        assert counts[("std", "accepted")] == 1
        await parley.until(
            lambda: any(m.text == "build b1 failed" for m in slack.live_messages()),
            "the genuine delivery's message",
        )
        assert await parley.stop() == 0

    # only the genuine delivery is stored; the refused ones left no row
    assert stored_deliveries(tmp_path / "parley.db") == [("std", "msg_1", "accepted")]
    async with await open_store(tmp_path / "parley.db") as store:
        audit = await read_rows(store)
    # audited with the reason, once per trigger in 10 s (a flood is not a flood of writes)
    unauthorized = [row for row in audit if row.kind == "trigger.unauthorized"]
    assert sorted(row.actor for row in unauthorized) == ["trigger:ci", "trigger:std"]
    why = {row.actor: str(row.detail.get("why", "")) for row in unauthorized}
    assert why["trigger:ci"], "the audit keeps the refusal's reason"
    assert "replay window" in why["trigger:std"]
    assert fake_llm.requests == []


# ---- 2. body size -----------------------------------------------------------------------

FLOOD = 50 * 2**20  # bytes a sender offers
CHUNK = b"[" * 65_536

SMALL_CI = CI_TRIGGER + "max_body_bytes = 1000\n"
JSON = {"Content-Type": "application/json"}


async def _post_head(url: str, length: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection that has sent a delivery's request head (`length`: its
    Content-Length or Transfer-Encoding line) and no body yet."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"POST /hooks/ci HTTP/1.1\r\nHost: parley\r\n{length}\r\n".encode()
        + b"Content-Type: application/json\r\n\r\n"
    )
    await writer.drain()
    return reader, writer


async def _chunks(size: int) -> AsyncIterator[bytes]:
    """`size` bytes of body, sent chunked (an async iterator: httpx sends no length)."""
    yield b"[" * (size // 2)
    yield b"[" * (size - size // 2)


async def _push(writer: asyncio.StreamWriter, size: int) -> int:
    """Write up to `size` bytes of body; how many the connection took before it broke."""
    sent = 0
    try:
        while sent < size:
            writer.write(CHUNK)
            await writer.drain()
            sent += len(CHUNK)
    except ConnectionError:
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return sent


async def test_an_announced_oversized_body_is_refused_before_it_is_sent_and_the_process_stays_up(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _answer
    async with (
        FakeSlack() as slack,
        serving(tmp_path, fake_llm.base_url, slack, SMALL_CI) as (parley, url),
    ):
        # 50 MB announced by Content-Length: the 413 comes before a byte of it is sent
        reader, writer = await _post_head(url, f"Content-Length: {FLOOD}")
        head = await reader.readuntil(b"\r\n\r\n")
        writer.close()
        await writer.wait_closed()
        assert head.startswith(b"HTTP/1.1 413 "), head
        # chunked, no Content-Length, a little over the limit
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            chunked = await client.post(f"{url}/hooks/ci", content=_chunks(1001), headers=JSON)
        assert "content-length" not in chunked.request.headers
        assert (chunked.status_code, chunked.json()["outcome"]) == (413, "too_large")

        assert (await counted(url))[("ci", "too_large")] == 2
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            health = await client.get(f"{url}/healthz")
        assert (health.status_code, health.json()) == (200, {"ok": True})
        # and the trigger still takes a delivery within its limit
        fine = await deliver(url, "ci", *signed(check_run(), delivery="small"))
        assert (fine.status_code, fine.json()["outcome"]) == (202, "accepted")
        await parley.until(lambda: _answers(slack), "the answer to the small delivery")
    assert stored_deliveries(tmp_path / "parley.db") == [("ci", "small", "accepted")]


async def test_an_oversized_body_is_not_read_to_its_end_whether_announced_or_chunked(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with (
        FakeSlack() as slack,
        serving(tmp_path, fake_llm.base_url, slack, SMALL_CI) as (_, url),
    ):
        # announced, answered 413 at once, and the sender sends its 50 MB all the same
        reader, writer = await _post_head(url, f"Content-Length: {FLOOD}")
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 413 ")
        pushed = await _push(writer, FLOOD)
        # chunked: 50 MB offered; the server answers 413 at the limit and closes
        offered = 0

        async def flood() -> AsyncIterator[bytes]:
            nonlocal offered
            while offered < FLOOD:
                offered += len(CHUNK)
                yield CHUNK

        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            try:
                chunked = await client.post(f"{url}/hooks/ci", content=flood(), headers=JSON)
            except httpx.TransportError:  # closed under the sender: no answer to read
                pass
            else:
                assert chunked.status_code == 413
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            assert (await client.get(f"{url}/healthz")).status_code == 200
    taken = {"announced, sent after the 413": pushed, "chunked": offered}
    assert all(n < FLOOD // 5 for n in taken.values()), f"bytes the server took: {taken}"


# ---- 3. one delivery id, two triggers ---------------------------------------------------


async def test_one_delivery_sent_to_two_triggers_is_two_runs_and_each_redelivery_a_duplicate(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _answer
    second = CI_TRIGGER.replace("[triggers.ci]", "[triggers.ci2]").replace("slack:C1", "slack:C2")
    async with (
        FakeSlack() as slack,
        serving(tmp_path, fake_llm.base_url, slack, CI_TRIGGER + second) as (parley, url),
    ):
        body, headers = signed(check_run(), delivery="shared-id")
        to_ci, to_ci2 = (
            await deliver(url, "ci", body, headers),
            await deliver(url, "ci2", body, headers),
        )
        assert (to_ci.status_code, to_ci.json()["outcome"]) == (202, "accepted")
        assert (to_ci2.status_code, to_ci2.json()["outcome"]) == (202, "accepted")
        await parley.until(lambda: len(_answers(slack)) >= 2, "an answer for each trigger")
        for name in ("ci", "ci2"):
            again = await deliver(url, name, body, headers)
            assert (again.status_code, again.json()["outcome"]) == (200, "duplicate")
        assert await parley.stop() == 0

    headers_posted = {(m.channel, m.text) for m in _headers(slack)}
    assert headers_posted == {("C1", HEADER), ("C2", "[ci2] acme/widgets#abc123")}
    for channel in ("C1", "C2"):
        (header,) = [m for m in _headers(slack) if m.channel == channel]
        assert [m.text for m in slack.thread(channel, header.ts)] == ["looked at 1 message(s)"]
    assert stored_deliveries(tmp_path / "parley.db") == [
        ("ci", "shared-id", "accepted"),
        ("ci2", "shared-id", "accepted"),
    ]
    assert sorted(stored_runs(tmp_path / "parley.db")) == [("completed", "trigger")] * 2
    assert len(fake_llm.requests) == 2


# ---- 4. deliver_only --------------------------------------------------------------------


async def test_deliver_only_posts_its_message_under_the_header_without_asking_the_model(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _answer
    async with (
        FakeSlack() as slack,
        serving(tmp_path, fake_llm.base_url, slack, NOTIFY_TRIGGER) as (parley, url),
    ):
        # the payload may say anything: Slack markup in it is shown, not obeyed
        reply = await deliver(url, "notify", *signed(check_run(name="<!channel> lint")))
        assert (reply.status_code, reply.json()["outcome"]) == (202, "accepted")
        wanted = "&lt;!channel&gt; lint failed on acme/widgets"
        await parley.until(
            lambda: any(m.text == wanted for m in slack.live_messages()), "the message"
        )
        assert await parley.stop() == 0

    (header,) = _headers(slack)
    assert (header.channel, header.text, header.thread_ts) == (
        "C1",
        "[notify] acme/widgets#abc123",
        None,
    )
    assert [m.text for m in slack.thread("C1", header.ts)] == [wanted]
    assert sorted(m.text for m in slack.live_messages()) == sorted([header.text, wanted])
    assert stored_runs(tmp_path / "parley.db") == [("completed", "post")]
    assert fake_llm.requests == []


# ---- 5. a burst on one thread key -------------------------------------------------------


class SlowModel:
    """The fake LLM's responder: answers after 0.3 s, naming the delivery it answers and
    how many user messages it saw; it counts the requests in flight at once."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most_in_flight = 0

    async def __call__(self, request: RecordedRequest) -> Reply:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.3)
        finally:
            self.in_flight -= 1
        users = [m for m in request.json["messages"] if m["role"] == "user"]
        return Reply(text=f"{_delivery_of(request)}: looked at {len(users)} message(s)")


async def test_a_burst_on_one_thread_key_is_one_thread_answered_in_order_one_run_at_a_time(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = model = SlowModel()
    ids = [f"burst-{n}" for n in range(5)]
    async with (
        FakeSlack() as slack,
        serving(tmp_path, fake_llm.base_url, slack) as (
            parley,
            url,
        ),
    ):
        replies = await asyncio.gather(
            *(
                deliver(url, "ci", *signed(check_run(name=f"job {n}"), delivery=d))
                for n, d in enumerate(ids)
            )
        )
        assert [(r.status_code, r.json()["outcome"]) for r in replies] == [(202, "accepted")] * 5
        await parley.until(
            lambda: len([m for m in slack.live_messages() if "looked at" in m.text]) >= 5,
            "five answers",
        )
        assert await parley.stop() == 0

    accepted = accepted_in_order(tmp_path / "parley.db")  # the order the store took them in
    assert sorted(accepted) == ids

    (header,) = _headers(slack)
    assert header.text == HEADER
    in_thread = [m.text for m in slack.thread("C1", header.ts)]
    assert in_thread == [f"{d}: looked at {n + 1} message(s)" for n, d in enumerate(accepted)]
    # one conversation: each run saw every earlier one
    assert [_delivery_of(r) for r in fake_llm.requests] == accepted
    assert model.most_in_flight == 1, "two runs of one conversation overlapped"


# ---- 6. the rate limit ------------------------------------------------------------------


async def test_the_fourth_delivery_in_a_minute_is_429_and_forged_ones_do_not_use_the_budget(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _answer
    async with (
        FakeSlack() as slack,
        serving(tmp_path, fake_llm.base_url, slack, CI_TRIGGER + "rate_per_minute = 3\n") as (
            parley,
            url,
        ),
    ):
        await within_one_minute()
        # whoever lacks the secret cannot spend the sender's budget
        for n in range(5):
            forged = signed(check_run(), secret="guess", delivery=f"forged-{n}")
            assert (await deliver(url, "ci", *forged)).status_code == 401
        outcomes = []
        for n in range(4):
            reply = await deliver(url, "ci", *signed(check_run(sha=f"s{n}"), delivery=f"d{n}"))
            outcomes.append((reply.status_code, reply.json()["outcome"]))
        assert outcomes == [(202, "accepted")] * 3 + [(429, "rate_limited")]
        assert 1 <= int(reply.headers["Retry-After"]) <= 60
        counts = await counted(url)
        assert counts[("ci", "rate_limited")] == 1
        assert counts[("ci", "accepted")] == 3
        await parley.until(lambda: len(_answers(slack)) >= 3, "three answers")
    assert [d for _, d, _ in stored_deliveries(tmp_path / "parley.db")] == ["d0", "d1", "d2"]


# ---- 7. ignored deliveries --------------------------------------------------------------


async def test_an_event_not_listened_for_or_failing_the_filter_is_ignored_and_recorded(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _answer
    async with FakeSlack() as slack, serving(tmp_path, fake_llm.base_url, slack) as (parley, url):
        push = signed({"ref": "refs/heads/main"}, delivery="push-1", event="push")
        green = signed(check_run(conclusion="success"), delivery="green-1")
        for sent in (push, green):
            reply = await deliver(url, "ci", *sent)
            assert (reply.status_code, reply.json()["outcome"]) == (202, "ignored")
        again = await deliver(url, "ci", *push)  # a redelivery of an ignored one
        assert (again.status_code, again.json()["outcome"]) == (200, "duplicate")
        assert (await counted(url))[("ci", "ignored")] == 2
        config = tmp_path / "config.toml"
        code, out, err = await parley_cli(
            "--config", str(config), "triggers", "list", env=child_env(GITHUB_WEBHOOK_SECRET=SECRET)
        )
        assert code == 0, err
        (row,) = [line for line in out.splitlines() if line.startswith("ci ")]
        assert row.split()[-1] == "ignored"
        assert await parley.stop() == 0
    assert stored_deliveries(tmp_path / "parley.db") == [
        ("ci", "green-1", "ignored"),
        ("ci", "push-1", "ignored"),
    ]
    assert stored_runs(tmp_path / "parley.db") == []
    assert fake_llm.requests == []
    assert not list(slack.live_messages())


# ---- 8. SIGKILL right after the 202 -----------------------------------------------------


async def test_a_delivery_acknowledged_just_before_a_kill_runs_once_after_the_restart(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _answer
    db = tmp_path / "parley.db"
    body, headers = signed(check_run(), delivery="before-kill")
    async with FakeSlack() as slack:
        # the header post (the run's first step, before its model call) is slow to reach
        # Slack: the kill lands between the 202 and anything the run shows
        slack.delays["chat.postMessage"] = 2.0
        async with serving(tmp_path, fake_llm.base_url, slack) as (parley, url):
            reply = await deliver(url, "ci", body, headers)
            assert (reply.status_code, reply.json()["outcome"]) == (202, "accepted")
            on_its_way = await slack.wait_for(
                "chat.postMessage", where=lambda c: c.params.get("text") == HEADER
            )
            # that post never reaches Slack: the process dies with it
            slack.fail_next("chat.postMessage", 500, where=lambda p: p is on_its_way[0].params)
            await parley.kill()
            assert fake_llm.requests == []
        del slack.delays["chat.postMessage"]
        assert stored_runs(db) == [("running", "trigger")]  # claimed, not begun

        async with serving(tmp_path, fake_llm.base_url, slack) as (parley, url):
            await parley.until(lambda: _answers(slack), "the answer after the restart")
            again = await deliver(url, "ci", body, headers)
            assert (again.status_code, again.json()["outcome"]) == (200, "duplicate")
            assert await parley.stop() == 0

    (header,) = _headers(slack)
    assert header.text == HEADER
    assert [m.text for m in slack.thread("C1", header.ts)] == ["looked at 1 message(s)"]
    assert len(list(slack.live_messages())) == 2
    assert stored_runs(db) == [("completed", "trigger")]
    assert len(fake_llm.requests) == 1


# ---- the events log ---------------------------------------------------------------------


async def test_every_delivery_taken_in_is_a_trigger_delivery_line_of_the_events_log(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _answer
    async with FakeSlack() as slack, serving(tmp_path, fake_llm.base_url, slack) as (parley, url):
        accepted = await deliver(url, "ci", *signed(check_run(), delivery="logged-1"))
        ignored = await deliver(url, "ci", *signed({}, delivery="logged-2", event="push"))
        assert [accepted.status_code, ignored.status_code] == [202, 202]
        await parley.until(lambda: _answers(slack), "the answer")
        assert await parley.stop() == 0
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    logged = {
        r["delivery"]: (r["event"], r.get("event_type"))
        for r in records
        if r.get("trigger") == "ci" and "delivery" in r
    }
    assert logged == {
        "logged-1": ("trigger.delivery", "check_run"),
        "logged-2": ("trigger.delivery", "push"),
    }
