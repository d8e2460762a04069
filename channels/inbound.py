"""Inbound message text as Markdown: what each platform's formatting becomes for the agent.

The outbound converters (`channels.text`) turn the agent's Markdown into each platform's
format; these do the reverse for what people write, so the agent sees `**bold**`, code in
backticks, `[label](url)` links and `@name` / `#channel` instead of platform syntax or ids:

- Telegram sends plain text plus entities (offsets in UTF-16 code units): `telegram_markdown`.
  PTB's own `Message.text_markdown_v2` escapes every `.`, `-`, `(`, `!` for MarkdownV2 and
  writes bold as `*x*` (italic in CommonMark); its legacy `text_markdown` has the same
  bold problem and glues a `pre` block's closing fence to the code. Neither is Markdown an
  agent should read, so the entities are converted here.
- Slack sends mrkdwn with `<…>` tokens for links, mentions and channels, and `&`, `<`, `>`
  escaped: `slack_markdown` (user names come from the adapter's cache).
- Discord content is Markdown already, but mentions are ids: `discord_markdown`.

Plain text is not escaped: the reader is a language model, and `2 * 3` or `snake_case`
left as typed reads better than a text full of backslashes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import field
from datetime import UTC, datetime
from typing import Protocol

from core.records import record

__all__ = [
    "discord_markdown",
    "markdown_link",
    "slack_markdown",
    "slack_user_ids",
    "telegram_markdown",
]


def markdown_link(label: str, url: str) -> str:
    """`[label](url)`, or just the text when label and address say the same thing."""
    if not label or label == url:
        return url
    if url == f"mailto:{label}":
        return label
    label = re.sub(r"([\[\]])", r"\\\1", label)
    if re.search(r"[\s()<>]", url):
        url = "<" + url.replace("<", "%3C").replace(">", "%3E") + ">"
    return f"[{label}]({url})"


def _code_span(code: str) -> str:
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", code)), default=0) + 1)
    pad = " " if code.startswith("`") or code.endswith("`") else ""
    return f"{ticks}{pad}{code}{pad}{ticks}"


def _fenced(code: str, lang: str = "") -> str:
    fence = "`" * max(3, max((len(run) for run in re.findall(r"`+", code)), default=0) + 1)
    end = "" if code.endswith("\n") else "\n"
    return f"{fence}{lang}\n{code}{end}{fence}"


def _wrap(text: str, marker: str) -> str:
    """`marker` around `text`, with its outer whitespace kept outside (CommonMark does not
    take `** x**` as bold)."""
    core = text.strip()
    if not core:
        return text
    start = len(text) - len(text.lstrip())
    return f"{text[:start]}{marker}{core}{marker}{text[start + len(core) :]}"


# ---- Telegram ------------------------------------------------------------------------------


class _TgUser(Protocol):
    @property
    def username(self) -> str | None: ...


class TelegramEntity(Protocol):
    """What is read of a `telegram.MessageEntity`."""

    @property
    def type(self) -> str: ...
    @property
    def offset(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def url(self) -> str | None: ...
    @property
    def language(self) -> str | None: ...
    @property
    def user(self) -> _TgUser | None: ...


@record
class _Node:
    entity: TelegramEntity | None
    start: int
    end: int
    children: list[_Node] = field(default_factory=list)


_INLINE = {"bold": "**", "italic": "*", "strikethrough": "~~"}
_QUOTES = frozenset({"blockquote", "expandable_blockquote"})


def telegram_markdown(text: str, entities: Sequence[TelegramEntity]) -> str:
    """`text` with its Telegram entities written as Markdown.

    Bold, italic, strikethrough, code, `pre` (a fenced block with its language), quotes and
    text links become Markdown; a `text_mention` becomes `@username` (or `@` and the name
    shown); underline and spoiler keep only their text (Markdown has neither). Entities
    nest; offsets and lengths count UTF-16 code units.
    """
    units = text.encode("utf-16-le", "surrogatepass")
    size = len(units) // 2
    root = _Node(None, 0, size)
    stack = [root]
    for entity in sorted(entities, key=lambda e: (e.offset, -e.length)):
        start = min(max(entity.offset, 0), size)
        while len(stack) > 1 and stack[-1].end <= start:
            stack.pop()
        node = _Node(entity, start, min(start + max(entity.length, 0), stack[-1].end))
        stack[-1].children.append(node)
        stack.append(node)

    def part(start: int, end: int) -> str:
        return units[2 * start : 2 * end].decode("utf-16-le", "surrogatepass")

    return _tg_render(root, part)[0]


def _tg_render(node: _Node, part: Callable[[int, int], str]) -> tuple[str, bool]:
    """The Markdown of `node`, and whether it is a block (it must stand on its own lines)."""
    pieces: list[tuple[str, bool]] = []
    pos = node.start
    for child in node.children:
        pieces.append((part(pos, child.start), False))
        pieces.append(_tg_render(child, part))
        pos = child.end
    pieces.append((part(pos, node.end), False))
    inner = _join_blocks(pieces)
    entity = node.entity
    if entity is None:
        return inner, False
    kind = entity.type
    if kind in _INLINE:
        return _wrap(inner, _INLINE[kind]), False
    if kind == "code":
        return _code_span(part(node.start, node.end)), False
    if kind == "pre":
        return _fenced(part(node.start, node.end), entity.language or ""), True
    if kind in _QUOTES:
        return "\n".join(f"> {line}".rstrip() for line in inner.strip("\n").split("\n")), True
    if kind == "text_link" and entity.url:
        return markdown_link(inner, entity.url), False
    if kind == "text_mention":
        user = entity.user
        name = user.username if user is not None and user.username else inner.lstrip("@")
        return f"@{name}", False
    return inner, False  # underline, spoiler, urls, @mentions, hashtags…: as typed


def _join_blocks(pieces: list[tuple[str, bool]]) -> str:
    out = ""
    after_block = False
    for text, block in pieces:
        if block:
            if out and not out.endswith("\n"):
                out += "\n"
            after_block = True
        elif text:
            if after_block and not text.startswith("\n"):
                out += "\n"
            after_block = False
        out += text
    return out


# ---- Slack ---------------------------------------------------------------------------------

# Code (left as typed) and `<…>` tokens; a literal `<` arrives as `&lt;`.
_SLACK_PROTECTED = re.compile(
    r"(?P<block>```[\s\S]*?```)|(?P<code>`[^`\n]+`)|<(?P<token>[^<>\n]+)>"
)
_SLACK_TOKEN = re.compile(r"<([^<>\n]+)>")
_SLACK_USER = re.compile(r"<@([UW][A-Z0-9]+)>")
_HTML = {"&amp;": "&", "&lt;": "<", "&gt;": ">"}
_HTML_ENTITY = re.compile("|".join(_HTML))
_BROADCASTS = frozenset({"here", "channel", "everyone"})


def _slack_emphasis(mark: str) -> re.Pattern[str]:
    m = re.escape(mark)
    # Slack's rule: the marks sit at word edges (`snake_case`, `2*3*4` are no formatting),
    # hug non-space text and stay on one line. Doubled marks are not Slack's: left alone.
    return re.compile(rf"(?<![^\W_])(?<!{m}){m}(?=[^\s{m}])([^\n]*?[^\s{m}]){m}(?!{m})(?![^\W_])")


_SLACK_EMPHASIS = [
    (_slack_emphasis(mark), md) for mark, md in (("*", "**"), ("_", "*"), ("~", "~~"))
]


def slack_user_ids(text: str) -> list[str]:
    """The users mentioned in `text` by id alone (`<@U123>`): those whose names are needed."""
    return list(dict.fromkeys(_SLACK_USER.findall(text)))


def slack_markdown(text: str, user_name: Callable[[str], str | None] = lambda _: None) -> str:
    """Slack message text (mrkdwn) as Markdown.

    `*b*` → `**b**`, `_i_` → `*i*`, `~s~` → `~~s~~`; `<url|label>` → `[label](url)`,
    `<url>` → url, `<@U1>` → `@name` (`user_name(id)`, else the id), `<#C1|name>` →
    `#name`, `<!here>` → `@here`; `&amp;`, `&lt;`, `&gt;` unescaped. In code spans and
    blocks only entities and tokens are undone; a block of several lines becomes a fence.
    """
    slot = _free_char(text)
    tokens: list[tuple[str, bool]] = []  # (markdown, is a block)

    def protect(m: re.Match[str]) -> str:
        if m["token"] is not None:
            tokens.append((_slack_token(m["token"], user_name, in_code=False), False))
        else:
            code = _SLACK_TOKEN.sub(lambda t: _slack_token(t[1], user_name, in_code=True), m[0])
            code = _unescape(code)
            tokens.append(_slack_block(code) if m["block"] else (code, False))
        return slot

    text = _unescape(_SLACK_PROTECTED.sub(protect, text))
    for pattern, md in _SLACK_EMPHASIS:
        text = pattern.sub(rf"{md}\1{md}", text)  # the marks are `*` and `~`: no escapes
    pieces = text.split(slot)
    out = [pieces[0]]
    for (token, block), after in zip(tokens, pieces[1:], strict=True):
        if block and out[-1] and not out[-1].endswith("\n"):
            out.append("\n")
        out.append(token)
        if block and after and not after.startswith("\n"):
            out.append("\n")
        out.append(after)
    return "".join(out)


def _slack_token(body: str, user_name: Callable[[str], str | None], *, in_code: bool) -> str:
    target, _, label = body.partition("|")
    if target.startswith("@"):
        user = target[1:]
        return "@" + (label.lstrip("@") or user_name(user) or user)
    if target.startswith("#"):
        return "#" + (label or target[1:])
    if target.startswith("!"):
        command = target[1:]
        if command in _BROADCASTS:
            return f"@{command}"
        if command.startswith("subteam^"):
            return "@" + (label.lstrip("@") or command.removeprefix("subteam^"))
        return _unescape(label) or f"@{command}"  # <!date^…|fallback text>
    url, label = _unescape(target), _unescape(label)
    return (label or url) if in_code else markdown_link(label, url)


def _slack_block(block: str) -> tuple[str, bool]:
    code = block[3:-3]
    if "\n" not in code.strip("\n"):
        return block, False  # ```ls -la``` in a sentence: a code span in Markdown too
    return _fenced(code.strip("\n") + "\n"), True


def _unescape(text: str) -> str:
    return _HTML_ENTITY.sub(lambda m: _HTML[m[0]], text)


def _free_char(text: str) -> str:
    """A private-use character that `text` does not contain, to stand in for tokens."""
    return next(chr(c) for c in range(0xE000, 0xF900) if chr(c) not in text)


# ---- Discord -------------------------------------------------------------------------------

_DISCORD_CODE = re.compile(r"```[\s\S]*?```|``[^\n]+?``|`[^`\n]+`")
_DISCORD_TOKEN = re.compile(
    r"<(?P<kind>@[!&]?|#)(?P<id>\d+)>"
    r"|<a?:(?P<emoji>\w+):\d+>"
    r"|<t:(?P<time>-?\d+)(?::[tTdDfFR])?>"
)


def discord_markdown(
    content: str,
    *,
    users: Mapping[int, str],
    channels: Mapping[int, str],
    roles: Mapping[int, str],
) -> str:
    """Discord content with its mention tokens named: `<@id>` / `<@!id>` → `@name`,
    `<@&id>` → `@role`, `<#id>` → `#channel` (the id where the name is unknown), custom
    emoji → `:name:`, `<t:…>` timestamps → UTC date and time. Code is left as typed (Discord
    shows tokens there literally)."""

    def named(m: re.Match[str]) -> str:
        if m["emoji"]:
            return f":{m['emoji']}:"
        if m["time"]:
            return _timestamp(m["time"]) or m[0]
        kind, ident = m["kind"], int(m["id"])
        if kind == "#":
            return "#" + channels.get(ident, str(ident))
        table = roles if kind == "@&" else users
        return "@" + table.get(ident, str(ident))

    return "".join(
        part if code else _DISCORD_TOKEN.sub(named, part)
        for part, code in _split(content, _DISCORD_CODE)
    )


def _timestamp(seconds: str) -> str | None:
    try:
        moment = datetime.fromtimestamp(int(seconds), tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def _split(text: str, code: re.Pattern[str]) -> Iterator[tuple[str, bool]]:
    """`text` in pieces, each flagged whether it is code."""
    pos = 0
    for m in code.finditer(text):
        yield text[pos : m.start()], False
        yield m[0], True
        pos = m.end()
    yield text[pos:], False
