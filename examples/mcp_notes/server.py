"""A small MCP server for Parley's README worked example: a team's notes, one file each,
in the server's own directory (Parley gives a stdio server `~/.parley/mcp/<name>` as its
working directory).

    [mcp.servers.notes]
    command = ["python3", "examples/mcp_notes/server.py"]

Needs the `mcp` package (`pip install 'parley[mcp]'`) for the Python that runs it. Set
NOTES_AUTHOR (listed in the server's `env`) to sign new notes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

NOTES = Path("notes")
TITLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _.-]{0,79}")

app = MCPServer("notes", instructions="The team's notes: short texts with a title.")


def _path(title: str) -> Path:
    if not TITLE.fullmatch(title):
        raise ValueError("a title is letters, digits, spaces, '_', '.', '-' (at most 80)")
    return NOTES / f"{title}.md"


@app.tool(annotations=ToolAnnotations(readOnlyHint=True))
def list_notes() -> list[str]:
    """The titles of all notes."""
    return sorted(p.stem for p in NOTES.glob("*.md")) if NOTES.exists() else []


@app.tool(annotations=ToolAnnotations(readOnlyHint=True))
def read_note(title: str) -> str:
    """The text of the note `title`."""
    path = _path(title)
    return path.read_text() if path.exists() else f"There is no note called {title!r}."


@app.tool()
def add_note(title: str, text: str) -> str:
    """Add text to the note `title` (created if missing), signed by NOTES_AUTHOR."""
    NOTES.mkdir(exist_ok=True)
    author = os.environ.get("NOTES_AUTHOR", "parley")
    with _path(title).open("a") as f:
        f.write(f"{text}\n— {author}\n\n")
    return f"Added to {title!r}."


@app.tool(annotations=ToolAnnotations(destructiveHint=True))
def delete_note(title: str) -> str:
    """Delete the note `title`."""
    _path(title).unlink(missing_ok=True)
    return f"Deleted {title!r}."


@app.resource("notes://index")
def index() -> str:
    """Every note's title, one per line."""
    return "\n".join(list_notes())


if __name__ == "__main__":
    app.run()
