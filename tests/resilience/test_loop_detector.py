"""Tool-loop detection (docs/durability.md): identical and pattern thrash, the escalation ladder,
the doom loop, argument normalisation."""

from __future__ import annotations

import json
from itertools import count

from hypothesis import given
from hypothesis import strategies as st

from core.events import LoopEvent, Observed
from core.messages import Message, ToolCall
from core.resilience import LoopDetector, LoopVerdict, normalise_arguments, stop_message

_ids = count()


def feed(
    detector: LoopDetector, name: str, arguments: str, result: str | None = None
) -> LoopVerdict | None:
    """One call and its result; by default every result differs (no doom loop)."""
    call = ToolCall(id=f"c{next(_ids)}", name=name, arguments=arguments)
    text = result if result is not None else f"result {next(_ids)}"
    return detector.observe(call, Message.tool_result(call, text))


def repeat_identical(detector: LoopDetector) -> list[LoopVerdict | None]:
    """search(q) three times, interleaved with other tools so it is not consecutive."""
    return [
        feed(detector, "search", '{"q": "x"}'),
        feed(detector, "read_file", '{"path": "a"}'),
        feed(detector, "search", '{"q": "x"}'),
        feed(detector, "list_dir", '{"path": "."}'),
        feed(detector, "search", '{"q": "x"}'),
    ]


def test_identical_thrash_escalates_one_two_three() -> None:
    events: list[LoopEvent] = []
    detector = LoopDetector(sink=events.append)
    verdicts = []
    for _ in range(3):
        seen = repeat_identical(detector)
        assert seen[:-1] == [None] * 4
        verdicts.append(seen[-1])
    assert [(v.level, v.kind, v.tool) for v in verdicts if v] == [
        (1, "identical", "search"),
        (2, "identical", "search"),
        (3, "identical", "search"),
    ]
    first, second, third = (v for v in verdicts if v)
    assert first.message.startswith("You have called `search` with the same arguments 3 times")
    assert "will not change" in first.message
    assert second.message.startswith("Stop calling `search`.")
    assert not first.stops
    assert not second.stops
    assert third.stops
    assert third.message == stop_message(third)
    assert third.message.startswith("Stopped:")
    assert [e.data["level"] for e in events if isinstance(e, Observed)] == [1, 2, 3]
    assert all(isinstance(e, Observed) and e.name == "agent.loop.detected" for e in events)


def test_level_stays_at_three() -> None:
    detector = LoopDetector()
    for _ in range(3):
        repeat_identical(detector)
    verdict = repeat_identical(detector)[-1]
    assert verdict is not None
    assert verdict.level == 3


def test_window_is_cleared_after_a_detection() -> None:
    detector = LoopDetector()
    assert repeat_identical(detector)[-1] is not None
    # The same call again right away is not reported a second time.
    assert feed(detector, "search", '{"q": "x"}') is None
    assert feed(detector, "search", '{"q": "x"}') is None


def test_pattern_thrash_with_differing_arguments() -> None:
    events: list[LoopEvent] = []
    detector = LoopDetector(sink=events.append)
    queries = ["a", "b", "other", "c", "d"]
    verdicts = [
        feed(detector, "other" if q == "other" else "search", json.dumps({"q": q}), "no results")
        for q in queries
    ]
    assert verdicts[:-1] == [None] * 4
    verdict = verdicts[-1]
    assert verdict is not None
    assert (verdict.level, verdict.kind, verdict.tool, verdict.count) == (1, "pattern", "search", 4)
    assert "varying arguments" in verdict.message
    assert isinstance(events[0], Observed)
    assert events[0].data["tier"] == "pattern"


def test_pattern_needs_the_calls_within_the_window() -> None:
    detector = LoopDetector()
    feed(detector, "search", '{"q": "a"}', "")
    feed(detector, "search", '{"q": "b"}', "")
    for i in range(4):
        assert feed(detector, f"t{i}", "{}") is None
    assert feed(detector, "search", '{"q": "c"}', "") is None
    assert feed(detector, "search", '{"q": "d"}', "") is None


def test_variations_that_each_find_something_new_are_progress_not_thrash() -> None:
    detector = LoopDetector()
    for i in range(20):
        assert feed(detector, "read_file", json.dumps({"path": f"f{i}.py"})) is None


def test_variations_that_fail_or_find_nothing_new_are_thrash() -> None:
    for results in (["error"] * 4, ["", " ", "", ""], ["same", "same", "same", "same"]):
        detector = LoopDetector()
        verdicts = []
        for i, text in enumerate(results):
            call = ToolCall(id=f"e{i}", name="search", arguments=json.dumps({"q": i}))
            is_error = text == "error"
            verdicts.append(
                detector.observe(call, Message.tool_result(call, text, is_error=is_error))
            )
        assert verdicts[-1] is not None, results
        assert verdicts[-1].kind == "pattern"


def test_doom_loop_stops_at_once() -> None:
    detector = LoopDetector()
    same = ('{"command": "make test"}', "exit 2: failed")
    assert feed(detector, "bash", *same) is None
    assert feed(detector, "bash", *same) is None
    verdict = feed(detector, "bash", *same)
    assert verdict is not None
    assert (verdict.kind, verdict.level, verdict.stops) == ("doom", 3, True)
    assert verdict.message == (
        "Stopped: the agent called `bash` with the same arguments 3 times "
        "and got the same result each time."
    )


def test_identical_consecutive_calls_with_changing_results_are_thrash_not_doom() -> None:
    detector = LoopDetector()
    feed(detector, "clock", "{}")
    feed(detector, "clock", "{}")
    verdict = feed(detector, "clock", "{}")
    assert verdict is not None
    assert verdict.kind == "identical"
    assert verdict.level == 1


def test_doom_counts_only_consecutive_calls() -> None:
    detector = LoopDetector()
    feed(detector, "bash", '{"command": "ls"}', "same")
    feed(detector, "bash", '{"command": "ls"}', "same")
    feed(detector, "read_file", '{"path": "a"}')
    verdict = feed(detector, "bash", '{"command": "ls"}', "same")
    assert verdict is not None
    assert verdict.kind == "identical"


def test_normalised_arguments_count_as_identical() -> None:
    detector = LoopDetector()
    feed(detector, "f", '{"a":1,"b":2}')
    feed(detector, "f", '{"b": 2, "a": 1}')
    verdict = feed(detector, "f", '{ "a" : 1 , "b" : 2 }')
    assert verdict is not None
    assert verdict.kind == "identical"


def test_whitespace_inside_strings_is_collapsed() -> None:
    assert normalise_arguments('{"command": "ls   -la\\n"}') == normalise_arguments(
        '{"command": "ls -la"}'
    )
    assert normalise_arguments("not json  at\tall") == "not json at all"
    assert normalise_arguments("") == normalise_arguments("{}")


@given(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=8), max_size=5))
def test_normalisation_ignores_key_order(data: dict[str, object]) -> None:
    forward = json.dumps(data)
    backward = json.dumps(dict(reversed(list(data.items()))), indent=2)
    assert normalise_arguments(forward) == normalise_arguments(backward)


def test_interleaved_different_tools_do_not_trigger() -> None:
    detector = LoopDetector()
    for i in range(30):
        tool = ["search", "read_file", "list_dir"][i % 3]
        assert feed(detector, tool, json.dumps({"q": i})) is None


def test_reset_clears_window_and_level() -> None:
    detector = LoopDetector()
    repeat_identical(detector)
    feed(detector, "search", '{"q": "x"}')
    feed(detector, "search", '{"q": "x"}')
    detector.reset()
    assert detector.level == 0
    # Two searches before the reset no longer count towards the next detection.
    seen = repeat_identical(detector)
    assert seen[:-1] == [None] * 4
    verdict = seen[-1]
    assert verdict is not None
    assert verdict.level == 1


def test_stop_messages_name_the_tool_and_the_reason() -> None:
    identical = stop_message(LoopVerdict(3, "identical", "search", "", 3))
    pattern = stop_message(LoopVerdict(3, "pattern", "search", "", 4))
    assert "`search` with the same arguments" in identical
    assert "`search` with varying arguments" in pattern
