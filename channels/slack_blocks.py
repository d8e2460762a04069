"""The approval prompt in Slack's Block Kit: what is asked and why, with Approve / Deny
buttons whose action ids the adapter listens for."""

from __future__ import annotations

from typing import Any

from channels.approvals import ALWAYS_LABELS, approval_button_id
from channels.slack_api import escape
from core.chat import ApprovalRequest, GrantScope

APPROVE_ACTION, DENY_ACTION = "parley_approve", "parley_deny"
ALWAYS_ACTIONS: dict[GrantScope, str] = {
    "conversation": "parley_always_here",
    "channel": "parley_always_channel",
}
ACTIONS = (APPROVE_ACTION, DENY_ACTION, *ALWAYS_ACTIONS.values())


def approval_blocks(
    request: ApprovalRequest, *, outcome: str | None = None
) -> list[dict[str, Any]]:
    """The prompt: what is asked and why, then Approve / Deny buttons — or, once settled,
    the outcome instead of the buttons."""
    summary = escape(request.summary).replace("```", "'''")[:2500]
    text = f"*Approval needed* for `{escape(request.tool)}`: {escape(request.reason)[:300]}"
    section = {"type": "section", "text": {"type": "mrkdwn", "text": f"{text}\n```{summary}```"}}
    if outcome is not None:
        note = {"type": "mrkdwn", "text": escape(outcome)}
        return [section, {"type": "context", "elements": [note]}]
    buttons: list[tuple[str, str, str | None, str]] = [
        (APPROVE_ACTION, "Approve", "primary", approval_button_id(request.id, True))
    ]
    if request.grantable:
        buttons += [
            (ALWAYS_ACTIONS[scope], label, None, approval_button_id(request.id, True, scope))
            for scope, label in ALWAYS_LABELS.items()
        ]
    buttons.append((DENY_ACTION, "Deny", "danger", approval_button_id(request.id, False)))
    elements = [
        {
            "type": "button",
            "action_id": action_id,
            "text": {"type": "plain_text", "text": label},
            **({"style": style} if style else {}),
            "value": value,
        }
        for action_id, label, style, value in buttons
    ]
    return [section, {"type": "actions", "block_id": "approval", "elements": elements}]
