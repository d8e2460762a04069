"""`parley usage` as a user runs it: a table or CSV of what the store's calls cost."""

from __future__ import annotations

import time
from pathlib import Path

from core.store import LlmCall, SqliteStore
from tests.process import child_env, parley, write_config


async def test_parley_usage_sums_the_calls_by_user_as_csv_and_as_a_table(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    store = await SqliteStore.open(tmp_path / "parley.db")
    now = time.time()
    for user, cost in (("slack:U1", 0.25), ("slack:U2", 0.5), ("slack:U1", 0.125)):
        store.record_llm_call(
            LlmCall(now, "r", "c", user, "slack:C1", "", "p", "m", 1000, 600, 0, 10, cost)
        )
    store.record_llm_call(
        LlmCall(now - 90 * 86400, "r", "c", "slack:U3", "", "", "p", "m", 1, 0, 0, 1, 9.0)
    )
    await store.aclose()
    code, out, err = await parley(
        "--config", str(config), "usage", "--by", "user", "--since", "30d", "--csv", env=child_env()
    )
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "user,calls,input,cached,cache_write,output,cost_usd,unpriced",
        "slack:U2,1,1000,600,0,10,0.500000,0",
        "slack:U1,2,2000,1200,0,20,0.375000,0",
        "total,3,3000,1800,0,30,0.875000,0",
    ]
    code, out, _ = await parley("--config", str(config), "usage", "--since", "30d", env=child_env())
    assert code == 0
    assert out.splitlines()[-1].split() == [
        "total",
        "3",
        "3000",
        "1800",
        "0",
        "30",
        "0.875000",
        "0",
    ]
    code, _, err = await parley(
        "--config", str(config), "usage", "--since", "lately", env=child_env()
    )
    assert code == 2
    assert "--since 'lately'" in err
