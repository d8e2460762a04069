"""The `parley` command. Heavy modules are imported only by the sub-command that needs them,
so `parley --version` starts fast."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, cast

from bot.collector import pause_collector, start_up_done

if TYPE_CHECKING:
    from bot.app import App
    from core.agent.conversation import Conversation
    from core.errors import ConfigError
    from core.tools.base import Approver, RoleGate

EXIT_CONFIG = 2


def _version() -> str:
    from importlib import metadata  # ~10 ms with its lookup: only for --version

    try:
        return metadata.version("parley")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "0.0.0+local"


class _VersionAction(argparse.Action):
    """`--version`, looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        sys.stdout.write(f"parley {_version()}\n")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parley", description="An LLM agent for team chat.")
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument(
        "--config", type=Path, help="config file (default: $PARLEY_CONFIG, else ./config.toml)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    chat = sub.add_parser("chat", help="talk to the agent in this terminal")
    chat.add_argument("-m", "--message", help="run one turn non-interactively and print the answer")
    chat.add_argument("--provider", help="provider name from config.toml")
    runs = sub.add_parser("runs", help="recent runs; `runs show ID` prints one run's events")
    runs.add_argument("action", nargs="?", choices=["show"], help="show one run")
    runs.add_argument("run_id", nargs="?", help="run id (a unique prefix is enough)")
    runs.add_argument("-n", "--limit", type=int, default=20, help="how many runs to list")
    jobs = sub.add_parser(
        "jobs", help="scheduled jobs: `jobs list`, `jobs runs NAME` (its fires), `jobs run NAME`"
    )
    jobs.add_argument("action", choices=["list", "runs", "run"])
    jobs.add_argument("name", nargs="?", help="the job to list the fires of, or to fire now")
    triggers = sub.add_parser(
        "triggers", help="webhook triggers: `triggers list`, `triggers test NAME --payload FILE`"
    )
    triggers.add_argument("action", choices=["list", "test"])
    triggers.add_argument("name", nargs="?", help="the trigger to test")
    triggers.add_argument("--payload", type=Path, help="a JSON file: the webhook's body")
    triggers.add_argument("--event", help="the event type (for sources that send it in a header)")
    triggers.add_argument(
        "--post",
        action="store_true",
        help="also send the signed delivery to the running Parley's [server] listen",
    )
    audit = sub.add_parser(
        "audit", help="the audit log: approvals, refusals, admin commands, grants, reloads"
    )
    audit.add_argument(
        "--since", help="only entries since: today, month, an age (24h, 7d) or an ISO date/time"
    )
    audit.add_argument(
        "--verify",
        action="store_true",
        help="recompute the hash chain; exit 1 naming the first row changed or removed",
    )
    audit.add_argument(
        "--anchor",
        metavar="SEQ:HASH",
        help="with --verify: also check that row SEQ still has the hash an earlier "
        "--verify printed (kept outside the store)",
    )
    usage = sub.add_parser("usage", help="what LLM calls cost, as a table (or CSV)")
    usage.add_argument(
        "--by", choices=["user", "channel", "job", "model", "day"], default="model",
        help="what to sum by (default: model)",
    )  # fmt: skip
    usage.add_argument(
        "--since", default="month", help="today, month (default), an age (12h, 7d) or ISO date"
    )
    usage.add_argument("--csv", action="store_true", help="CSV for a spreadsheet")
    run = sub.add_parser("run", help="start every enabled channel (the console if none)")
    run.add_argument("--provider", help="provider name from config.toml")
    run.add_argument("--console", action="store_true", help="also talk in this terminal")
    run.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        help="what goes to stderr (default: $PARLEY_LOG_LEVEL, else info); info says why "
        "a message was ignored",
    )
    return parser


LOG_LEVELS = ("debug", "info", "warning", "error")


def _setup_logging(args: argparse.Namespace) -> str | None:
    """Log to stderr at --log-level, else $PARLEY_LOG_LEVEL, else info for `run` and
    warning for the rest. Returns a complaint about a bad $PARLEY_LOG_LEVEL."""
    env = os.environ.get("PARLEY_LOG_LEVEL", "").strip().lower()
    default = "info" if args.command == "run" else "warning"
    level = getattr(args, "log_level", None) or env or default
    problem = None
    if level not in LOG_LEVELS:
        problem = f"PARLEY_LOG_LEVEL={env!r} is not one of {', '.join(LOG_LEVELS)}"
        level = default
    logging.basicConfig(
        level=level.upper(),
        format="parley %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from core.secrets import redact_log_handlers

    redact_log_handlers()  # messages and tracebacks, whatever stream a handler writes to
    if level != "debug":  # the libraries' info lines (every HTTP request) are noise here
        from channels import SDK_LOGGERS  # the names alone: no platform's settings model

        sdks = [name for names in SDK_LOGGERS.values() for name in names]
        for name in (
            "httpx",
            "httpcore",
            "httpx2",
            "httpcore2",
            "apscheduler",
            "aiohttp",
            "hpack",
            *sdks,
        ):
            logging.getLogger(name).setLevel(logging.WARNING)
    return problem


def _config_path(arg: Path | None) -> Path:
    if arg is not None:
        return arg
    if env := os.environ.get("PARLEY_CONFIG"):
        return Path(env)
    return Path("config.toml")


def _fail(message: str, code: int = EXIT_CONFIG) -> int:
    sys.stderr.write(f"parley: {message}\n")
    return code


def _config_problem(exc: ConfigError, path: Path | None) -> int:
    """Report a configuration problem, naming the file actually read (`--config`'s or
    $PARLEY_CONFIG's), also for a problem found after reading it (`ConfigError.in_file`)."""
    if path is not None:
        exc.in_file(path)
    return _fail(f"configuration problem\n{exc}")


def _build_app(config_path: Path, *, stateless: bool = False) -> App:
    """The application; `stateless` for a one-shot turn (see `build_registry`)."""
    from bot.app import App, build_registry
    from bot.config import load_config

    config = load_config(config_path)
    environ = dict(os.environ)
    return App(config, environ, build_registry(config, environ, stateless=stateless))


async def _chat(app: App, provider_name: str, message: str | None) -> int:
    from channels.console import (
        ConsoleApprover,
        LineReader,
        run_interactive,
        terminal_responder,
    )

    timeout = app.config.agent.approval_timeout_seconds
    try:
        if message is not None:  # one stateless turn, for scripts
            for warning in app.guidance.warnings:  # stdout stays the answer alone
                sys.stderr.write(f"parley: warning: {warning}\n")
            reader = LineReader() if sys.stdin.isatty() else None
            approver = ConsoleApprover(reader, sys.stderr, timeout)
            await app.start_mcp()
            try:
                conversation = app.conversation(provider_name)
                return await _one_shot(conversation, message, approver, app.terminal_role())
            finally:
                await app.stop_mcp()
        sys.stderr.write(f"parley: {app.jail.describe()}\n")
        from core.sandbox import describe_places

        sys.stderr.write(f"parley: {describe_places(app.config.tools)}\n")
        for line in app.guidance.start_up_lines():  # as `parley run` prints them
            sys.stderr.write(f"parley: {line}\n")
        responder = terminal_responder(timeout)
        reader = responder.approver.reader
        assert reader is not None
        app.fallback_provider = provider_name
        agent = await app.open_agent(lambda key: responder if key[0] == "console" else None)
        try:
            for line in app.tool_status():
                sys.stderr.write(f"parley: {line}\n")
            await agent.reconcile()  # (`parley run` reconciles once for every channel)
            return await run_interactive(agent, reader, responder)
        finally:
            await app.close_agent(agent)
    finally:
        await app.aclose()


async def _one_shot(
    conversation: Conversation, message: str, approver: Approver, role: RoleGate | None
) -> int:
    """`parley chat -m`: one stateless turn on a conversation of its own, outside the
    agent, under the terminal's `role` (docs/governance.md#roles: a tool it refuses is
    neither offered nor run); the answer streams to stdout as it arrives (see
    `ConsoleRenderer` for a file or a pipe)."""
    import secrets

    from channels.console import ConsoleRenderer
    from core.chat import valid_text
    from core.errors import ContextLimitExceeded, ProviderError
    from core.run_context import RunContext
    from core.sandbox import one_off_site

    # stdout captured (a file or a pipe) holds exactly the answer (docs/channels.md#terminal)
    renderer = ConsoleRenderer(sys.stdout, sys.stderr, color=False, exact=not sys.stdout.isatty())
    # artifacts of this run's own: every one-shot run is outside any conversation
    site = one_off_site(conversation.executor.ctx.sandbox, secrets.token_hex(8))
    conversation.place(site)
    ctx = RunContext(sink=renderer, approver=approver, role=role, site=site)
    try:
        outcome = await conversation.turn(valid_text(message), ctx)
    except (ProviderError, ContextLimitExceeded) as exc:
        renderer.finish()
        sys.stderr.write(f"error: {exc}\n")
        sys.stderr.flush()
        return 1
    renderer.complete(outcome.text)
    return 0 if outcome.reason == "final" else 1


async def _jobs(app: App, action: str, name: str | None) -> int:
    from bot.jobs import Scheduler, jobs_list, jobs_run, jobs_runs
    from bot.run import build_channels
    from core.errors import ConfigError

    try:
        if action == "list":
            sys.stdout.write((await jobs_list(app)).rstrip("\n") + "\n")
            return 0
        if not name:
            return _fail(f"`jobs {action}` needs a job name (see `parley jobs list`)")
        if action == "runs":
            sys.stdout.write((await jobs_runs(app, name)).rstrip("\n") + "\n")
            return 0
        job = next((j for j in app.config.jobs if j.name == name), None)
        if job is None:
            return _fail(f"no job named `{name}` in the configuration", 1)
        kind = job.channel.split(":", 1)[0]
        channels = {k: c for k, c in build_channels(app).items() if k == kind}
        try:
            async with app.running_agent() as agent:
                Scheduler(app, agent, channels).check(job)  # only this job's target must run
                for channel in channels.values():
                    await channel.start(agent)
                result = await jobs_run(app, agent, channels, name)
        finally:
            for channel in channels.values():
                await channel.stop()
    except ConfigError as exc:
        return _config_problem(exc, app.config.source)
    finally:
        await app.aclose()
    sys.stdout.write(f"{name}: {result.state}, delivered: {result.delivery}\n")
    if result.error:
        sys.stdout.write(f"error: {result.error}\n")
    return 0 if result.ok else 1


async def _run(app: App, provider_name: str, *, console: bool) -> int:
    from bot.run import run_all

    app.fallback_provider = provider_name
    try:
        return await run_all(app, console=console)
    finally:
        await app.aclose()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with _scrubbed_terminal():
        return _command(args)


def entry() -> NoReturn:
    """The `parley` command: `main`, then out without the interpreter's teardown.

    Freeing every module and object one by one at exit took about a tenth of a one-shot
    `parley chat -m` (docs/benchmarks.md). What must happen at exit still does: the atexit
    handlers (the tool reaper's, logging's) run and the output is flushed. Everything
    else was closed by the command itself (`asyncio.run` ends with the store, the HTTP
    clients and the executor's threads shut down).
    """
    pause_collector()  # until start-up is done (`bot.collector`)
    status = main()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


@contextlib.contextmanager
def _scrubbed_terminal() -> Iterator[None]:
    """While a command runs, what it writes to stdout and stderr is scrubbed of the
    configured secrets (`core.secrets`): answers, errors, `runs` tables, log lines. A
    crash's traceback is written the same way (exit status 1, as Python's own)."""
    from core.secrets import ScrubbingStream

    out, err = sys.stdout, sys.stderr
    sys.stdout = cast(TextIO, ScrubbingStream(out))
    sys.stderr = cast(TextIO, ScrubbingStream(err))
    try:
        yield
    except Exception:
        sys.stderr.write(traceback.format_exc())
        raise SystemExit(1) from None
    finally:
        sys.stdout, sys.stderr = out, err


def _command(args: argparse.Namespace) -> int:
    if (problem := _setup_logging(args)) is not None:
        return _fail(problem)
    from core.errors import ConfigError

    config_path = _config_path(args.config)
    try:
        one_shot = args.command == "chat" and args.message is not None
        app = _build_app(config_path, stateless=one_shot)
    except ConfigError as exc:
        return _config_problem(exc, config_path)
    if args.command != "run":  # `parley run` loads its channels first (`bot.run.run_all`)
        start_up_done()
    if app.config.has_section("log") and app.config.log.format == "json":
        from bot.logs import use_json_lines

        use_json_lines()
    if args.command == "runs":
        from bot.inspect import runs_command

        return asyncio.run(
            runs_command(app.config, args.action, args.run_id, args.limit, app.environ)
        )
    if args.command == "usage":
        from bot.usage import usage_command

        return asyncio.run(usage_command(app.config, args.by, args.since, args.csv, app.environ))
    if args.command == "jobs":
        return asyncio.run(_jobs(app, args.action, args.name))
    if args.command == "triggers":
        from bot.triggers_cli import triggers_command

        return asyncio.run(triggers_command(app.config, app.environ, args))
    if args.command == "audit":
        from bot.audit_cli import audit_command

        return asyncio.run(
            audit_command(app.config, args.since, args.verify, app.environ, args.anchor)
        )
    from bot.provider_choice import choose_provider, how_to_configure

    wanted = args.provider
    if wanted and wanted not in app.config.providers:
        known = ", ".join(app.config.providers)
        return _fail(f"unknown provider `{wanted}`; configured providers: {known}")
    name, problems = choose_provider(app.config, app.environ, wanted)
    if name is None:
        details = "\n".join(f"  {n}: {p}" for n, p in problems.items())
        return _fail(
            "no LLM provider is usable:\n"
            f"{details}\n"
            f"Set the variables of at least one provider (see {config_path}):\n"
            f"{how_to_configure(app.config)}\n"
            "e.g. export OPENAI_API_KEY=sk-…   or, for a local OpenAI-compatible server,\n"
            "     export OPENAI_BASE_URL=http://localhost:11434/v1 OPENAI_MODEL=llama3.1"
        )
    if problems:
        sys.stderr.write(f"parley: using provider `{name}` ({'; '.join(problems.values())})\n")
    try:
        if args.command == "run":
            return asyncio.run(_run(app, name, console=args.console))
        return asyncio.run(_chat(app, name, args.message))
    except ConfigError as exc:  # a job or channel problem found at start-up
        return _config_problem(exc, config_path)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    entry()
