"""A PagerDuty trigger that posts into a Telegram group (docs/triggers.md): real HTTP to a
running `parley run`, the fake Telegram. `deliver_only` posts its message with no model
call; the incident's posts form a reply chain under the header; a person's reply to the
header talks to the incident's conversation, which holds what was posted; `close_on`
posts the closing line and the next incident of the key opens a new chain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.channels.test_stored_before_ack import ALICE, TELEGRAM_TOKEN, free_port, parley_run
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply
from tests.fakes.telegram import FakeTelegram
from tests.process import child_env, telegram_run_config
from tests.triggers.hookkit import deliver, signed

GROUP = -100123
SECRET = "pd-secret"


def _incident(event_type: str, incident: str = "PT4KHLK") -> dict[str, Any]:
    return {
        "event": {
            "id": f"ev-{event_type}-{incident}",
            "event_type": event_type,
            "data": {
                "id": incident,
                "title": "checkout-api p99 above 2 s",
                "urgency": "high",
                "priority": {"summary": "P1"},
            },
        }
    }


def _remembers(request: RecordedRequest) -> Reply:
    said = [m["content"] for m in request.json["messages"] if m["role"] == "assistant"]
    return Reply(text=f"I see {len(said)} earlier post(s): {json.dumps(said)}")


async def test_an_incident_is_one_reply_chain_in_a_telegram_group(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _remembers
    port = free_port()
    async with FakeTelegram(token=TELEGRAM_TOKEN) as telegram:
        telegram.add_chat(GROUP)
        config = telegram_run_config(
            tmp_path,
            fake_llm.base_url,
            telegram.url,
            ALICE.id,
            f"""
            allow_channels = ["{GROUP}"]
            [server]
            listen = "127.0.0.1:{port}"
            [triggers.oncall]
            source = "pagerduty"
            secret_env = "PAGERDUTY_WEBHOOK_SECRET"
            events = ["incident.triggered", "incident.acknowledged", "incident.resolved"]
            channel = "telegram:{GROUP}"
            thread_by = "{{event.data.id}}"
            close_on = "event.event_type == 'incident.resolved'"
            deliver_only = true
            message = "{{event.data.priority.summary}} {{event.data.title}} ({{event.event_type}})"
            """,
        )
        env = child_env(TELEGRAM_BOT_TOKEN=TELEGRAM_TOKEN, PAGERDUTY_WEBHOOK_SECRET=SECRET)
        url = f"http://127.0.0.1:{port}"
        async with parley_run(config, env) as parley:

            def chain() -> list[dict[str, Any]]:
                return telegram.bot_messages(GROUP)

            async def send(event_type: str, incident: str = "PT4KHLK") -> None:
                body, headers = signed(
                    _incident(event_type, incident), source="pagerduty", secret=SECRET
                )
                answer = await deliver(url, "oncall", body, headers)
                assert answer.status_code == 202, answer.text

            await send("incident.triggered")
            await parley.until(lambda: len(chain()) == 2, "the header and the message")
            header, triggered = chain()
            assert header["text"] == "[oncall] PT4KHLK"
            assert "reply_to_message" not in header
            assert triggered["text"] == "P1 checkout-api p99 above 2 s (incident.triggered)"
            assert triggered["reply_to_message"]["message_id"] == header["message_id"]
            await send("incident.acknowledged")
            await parley.until(lambda: len(chain()) == 3, "the second message")
            assert chain()[2]["reply_to_message"]["message_id"] == header["message_id"]
            assert fake_llm.requests == []  # deliver_only: the model is never called

            # Alice replies to the header: the incident's conversation, with its posts
            telegram.group_message(GROUP, ALICE, "who is on it?", reply_to=header["message_id"])
            await parley.until(lambda: len(chain()) == 4, "the answer to Alice")
            assert chain()[3]["text"].startswith("I see 2 earlier post(s)")
            assert "incident.acknowledged" in chain()[3]["text"]

            await send("incident.resolved")
            await parley.until(
                lambda: any(m["text"] == "Closed: PT4KHLK" for m in chain()), "the closing line"
            )
            closing = next(m for m in chain() if m["text"] == "Closed: PT4KHLK")
            assert closing["reply_to_message"]["message_id"] == header["message_id"]
            await send("incident.triggered")  # the same id again: a new chain
            await parley.until(
                lambda: sum(m["text"] == "[oncall] PT4KHLK" for m in chain()) == 2,
                "a new header",
            )
