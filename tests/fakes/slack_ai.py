"""The fake Slack's AI-app methods: thread status, suggested prompts, titles, and native
text streaming (`chat.startStream` / `appendStream` / `stopStream`), with the request and
answer shapes of Slack's method pages and their error cases:

- `chat.startStream`: `channel` and `thread_ts`; outside a DM `recipient_user_id` and
  `recipient_team_id` (else `missing_recipient_user_id` / `missing_recipient_team_id`);
  `markdown_text` up to 12,000 characters (`msg_too_long`) or `chunks`; answers
  `{"ok", "channel", "ts"}`. A workspace without streaming (`streaming = False`) answers
  `missing_scope` with `needed`/`provided`.
- `chat.appendStream` / `chat.stopStream`: `channel`, `ts`; a message that is not
  streaming (never was, stopped, expired: `expire_streams()`) answers
  `message_not_in_streaming_state`; `stop_error` refuses stops (Slack Connect's
  `user_not_found`), the stream staying open.
- A streaming message cannot be edited (`chat.update` answers `cant_update_message`).
- `assistant.threads.setStatus` (`channel_id`, `thread_ts`, `status`; "" clears),
  `setSuggestedPrompts` (1–4 `{title, message}`), `setTitle`.
"""

from __future__ import annotations

import json
from typing import Any

MAX_MARKDOWN = 12_000
TASK_STATES = {"pending", "in_progress", "complete", "error"}


class SlackAI:
    """Mixed into `FakeSlack` (which provides `messages`, `_next_ts` and `Posted`)."""

    messages: dict[tuple[str, str], Any]
    streaming: bool
    stop_error: str | None
    statuses: list[tuple[str, str, str]]  # (channel, thread_ts, status) as set, in order
    prompts: dict[tuple[str, str], list[dict[str, str]]]
    titles: dict[tuple[str, str], str]

    def _next_ts(self) -> str:
        raise NotImplementedError

    def _new_posted(self, channel: str, ts: str, thread_ts: str | None, text: str) -> Any:
        raise NotImplementedError

    def init_ai(self) -> None:
        self.streaming = True
        self.stop_error = None
        self.statuses = []
        self.prompts = {}
        self.titles = {}

    # ---- inspecting --------------------------------------------------------------------

    def status_of(self, channel: str, thread_ts: str) -> str:
        """The status the thread shows now ("" for none)."""
        shown = [s for c, t, s in self.statuses if (c, t) == (channel, thread_ts)]
        return shown[-1] if shown else ""

    def expire_streams(self) -> None:
        """Slack ends streams left idle too long: every open stream is stopped as it stands."""
        for posted in self.messages.values():
            posted.streaming = False

    # ---- assistant.threads.* -------------------------------------------------------------

    @staticmethod
    def _thread(params: dict[str, Any]) -> tuple[str, str] | str:
        channel, thread_ts = str(params.get("channel_id", "")), str(params.get("thread_ts", ""))
        if not channel:
            return "channel_not_found"
        if not thread_ts:
            return "invalid_thread_ts"
        return channel, thread_ts

    def _api_assistant_threads_setStatus(self, params: dict[str, Any]) -> dict[str, Any]:
        where = self._thread(params)
        if isinstance(where, str):
            return {"ok": False, "error": where}
        if "status" not in params:
            return {"ok": False, "error": "invalid_arguments"}
        self.statuses.append((*where, str(params["status"])))
        return {"ok": True}

    def _api_assistant_threads_setSuggestedPrompts(self, params: dict[str, Any]) -> dict[str, Any]:
        where = self._thread(params)
        if isinstance(where, str):
            return {"ok": False, "error": where}
        prompts = params.get("prompts")
        if isinstance(prompts, str):
            prompts = json.loads(prompts)
        valid = isinstance(prompts, list) and 1 <= len(prompts) <= 4
        if not valid or not all(p.get("title") and p.get("message") for p in prompts):
            return {"ok": False, "error": "invalid_arguments"}
        self.prompts[where] = prompts
        return {"ok": True}

    def _api_assistant_threads_setTitle(self, params: dict[str, Any]) -> dict[str, Any]:
        where = self._thread(params)
        if isinstance(where, str):
            return {"ok": False, "error": where}
        if not params.get("title"):
            return {"ok": False, "error": "invalid_arguments"}
        self.titles[where] = str(params["title"])
        return {"ok": True}

    # ---- chat.*Stream -------------------------------------------------------------------

    @staticmethod
    def _stream_text(params: dict[str, Any]) -> tuple[str, list[dict[str, Any]]] | str:
        """(markdown text, task chunks) of one streaming call, or its error code."""
        text = str(params.get("markdown_text") or "")
        chunks = params.get("chunks") or []
        if isinstance(chunks, str):
            chunks = json.loads(chunks)
        tasks = []
        for chunk in chunks:
            if chunk.get("type") == "markdown_text":
                text += str(chunk.get("text", ""))
            elif chunk.get("type") == "task_update":
                if not chunk.get("id") or chunk.get("status") not in TASK_STATES:
                    return "invalid_chunks"
                tasks.append(chunk)
            else:
                return "invalid_chunks"
        if len(text) > MAX_MARKDOWN:
            return "msg_too_long"
        return text, tasks

    def _api_chat_startStream(self, params: dict[str, Any]) -> dict[str, Any]:
        if not self.streaming:
            return {
                "ok": False,
                "error": "missing_scope",
                "needed": "assistant:write",
                "provided": "chat:write",
            }
        channel, thread_ts = str(params.get("channel", "")), params.get("thread_ts")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        if not thread_ts:
            return {"ok": False, "error": "invalid_thread_ts"}
        if not channel.startswith("D"):
            if not params.get("recipient_user_id"):
                return {"ok": False, "error": "missing_recipient_user_id"}
            if not params.get("recipient_team_id"):
                return {"ok": False, "error": "missing_recipient_team_id"}
        body = self._stream_text(params)
        if isinstance(body, str):
            return {"ok": False, "error": body}
        ts = self._next_ts()
        posted = self._new_posted(channel, ts, str(thread_ts), body[0])
        posted.streaming, posted.native = True, True
        posted.tasks.extend(body[1])
        self.messages[(channel, ts)] = posted
        return {"ok": True, "channel": channel, "ts": ts}

    def _streaming(self, params: dict[str, Any]) -> Any:
        posted = self.messages.get((str(params.get("channel")), str(params.get("ts"))))
        if posted is None or posted.deleted:
            return "message_not_found"
        if not posted.streaming:
            return "message_not_in_streaming_state"
        return posted

    def _api_chat_appendStream(self, params: dict[str, Any]) -> dict[str, Any]:
        posted = self._streaming(params)
        if isinstance(posted, str):
            return {"ok": False, "error": posted}
        body = self._stream_text(params)
        if isinstance(body, str):
            return {"ok": False, "error": body}
        if not body[0] and not body[1]:
            return {"ok": False, "error": "no_text"}
        posted.texts.append(posted.text + body[0])
        posted.tasks.extend(body[1])
        return {"ok": True, "channel": posted.channel, "ts": posted.ts}

    def _api_chat_stopStream(self, params: dict[str, Any]) -> dict[str, Any]:
        posted = self._streaming(params)
        if isinstance(posted, str):
            return {"ok": False, "error": posted}
        if self.stop_error is not None:
            return {"ok": False, "error": self.stop_error}
        body = self._stream_text(params)
        if isinstance(body, str):
            return {"ok": False, "error": body}
        if body[0]:
            posted.texts.append(posted.text + body[0])
        posted.tasks.extend(body[1])
        posted.streaming = False
        message = {"type": "message", "text": posted.text, "ts": posted.ts}
        return {"ok": True, "channel": posted.channel, "ts": posted.ts, "message": message}
