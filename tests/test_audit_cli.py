"""`parley audit` as an operator runs it, and the audit log's durability: appenders
killed with SIGKILL mid-stream leave no torn entry (docs/governance.md#the-audit-log)."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import sys
import textwrap
from pathlib import Path

import pytest

from core.audit import AuditLog
from core.store import open_store
from tests.process import REPO, child_env, parley, write_config
from tests.store.conftest import postgres_schema

_APPENDER = textwrap.dedent(
    """
    import asyncio, sys
    from core.audit import AuditLog
    from core.store import open_store

    async def main() -> None:
        store = await open_store(sys.argv[1])
        audit = AuditLog(store)
        i = 0
        while True:
            row = await audit.append("tool.refused", sys.argv[2], {"i": i, "pad": "x" * 500})
            print(row.seq, flush=True)
            i += 1

    asyncio.run(main())
    """
)


async def _appender(db: Path | str, name: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _APPENDER,
        str(db),
        name,
        stdout=asyncio.subprocess.PIPE,
        cwd=REPO,
        env=child_env(),
    )


async def _read_until(proc: asyncio.subprocess.Process, count: int) -> int:
    """Lines read until `count` rows were appended by `proc`; the last row number seen."""
    assert proc.stdout is not None
    last = 0
    for _ in range(count):
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line, "the appender died"
        last = int(line)
    return last


async def test_appenders_killed_mid_append_leave_a_whole_chain(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    db = tmp_path / "parley.db"
    await (await open_store(db)).aclose()  # created and migrated before the appenders start
    await _kill_appenders(config, db)


async def test_appenders_killed_mid_append_on_postgresql(tmp_path: Path) -> None:
    """Two workers' appends on one PostgreSQL, both SIGKILLed: the chain is whole."""
    async with postgres_schema() as url:
        config = write_config(tmp_path)
        text = config.read_text().replace(f'path = "{tmp_path / "parley.db"}"', f'url = "{url}"')
        config.write_text(text)
        await (await open_store(url)).aclose()
        await _kill_appenders(config, url)


async def test_verify_fails_when_the_last_row_and_the_head_are_deleted_on_postgresql(
    tmp_path: Path,
) -> None:
    """The attack of issue 38 on PostgreSQL: with the triggers in place the head cannot
    be deleted nor the log truncated; with them dropped (as the owner can), deleting the
    last row and the head fails `parley audit --verify`."""
    import psycopg

    async with postgres_schema() as url:
        config = write_config(tmp_path)
        text = config.read_text().replace(f'path = "{tmp_path / "parley.db"}"', f'url = "{url}"')
        config.write_text(text)
        store = await open_store(url)
        for i in range(3):
            await AuditLog(store).append("command", "console", {"command": f"/provider p{i}"})
        await store.aclose()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            for refused in ("DELETE FROM audit_head", "TRUNCATE audit_log, audit_head"):
                with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                    await conn.execute(refused)
            await conn.execute("DROP TRIGGER audit_log_append_only ON audit_log")
            await conn.execute("DROP TRIGGER audit_head_follows_the_log ON audit_head")
            await conn.execute("DELETE FROM audit_log WHERE seq = 3")
            await conn.execute("DELETE FROM audit_head")
        code, out, _ = await parley("--config", str(config), "audit", "--verify", env=child_env())
    assert (code, out) == (
        1,
        "audit log BROKEN at row 3: the head row was removed; rows after 2 may have been "
        "removed with it\n",
    )


async def _kill_appenders(config: Path, target: Path | str) -> None:
    """Two processes append in a loop; each is SIGKILLed mid-stream; then `parley audit
    --verify` finds every row whole and chained."""
    first, second = await _appender(target, "a"), await _appender(target, "b")
    try:
        await _read_until(first, 30)
        first.send_signal(signal.SIGKILL)  # while both are appending
        seen = await _read_until(second, 30)
        second.send_signal(signal.SIGKILL)
    finally:
        for proc in (first, second):
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
    code, out, err = await parley("--config", str(config), "audit", "--verify", env=child_env())
    assert code == 0, out + err
    assert "audit log intact" in out
    count = int(out.split(":")[1].split()[0])
    assert count >= seen  # every row an appender saw committed is there


async def _verify_after(
    tmp_path: Path, triggers: list[str], *tampering: str, anchor: str = ""
) -> tuple[int, str]:
    """Three audit rows, then `tampering` done to the file past its guards `triggers` (as
    someone with the file would); `parley audit --verify`'s exit code and output."""
    config = write_config(tmp_path)
    store = await open_store(tmp_path / "parley.db")
    audit = AuditLog(store)
    for i in range(3):
        await audit.append("command", "console", {"command": f"/provider p{i}"})
    await store.aclose()
    conn = sqlite3.connect(tmp_path / "parley.db")
    for trigger in triggers:
        conn.execute(f"DROP TRIGGER {trigger}")
    for sql in tampering:
        conn.execute(sql)
    conn.commit()
    conn.close()
    more = ["--anchor", anchor] if anchor else []
    code, out, _ = await parley(
        "--config", str(config), "audit", "--verify", *more, env=child_env()
    )
    return code, out


async def test_verify_fails_naming_an_edited_row(tmp_path: Path) -> None:
    code, out = await _verify_after(
        tmp_path,
        ["audit_log_no_update"],
        "UPDATE audit_log SET actor = 'someone else' WHERE seq = 2",
    )
    assert code == 1
    assert "row 2 was changed" in out


async def test_verify_fails_naming_a_deleted_row(tmp_path: Path) -> None:
    code, out = await _verify_after(
        tmp_path, ["audit_log_no_delete"], "DELETE FROM audit_log WHERE seq = 1"
    )
    assert code == 1
    assert "row 1 was removed" in out


async def test_the_head_cannot_be_deleted_while_its_trigger_stands(tmp_path: Path) -> None:
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        await _verify_after(tmp_path, ["audit_log_no_delete"], "DELETE FROM audit_head")


async def test_verify_fails_when_the_last_row_and_the_head_are_deleted(tmp_path: Path) -> None:
    """The attack of issue 38: the last row and the head deleted (their triggers dropped
    first, as the file's owner can) no longer pass for a whole log."""
    code, out = await _verify_after(
        tmp_path,
        ["audit_log_no_delete", "audit_head_no_delete"],
        "DELETE FROM audit_log WHERE seq = 3",
        "DELETE FROM audit_head",
    )
    assert (code, out) == (
        1,
        "audit log BROKEN at row 3: the head row was removed; rows after 2 may have been "
        "removed with it\n",
    )


async def test_a_log_cut_back_with_its_head_fails_against_the_printed_anchor(
    tmp_path: Path,
) -> None:
    """`--verify` prints the head as SEQ:HASH; kept elsewhere and given back as
    `--anchor`, it shows a log whose last row was deleted and its head moved back (which
    alone reads as a whole, shorter log)."""
    config = write_config(tmp_path)
    store = await open_store(tmp_path / "parley.db")
    for i in range(3):
        await AuditLog(store).append("command", "console", {"command": f"/provider p{i}"})
    await store.aclose()
    verify = ("--config", str(config), "audit", "--verify")
    code, out, _ = await parley(*verify, env=child_env())
    assert code == 0
    anchor = out.rsplit("; head ", 1)[1].strip()
    assert anchor.startswith("3:")
    conn = sqlite3.connect(tmp_path / "parley.db")
    for trigger in ("audit_log_no_delete", "audit_head_follows_the_log"):
        conn.execute(f"DROP TRIGGER {trigger}")
    conn.execute("DELETE FROM audit_log WHERE seq = 3")
    conn.execute("UPDATE audit_head SET seq = 2, hash = (SELECT hash FROM audit_log WHERE seq = 2)")
    conn.commit()
    conn.close()
    code, out, _ = await parley(*verify, env=child_env())
    assert code == 0  # the edge the store alone cannot see
    code, out, _ = await parley(*verify, "--anchor", anchor, env=child_env())
    assert (code, out) == (
        1,
        "audit log BROKEN at row 3: row 3 was removed (the log ends at 2; the anchor names it)\n",
    )
    code, _, err = await parley(*verify, "--anchor", "3:xyz", env=child_env())
    assert code == 2
    assert "--anchor '3:xyz' is not SEQ:HASH" in err


async def test_audit_lists_entries_since(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    store = await open_store(tmp_path / "parley.db")
    audit = AuditLog(store)
    await audit.append("approval.granted", "slack:U1", {"tool": "bash"}, conv="slack:C1:")
    await store.aclose()
    code, out, _ = await parley("--config", str(config), "audit", "--since", "1h", env=child_env())
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["SEQ", "AT", "KIND", "ACTOR", "CONVERSATION", "DETAIL"]
    assert "approval.granted" in lines[1]
    assert '{"tool": "bash"}' in lines[1]
    code, out, _ = await parley(
        "--config", str(config), "audit", "--since", "2999-01-01", env=child_env()
    )
    assert (code, out) == (0, "No audit entries since then.\n")
    code, _, err = await parley(
        "--config", str(config), "audit", "--since", "soon", env=child_env()
    )
    assert code == 2
    assert "--since 'soon'" in err
