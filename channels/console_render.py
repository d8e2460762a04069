"""How a turn is drawn in the terminal (docs/channels.md#terminal): the model's text on
stdout as it streams, tool activity, reasoning and notices on stderr. `parley chat` and
`parley chat -m` (`bot.cli`) both draw with `ConsoleRenderer`."""

from __future__ import annotations

from typing import TextIO

from core.events import (
    CompactionProgress,
    LLMCallStarted,
    LoopEvent,
    Notice,
    ReasoningDelta,
    StreamDone,
    StreamRestarted,
    TextDelta,
    ToolFinished,
    ToolStarted,
)

DIM, RESET = "\x1b[2m", "\x1b[0m"


def one_line(text: str, width: int = 100) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


class ConsoleRenderer:
    """An event sink that draws a turn in the terminal: the model's text on `out` as it
    streams, everything else on `err`."""

    def __init__(self, out: TextIO, err: TextIO, *, color: bool, exact: bool = False) -> None:
        """`exact`: `out` must end up holding only the answer, nothing of a failed attempt
        (`parley chat -m` into a file or a pipe). Into a file the text streams, and a
        retry that says something else rewrites the message from where it began; into a
        pipe, which cannot be rewritten, each message is written once its stream is done."""
        self.out, self.err = out, err
        self.color = color
        self.at_line_start = True
        self._message = ""  # the assistant message being streamed
        self._shown = ""  # what of it is on `out` (a retried stream may repeat it)
        self.last_message = ""  # the text of the last complete assistant message
        self._rewind = exact and _seekable(out)  # where the message began, if rewritable
        self._hold = exact and not self._rewind  # a pipe: whole messages only
        self._began: int | None = None

    def _dim(self, text: str) -> str:
        return f"{DIM}{text}{RESET}" if self.color else text

    def _write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()
            self.at_line_start = text.endswith("\n")

    def _err_line(self, text: str) -> None:
        # Mid-answer (a retry notice), the line is broken on stderr, not stdout: stdout
        # carries the answer's text and nothing else (docs/channels.md#terminal).
        self.err.write(("" if self.at_line_start else "\n") + text + "\n")
        self.err.flush()

    def _text(self, text: str) -> None:
        self._message += text
        if self._hold or self._shown.startswith(self._message):
            return  # held for the whole message, or a retry repeating what is shown
        if self._rewind and self._began is None:
            self.out.flush()
            self._began = self.out.tell()
        if self._message.startswith(self._shown):
            self._write(self._message[len(self._shown) :])
        elif self._began is not None:  # the retry says something else: rewrite it
            self.out.flush()
            self.out.seek(self._began)
            self.out.truncate()
            self._write(self._message)
        else:  # a terminal: start the answer again below
            self._err_line("(the answer was retried and differs; it starts again below)")
            self._write(self._message)
        self._shown = self._message

    def __call__(self, event: LoopEvent) -> None:
        match event:
            case TextDelta(text=text):
                self._text(text)
            case ReasoningDelta(text=text):
                self.err.write(self._dim(text))
                self.err.flush()
            case LLMCallStarted():
                self._message = self._shown = ""
                self._began = None
            case StreamDone():
                if self._hold:
                    self._write(self._message)
                self.last_message, self._message, self._shown = self._message, "", ""
                self._began = None
                self.finish()
            case ToolStarted(call=call, category=category):
                tag = "" if category == "read" else f" [{category}]"
                self._err_line(self._dim(f"→ {call.name}{tag} {one_line(call.arguments, 80)}"))
            case ToolFinished(call=call, result=result, duration=duration):
                mark = "✗" if result.is_error else "✓"
                summary = one_line(result.content, 90) or "(no output)"
                self._err_line(self._dim(f"  {mark} {call.name} {duration:.1f}s: {summary}"))
            case StreamRestarted(attempt=attempt, reason=reason, delay=delay, discard=discard):
                if discard:
                    self._message = ""  # what the retry repeats of `_shown` is not shown twice
                self._err_line(f"⟳ retry {attempt} in {delay:.1f}s ({one_line(reason, 80)})")
            case Notice(text=text):
                self._err_line(text)
            case CompactionProgress(after=after) as progress if after is not None:
                self._err_line(self._dim(progress.line))
            case _:
                pass

    def begin(self) -> None:
        """A new turn: nothing of it is shown yet."""
        self._message = self._shown = self.last_message = ""

    def complete(self, text: str) -> None:
        """End the turn with its final `text`: written unless it is what just streamed
        (a stop notice, an error or a summary was not)."""
        final, streamed = text.strip(), self.last_message.strip()
        if not streamed or (final != streamed and not final.endswith("\n\n" + streamed)):
            self.message(text)
        self.finish()

    def message(self, text: str) -> None:
        """A whole message on lines of its own."""
        self.finish()
        self._write(text.rstrip("\n") + "\n")

    def finish(self) -> None:
        """End the line the streamed text is on."""
        if not self.at_line_start:
            self._write("\n")


def _seekable(out: TextIO) -> bool:
    """A regular file (not a terminal or a pipe): what was written can be rewritten."""
    try:
        return out.seekable() and not out.isatty()
    except (OSError, ValueError):
        return False


__all__ = ["ConsoleRenderer", "one_line"]
