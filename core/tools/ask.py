"""`ask_human`: the model hands a question to the user and the turn ends until they answer.

The tool itself only records the question; the loop sees the call, gives it a result (so
the transcript stays valid) and ends the turn with the question as its answer. The user's
reply arrives as the next user message.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from core.tools.base import Category, Tool, ToolContext, ToolResult

ASK_HUMAN = "ask_human"
ASKED_RESULT = "The question was sent to the user; their answer will come as the next message."


class AskHumanParams(BaseModel):
    question: str = Field(
        min_length=1,
        max_length=2000,
        description="What you need to know or decide to go on.",
    )


class AskHumanTool(Tool):
    name = ASK_HUMAN
    description = (
        "Ask the user when you are stuck or need a decision or facts only they have. The "
        "turn ends until they reply."
    )
    category: Category = "read"
    params = AskHumanParams

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        return ToolResult(ASKED_RESULT)
