"""The garbage collector through start-up (docs/benchmarks.md, the CLI).

Start-up (the imports, the configuration, the tool registry) makes a few hundred
thousand objects, nearly all of them kept until exit, and no garbage worth a pass: the
collector's passes over them took about a sixth of a one-shot `parley chat -m`. So the
`parley` command (`bot.cli.entry`) pauses the collector first thing, and gives it back
once start-up is done: before a command's work, or, in `parley run`, once its channels'
libraries are loaded and its store is open, before anything connects or a turn runs.
"""

from __future__ import annotations

import gc


def pause_collector() -> None:
    """No collection until `start_up_done`."""
    gc.disable()


def start_up_done() -> None:
    """The collector runs again, and what start-up made is moved out of its sight
    (`gc.freeze`): not walked by the full collections of a long `parley run` either.
    Does nothing when the collector was not paused (`main` called by a test or
    another program)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()
