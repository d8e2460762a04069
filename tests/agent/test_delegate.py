"""Delegation (docs/delegation-memory.md): `delegate` starts child runs in parallel, each a durable
run in
its own lane, bounded by the parent's tools, budget, depth and count, cancelled with the
parent, and reported back as one tool result. The real agent on the fake LLM."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from core.agent import Agent
from core.agent.children import child_conv
from core.store import RunRow
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.delegatekit import PARENT, Scripts, delegate
from tests.fakes.llm import FakeLLM, Fault, Reply, ToolCallSpec
from tests.helpers import pids_running

CONV = "test:c1:"


async def _children(agent: Agent, parent: str) -> list[RunRow]:
    await agent.store.flush()
    return await agent.store.child_runs(parent)


def _events(tmp_path: Path) -> list[dict[str, Any]]:
    """The events log, in the order the events happened."""
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


async def test_parallel_children_finish_and_report_as_one_tool_result(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    scripts = Scripts()
    fake_llm.responder = scripts
    scripts.parent.extend(
        [
            Reply(
                tool_calls=[delegate("alpha: count the files", "beta: list the dir", call_id="d1")]
            ),
            Reply(text="Both children reported."),
        ]
    )
    # alpha answers only once beta has called the model: run one after the other, they
    # could never both finish.
    scripts.child("alpha", scripts.after("beta", Reply(text="alpha found 3 files")))
    scripts.child(
        "beta",
        Reply(tool_calls=[ToolCallSpec("list_directory", {"path": "."}, id="b1")]),
        Reply(text="beta listed the dir"),
    )
    async with running_agent(fake_llm, tmp_path) as agent:
        report = await agent.run(inbound("split the work"))
        assert (report.state, report.text) == ("completed", "Both children reported.")
        result = scripts.tool_results(PARENT)["d1"]
        assert result.startswith("2 child runs: 2 completed.")
        assert "## Child 1: completed" in result
        assert "alpha found 3 files" in result
        assert "beta listed the dir" in result
        children = await _children(agent, report.run_id)
        assert [c.state for c in children] == ["completed", "completed"]
        assert {c.trigger for c in children} == {"child"}
        assert [c.conv for c in children] == [child_conv(CONV, c.id) for c in children]
        assert children[0].text == "alpha found 3 files"
        assert [r.state for r in await agent.store.runs(conv=CONV)] == ["completed"]
    events = _events(tmp_path)
    ids = {c.id for c in children}
    started = [
        i for i, e in enumerate(events) if e["event"] == "agent_run.started" and e["run_id"] in ids
    ]
    ended = [
        i
        for i, e in enumerate(events)
        if e["event"] == "agent_run.completed" and e["run_id"] in ids
    ]
    assert len(started) == len(ended) == 2
    assert max(started) < min(ended)  # both were running at once
    for index in started + ended:
        assert events[index]["parent_run_id"] == report.run_id
    names = [e["event"] for e in events if e["run_id"] == report.run_id]
    assert names.index("agent.delegate.started") < names.index("agent.delegate.finished")
    finished = next(e for e in events if e["event"] == "agent.delegate.finished")
    assert finished["states"] == {c.id: "completed" for c in children}


async def test_a_child_crash_is_isolated_and_reported_as_failed(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    scripts = Scripts()
    fake_llm.responder = scripts
    scripts.parent.extend(
        [
            Reply(tool_calls=[delegate("alpha: do it", "beta: do it too", call_id="d1")]),
            Reply(text="One child failed."),
        ]
    )
    scripts.child("alpha", scripts.after("beta", Reply(text="alpha is fine")))
    scripts.child("beta", Reply(fault=Fault(status=400, message="bad request from beta")))
    async with running_agent(fake_llm, tmp_path) as agent:
        report = await agent.run(inbound("split the work"))
        assert report.state == "completed"
        result = scripts.tool_results(PARENT)["d1"]
        assert "1 completed, 1 failed" in result
        assert "alpha is fine" in result
        assert "## Child 2: failed" in result
        assert "bad request from beta" in result
        children = await _children(agent, report.run_id)
        assert [c.state for c in children] == ["completed", "failed"]


async def test_stop_on_the_parent_cancels_every_child_and_its_tool_processes(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    scripts = Scripts()
    fake_llm.responder = scripts
    scripts.parent.append(Reply(tool_calls=[delegate("alpha: wait", "beta: wait", call_id="d1")]))
    # Each sleeper is found by its command line: inside its PID namespace `$$` is not the
    # host's pid.
    naps = {"alpha": "600.101", "beta": "600.102"}
    for key, nap in naps.items():
        command = f"touch {key}.started; exec sleep {nap}"
        scripts.child(key, Reply(tool_calls=[ToolCallSpec("bash", {"command": command})]))
    workspace = tmp_path / "workspace"
    chat = RecordingResponder()
    async with running_agent(fake_llm, tmp_path, agent={"cancel_grace_seconds": 0.1}) as agent:
        await agent.submit(inbound("split the work"), chat)
        async with asyncio.timeout(20):
            while len(sleepers := [p for n in naps.values() for p in pids_running("sleep", n)]) < 2:
                await asyncio.sleep(0.02)
        assert all((workspace / f"{key}.started").exists() for key in naps)
        await agent.submit(inbound("/stop"), chat)
        await agent.wait_idle()
        [parent] = await agent.store.runs(conv=CONV)
        assert parent.state == "cancelled"
        assert [c.state for c in await _children(agent, parent.id)] == ["cancelled", "cancelled"]
        for pid in sleepers:
            assert not _alive(pid)
        assert chat.finals == ["Stopped."]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


async def test_children_get_no_delegate_tool_at_the_default_depth(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    scripts = Scripts()
    fake_llm.responder = scripts
    scripts.parent.extend(
        [Reply(tool_calls=[delegate("alpha: go deeper", call_id="d1")]), Reply(text="done")]
    )
    scripts.child(
        "alpha",
        Reply(tool_calls=[delegate("gamma: deeper still", call_id="g1")]),
        Reply(text="I could not delegate"),
    )
    async with running_agent(fake_llm, tmp_path) as agent:
        report = await agent.run(inbound("go"))
        assert report.state == "completed"
        assert "delegate" in scripts.tools_offered(PARENT)
        assert "delegate" not in scripts.tools_offered("alpha")
        assert "unknown tool `delegate`" in scripts.tool_results("alpha")["g1"]
        [child] = await _children(agent, report.run_id)
        assert await agent.store.child_runs(child.id) == []


async def test_max_depth_two_lets_children_delegate_once_more(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    scripts = Scripts()
    fake_llm.responder = scripts
    scripts.parent.extend(
        [Reply(tool_calls=[delegate("alpha: go deeper", call_id="d1")]), Reply(text="done")]
    )
    scripts.child(
        "alpha",
        Reply(tool_calls=[delegate("gamma: deeper still", call_id="g1")]),
        Reply(text="alpha done"),
    )
    scripts.child("gamma", Reply(text="gamma done"))
    async with running_agent(fake_llm, tmp_path, agent={"max_depth": 2}) as agent:
        report = await agent.run(inbound("go"))
        assert report.state == "completed"
        assert "delegate" not in scripts.tools_offered("gamma")  # depth 2: no further
        assert "gamma done" in scripts.tool_results("alpha")["g1"]
        [child] = await _children(agent, report.run_id)
        [grandchild] = await agent.store.child_runs(child.id)
        assert grandchild.state == "completed"
        assert grandchild.conv == child_conv(child.conv, grandchild.id)


async def test_more_tasks_than_max_children_is_an_error_for_the_model(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    scripts = Scripts()
    fake_llm.responder = scripts
    scripts.parent.extend(
        [Reply(tool_calls=[delegate("a", "b", "c", call_id="d1")]), Reply(text="too many")]
    )
    async with running_agent(fake_llm, tmp_path, agent={"max_children": 2}) as agent:
        report = await agent.run(inbound("go"))
        assert report.state == "completed"
        result = scripts.tool_results(PARENT)["d1"]
        assert "at most 2 child runs" in result
        assert await _children(agent, report.run_id) == []
        spec = next(
            t
            for t in scripts.requests[PARENT][0].json["tools"]
            if t["function"]["name"] == "delegate"
        )
        assert spec["function"]["parameters"]["properties"]["tasks"]["maxItems"] == 2


async def test_a_child_gets_only_the_tools_it_asks_for_and_its_budget_is_capped(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    scripts = Scripts()
    fake_llm.responder = scripts
    task = {"instruction": "alpha: read only", "tools": ["read_file"], "max_iterations": 99}
    scripts.parent.extend([Reply(tool_calls=[delegate(task, call_id="d1")]), Reply(text="ok")])
    looping = [Reply(tool_calls=[ToolCallSpec("read_file", {"path": f"f{i}"})]) for i in range(3)]
    scripts.child("alpha", *looping)
    config = {"agent": {"max_iterations": 3, "loop_detection": False}}
    async with running_agent(fake_llm, tmp_path, **config) as agent:
        report = await agent.run(inbound("go"))
        assert report.state == "completed"
        assert scripts.tools_offered("alpha") == ["read_file"]
        assert len(scripts.requests["alpha"]) == 3  # the parent's budget, not 99
        assert "maximum iteration limit" in scripts.tool_results(PARENT)["d1"]


async def test_a_child_cannot_run_an_admin_action_it_has_nobody_to_ask(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    scripts = Scripts()
    fake_llm.responder = scripts
    scripts.parent.extend(
        [Reply(tool_calls=[delegate("alpha: clean", call_id="d1")]), Reply(text="ok")]
    )
    victim = tmp_path / "workspace" / "keep"
    victim.mkdir(parents=True)
    rm = ToolCallSpec("bash", {"command": "rm -rf keep"}, id="rm")
    scripts.child("alpha", Reply(tool_calls=[rm]), Reply(text="could not clean"))
    chat = RecordingResponder(approve_with=True)
    async with running_agent(fake_llm, tmp_path) as agent:
        await agent.submit(inbound("go"), chat)
        await agent.wait_idle()
        assert "nobody to ask" in scripts.tool_results("alpha")["rm"]
        assert chat.approvals == []
        assert victim.exists()


WAIT_TOOL = """
tools:
  - name: wait_for_go
    description: "Wait until the file go exists."
    category: write  # it leaves a mark in the workspace, which read tools cannot write
    idempotent: true
    cmd: sh
    args: ["-c", "echo waited >> waits.txt; while [ ! -f go ]; do sleep 0.05; done; echo ready"]
    timeout: 60
    parameters: {}
"""


async def test_a_restart_mid_delegation_resumes_the_children_with_the_parent(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    tools = tmp_path / "tools.yaml"
    tools.write_text(WAIT_TOOL)
    scripts = Scripts()
    fake_llm.responder = scripts
    scripts.parent.extend(
        [
            Reply(tool_calls=[delegate("alpha: answer", "beta: wait", call_id="d1")]),
            Reply(text="both done"),
        ]
    )
    scripts.child("alpha", Reply(text="alpha answered"))
    scripts.child(
        "beta",
        Reply(tool_calls=[ToolCallSpec("wait_for_go", {}, id="w1")]),
        Reply(text="beta done"),
    )
    workspace = tmp_path / "workspace"
    config: dict[str, Any] = {"tools": {"tools_file": str(tools)}}
    chat = RecordingResponder()
    async with running_agent(fake_llm, tmp_path, shutdown_grace=0.1, **config) as agent:
        await agent.submit(inbound("split the work"), chat)
        async with asyncio.timeout(20):
            while not (workspace / "waits.txt").exists() or "alpha" not in scripts.arrived:
                await asyncio.sleep(0.02)
            while [c.state for c in await agent.store.runs(states=["completed"])] == []:
                await asyncio.sleep(0.02)
    # The restart closed the open calls "cancelled"; the parent and beta stay resumable.
    (workspace / "go").touch()  # in case a tool process outlived the shutdown
    async with running_agent(fake_llm, tmp_path, responders=lambda key: chat, **config) as agent:
        await agent.reconcile()
        [parent] = await agent.store.runs(conv=CONV)
        assert (parent.state, parent.resumable) == ("timed_out", True)
        await agent.submit(inbound("/resume"), chat)
        await agent.wait_idle()
        assert chat.finals[-1] == "both done"
        assert len(scripts.requests["alpha"]) == 1  # replayed, not run again
        assert len(scripts.requests["beta"]) == 2  # resumed from its checkpoint
        result = scripts.tool_results(PARENT)["d1"]
        assert "2 completed" in result
        assert "alpha answered" in result
        assert "beta done" in result
        children = await _children(agent, parent.id)
        assert [c.state for c in children] == ["completed", "completed"]
        # Like any run resumed after a restart, beta sees its cut-off call as cancelled.
        assert "cancelled" in scripts.tool_results("beta")["w1"]
        assert (workspace / "waits.txt").read_text() == "waited\n"


async def test_a_long_child_answer_is_cut_and_kept_whole_in_an_artifact(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    scripts = Scripts()
    fake_llm.responder = scripts
    scripts.parent.extend(
        [Reply(tool_calls=[delegate("alpha: talk", call_id="d1")]), Reply(text="ok")]
    )
    long_answer = "HEAD " + "x" * 40_000 + " TAIL"
    scripts.child("alpha", Reply(text=long_answer, chunk_size=4096))
    # Room for the result as it is: no compaction, no TACO summary of a large tool output.
    roomy = {
        "providers": {"fake": {"context_window": 200_000}},
        "context": {"taco_threshold": 50_000},
    }
    async with running_agent(fake_llm, tmp_path, **roomy) as agent:
        report = await agent.run(inbound("go"))
        assert report.state == "completed"
        result = scripts.tool_results(PARENT)["d1"]
        assert len(result) < 20_000
        assert "HEAD" in result
        assert "TAIL" in result
        [child] = await _children(agent, report.run_id)
        # In the conversation's own artifacts dir, which its tools may read.
        [artifact] = (tmp_path / "artifacts").glob(f"*/child-{child.id}.txt")
        assert f"full output in {artifact}" in result
        assert artifact.read_text() == long_answer
