"""What people write reaches the agent as Markdown: Telegram entities, Slack mrkdwn and
`<…>` tokens, Discord mention ids (`channels.inbound`), unit by unit and end to end
through each real platform library against its fake."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from telegram import MessageEntity, User

from channels import discord_api
from channels.inbound import (
    discord_markdown,
    markdown_link,
    slack_markdown,
    slack_user_ids,
    telegram_markdown,
)
from core.chat import ApprovalRequest, Inbound, Responder
from tests.channels.test_discord import discord_channel
from tests.channels.test_slack import slack_channel
from tests.channels.test_telegram import ALICE, BOB, GROUP, telegram
from tests.fakes.discord import (
    BOT_THREAD_ID,
    CAROL,
    CHANNEL_ID,
    ONCALL_ROLE_ID,
    USER,
    FakeDiscord,
)
from tests.fakes.slack import BOT_USER_ID, FakeSlack
from tests.fakes.telegram import BOT, FakeTelegram, TgUser, formatted

# ---- a stand-in agent ------------------------------------------------------------------------


@dataclass
class Recorder:
    """An AgentPort that records what it is handed and answers nothing."""

    inbounds: list[Inbound] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def submit(self, inbound: Inbound, responder: Responder) -> bool:
        self.inbounds.append(inbound)
        self.changed.set()
        return True

    async def answer_approval(
        self, request_id: str, allow: bool, user_name: str
    ) -> ApprovalRequest | None:
        return None  # no approvals here

    async def texts(self, count: int) -> list[str]:
        """The texts of the first `count` messages, once there are that many."""
        async with asyncio.timeout(10):
            while len(self.inbounds) < count:
                self.changed.clear()
                await self.changed.wait()
        return [i.text for i in self.inbounds]


# ---- Telegram entities ---------------------------------------------------------------------


def entity(kind: str, offset: int, length: int, **extra: object) -> MessageEntity:
    return MessageEntity(kind, offset, length, **extra)  # type: ignore[arg-type]


def test_telegram_inline_entities_become_markdown() -> None:
    text = "run ls -la then read the docs, bold and italic, old, under"
    entities = [
        entity("code", 4, 6),
        entity("text_link", 25, 4, url="https://example.com/guide"),
        entity("bold", 31, 15),
        entity("italic", 40, 6),
        entity("strikethrough", 48, 3),
        entity("underline", 53, 5),
    ]
    assert telegram_markdown(text, entities) == (
        "run `ls -la` then read the [docs](https://example.com/guide), **bold and *italic***,"
        " ~~old~~, under"
    )


def test_telegram_offsets_count_utf16_units() -> None:
    text = "😀 é **star** bold"  # the emoji is two UTF-16 units, é one
    bold, star = text.index("bold") + 1, text.index("**") + 1
    assert telegram_markdown(text, [entity("bold", bold, 4)]) == "😀 é **star** **bold**"
    assert telegram_markdown(text, [entity("code", star, 8)]) == "😀 é `**star**` bold"


def test_telegram_pre_is_a_fenced_block_with_its_language() -> None:
    text = "try this:\nprint('a ``` b')\nthen tell me"
    pre = entity("pre", 10, 16, language="python")
    assert telegram_markdown(text, [pre]) == (
        "try this:\n````python\nprint('a ``` b')\n````\nthen tell me"
    )
    # A block glued to text on the same line still gets lines of its own.
    glued = "see:x = 1done"
    assert telegram_markdown(glued, [entity("pre", 4, 5)]) == "see:\n```\nx = 1\n```\ndone"


def test_telegram_mentions_quotes_and_edge_whitespace() -> None:
    nameless = User(555, "Dana Scully", is_bot=False)
    named = User(556, "Fox", is_bot=False, username="fox")
    text = "ask Dana Scully and Fox and @carol\nquoted line\nsecond\nthen bold and more"
    entities = [
        entity("text_mention", text.index("Dana"), 11, user=nameless),
        entity("text_mention", text.index("Fox"), 3, user=named),
        entity("mention", text.index("@carol"), 6),
        entity("blockquote", text.index("quoted"), len("quoted line\nsecond")),
        entity("bold", text.index(" bold "), len(" bold ")),  # spaces selected too
    ]
    assert telegram_markdown(text, entities) == (
        "ask @Dana Scully and @fox and @carol\n> quoted line\n> second\nthen **bold** and more"
    )


def test_code_spans_and_links_survive_awkward_content() -> None:
    assert telegram_markdown("a`b", [entity("code", 0, 3)]) == "``a`b``"
    assert markdown_link("see [1]", "https://x.org/a (b)") == r"[see \[1\]](<https://x.org/a (b)>)"
    assert markdown_link("https://x.org", "https://x.org") == "https://x.org"
    assert markdown_link("a@b.org", "mailto:a@b.org") == "a@b.org"


# ---- Slack mrkdwn ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mrkdwn", "markdown"),
    [
        ("*bold* _it_ ~gone~", "**bold** *it* ~~gone~~"),
        ("*bold with _it_ inside*", "**bold with *it* inside**"),
        ("snake_case_name, 2*3*4 and * a list", "snake_case_name, 2*3*4 and * a list"),
        ("**already markdown** and ~~this~~", "**already markdown** and ~~this~~"),
        ("<https://ex.com/a?b=1&amp;c=2|the docs>", "[the docs](https://ex.com/a?b=1&c=2)"),
        ("<https://ex.com> and <mailto:a@b.org|a@b.org>", "https://ex.com and a@b.org"),
        ("*<https://ex.com|bold link>*", "**[bold link](https://ex.com)**"),
        ("<@U2> <@U404> <@U7|legacy>", "@bob @U404 @legacy"),
        ("<#C42|ops> <#C43> <!here> <!subteam^S1|@devs>", "#ops #C43 @here @devs"),
        ("<!date^1700000000^{date}|Nov 14> a &lt;b&gt; &amp;amp;", "Nov 14 a <b> &amp;"),
        ("`*not bold* &lt;x&gt;` *bold*", "`*not bold* <x>` **bold**"),
        ("run ```ls *.txt``` now", "run ```ls *.txt``` now"),
        ("code:```for _x_ in y:\n    *z*```done", "code:\n```\nfor _x_ in y:\n    *z*\n```\ndone"),
        ("```\n<https://ex.com|docs> <@U2>\n```", "```\ndocs @bob\n```"),
    ],
)
def test_slack_mrkdwn_becomes_markdown(mrkdwn: str, markdown: str) -> None:
    names = {"U2": "bob"}
    assert slack_markdown(mrkdwn, names.get) == markdown


def test_slack_user_ids_are_those_without_a_label() -> None:
    assert slack_user_ids("<@U2> hi <@U3|carol> <@U2> <@W9>") == ["U2", "W9"]


# ---- Discord ---------------------------------------------------------------------------------


def test_discord_mention_ids_become_names_outside_code() -> None:
    content = (
        "<@1> and <@!2> ping <@&3> in <#4> or <#5> <:party:99> at <t:1700000000:R> "
        "`<@1>`\n```\n<#4>\n```"
    )
    named = discord_markdown(
        content, users={1: "Carol", 2: "Dan"}, channels={4: "general"}, roles={3: "oncall"}
    )
    assert named == (
        "@Carol and @Dan ping @oncall in #general or #5 :party: at 2023-11-14 22:13 UTC "
        "`<@1>`\n```\n<#4>\n```"
    )


# ---- end to end: Telegram ----------------------------------------------------------------------


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token="123456:TEST-token") as server:
        yield server


async def test_telegram_formatting_reaches_the_agent_as_markdown(tg: FakeTelegram) -> None:
    agent = Recorder()
    dana = TgUser(555, "Dana")  # no username: picked as a text mention
    async with telegram(tg, agent):
        text, entities = formatted("<b>please</b> run <code>ls -la</code>")
        tg.dm(ALICE, text, entities=entities)
        code = '<pre><code class="language-python">print("hi")\n</code></pre>'
        text, entities = formatted(f"fix <i>this</i>:\n{code}")
        tg.dm(ALICE, text, entities=entities)
        text, entities = formatted(
            'ask <a href="tg://user?id=555">Dana</a> about <a href="https://x.org/p">the plan</a>'
            " — <s>not</s> <u>today</u>",
            dana,
        )
        tg.group_message(GROUP, BOB, text, mention=True, entities=entities)
        tg.command(ALICE, "goal", "create ship v2")
        await agent.texts(4)
    by_chat = {
        chat: [i.text for i in agent.inbounds if i.channel_id == str(chat)]
        for chat in (ALICE.id, GROUP)
    }
    assert by_chat == {
        ALICE.id: [
            "**please** run `ls -la`",
            'fix *this*:\n```python\nprint("hi")\n```',
            "/goal create ship v2",
        ],
        GROUP: ["ask @Dana about [the plan](https://x.org/p) — ~~not~~ today"],
    }
    assert [i.mentions_bot for i in agent.inbounds if i.channel_id == str(GROUP)] == [True]


async def test_telegram_text_mention_of_the_bot_is_stripped(tg: FakeTelegram) -> None:
    agent = Recorder()
    async with telegram(tg, agent):
        # Picked from the member list, the bot shows by its name, not its @username.
        text, entities = formatted(
            f'<a href="tg://user?id={BOT.id}">Parley</a> what is <b>up</b>?', BOT
        )
        tg.group_message(GROUP, ALICE, text, entities=entities)
        [said] = await agent.texts(1)
    assert said == "what is **up**?"
    assert agent.inbounds[0].mentions_bot


# ---- end to end: Slack -------------------------------------------------------------------------


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


async def test_slack_mrkdwn_reaches_the_agent_as_markdown_with_names(
    slack: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    agent = Recorder()
    async with slack_channel(slack, agent):
        await slack.dm(
            "*deploy* _now_, not ~later~: <https://ex.com/run?a=1&amp;b=2|the runbook> "
            "with <@U2> in <#C42|ops> <!here> if a < b && `x_y *z*`\n```\nls *.txt\n```"
        )
        await slack.mention("ask <@U2> and <@U404> about _it_")
        await slack.dm("<@U2> again")
        await agent.texts(3)
    by_channel = {c: [i.text for i in agent.inbounds if i.channel_id == c] for c in ("D1", "C1")}
    assert by_channel == {
        "D1": [
            "**deploy** *now*, not ~~later~~: [the runbook](https://ex.com/run?a=1&b=2) with "
            "@bob in #ops @here if a < b && `x_y *z*`\n```\nls *.txt\n```",
            "@bob again",
        ],
        "C1": ["ask @bob and @U404 about *it*"],  # the bot's own mention stripped, as before
    }
    looked_up = [c.params["user"] for c in slack.calls_of("users.info")]
    assert looked_up.count("U2") == 1  # the adapter's cache answers the second time
    assert BOT_USER_ID not in looked_up
    failures = [r for r in caplog.records if "U404" in r.getMessage()]
    assert [r.levelno for r in failures] == [logging.WARNING]


async def test_slack_messages_keep_their_order_while_names_are_looked_up(
    slack: FakeSlack,
) -> None:
    agent = Recorder()
    slack.delays["users.info"] = 0.3
    async with slack_channel(slack, agent):
        await slack.dm("first, for <@U3>")
        await slack.dm("second")
        texts = await agent.texts(2)
    assert texts == ["first, for @carol", "second"]


# ---- end to end: Discord ------------------------------------------------------------------------


@pytest.fixture
async def dc() -> AsyncIterator[FakeDiscord]:
    with discord_api.library_endpoints_restored():
        async with FakeDiscord() as server:
            yield server


async def test_discord_mentions_reach_the_agent_as_names(dc: FakeDiscord) -> None:
    agent = Recorder()
    async with discord_channel(dc, agent):
        await dc.mention(
            f"ask <@{CAROL.id}> and <@!{USER.id}> (<@&{ONCALL_ROLE_ID}>) in <#{CHANNEL_ID}> "
            f"or <#{BOT_THREAD_ID}>, not `<@{CAROL.id}>`"
        )
        [said] = await agent.texts(1)
    assert said == (
        f"ask @Carol (on call) and @alice (@oncall) in #general or #bot thread, not `<@{CAROL.id}>`"
    )
    assert agent.inbounds[0].mentions_bot
