import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.parsing import MAX_DROPPED_RECORDED, format_response, parse_response

MOVES = ("Up", "Down", "Left", "Right")
RAGEN_THINK = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
RAGEN_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def test_think_and_answer_with_case_insensitive_actions():
    parsed = parse_response("<think>go up</think>\n <answer> up || LEFT </answer>", vocabulary=MOVES, max_actions=3)
    assert parsed.format_ok and parsed.error is None
    assert parsed.think == "go up"
    assert parsed.actions == ("Up", "Left")  # canonical spelling
    assert parsed.dropped == ()


def test_invalid_actions_are_dropped_with_a_reason():
    parsed = parse_response("<think></think><answer>Up || jump || Down</answer>", vocabulary=MOVES, max_actions=5)
    assert parsed.actions == ("Up", "Down")
    assert [(d.text, d.reason) for d in parsed.dropped] == [("jump", "not in the action vocabulary")]


def test_actions_beyond_the_turn_limit_are_dropped_before_validation():
    # RAGEN truncates to max_actions_per_turn first, then validates: "jump" uses up a slot.
    parsed = parse_response("<think></think><answer>jump || Up || Down</answer>", vocabulary=MOVES, max_actions=2)
    assert parsed.actions == ("Up",)
    assert [(d.text, d.reason) for d in parsed.dropped] == [
        ("jump", "not in the action vocabulary"),
        ("Down", "beyond max_actions_per_turn=2"),
    ]


def test_num_invalid_counts_rejected_pieces_inside_the_turn_limit_only():
    # "jump" is invalid; "Down" is beyond the limit, which RAGEN truncates before checking.
    parsed = parse_response("<think></think><answer>jump || Up || Down</answer>", vocabulary=MOVES, max_actions=2)
    assert (parsed.num_invalid, parsed.num_dropped) == (1, 2)
    assert parse_response("<think></think><answer>Up || Down</answer>", vocabulary=MOVES,
                          max_actions=1).num_invalid == 0
    assert parse_response("<think></think><answer>any text</answer>").num_invalid == 0  # free-form


def test_empty_pieces_between_separators_are_ignored():
    parsed = parse_response("<think>x</think><answer>|| Up ||  || Left ||</answer>", vocabulary=MOVES, max_actions=5)
    assert parsed.actions == ("Up", "Left")
    assert parsed.num_dropped == 0


@pytest.mark.parametrize(
    "text, error",
    [
        ("Up", "no <think> tag"),
        ("<think>never closed <answer>Up</answer>", "<think> is never closed"),
        ("<think>a</think> chatter <answer>Up</answer>", "no <answer> directly after </think>"),
        ("<think>a</think><answer>Up", "<answer> is never closed"),
        ("<think>a</think><answer>  </answer>", "empty answer"),
        ("<think>a</think><answer>fly</answer>", "no valid action"),
    ],
)
def test_malformed_turns_say_what_is_wrong(text, error):
    parsed = parse_response(text, vocabulary=MOVES, max_actions=3)
    assert parsed.actions == ()
    assert parsed.error == error


def test_reasoning_runs_to_the_first_close_that_precedes_an_answer():
    text = "<think>a</think> aside <think>b</think> <answer>Up</answer> tail"
    parsed = parse_response(text, vocabulary=MOVES)
    assert parsed.think == "a</think> aside <think>b"
    assert parsed.actions == ("Up",)


def test_answer_only_mode_ignores_think():
    parsed = parse_response("chatter <answer>Down</answer>", vocabulary=MOVES, require_think=False)
    assert parsed.actions == ("Down",)
    assert parse_response("<answer>Down", vocabulary=MOVES, require_think=False).error == "<answer> is never closed"


def test_free_form_answers_keep_the_text():
    parsed = parse_response("<think>t</think><answer> 3 * (4 + 2) </answer>", vocabulary=None)
    assert parsed.actions == ("3 * (4 + 2)",)


def test_non_string_input_is_an_error_not_a_crash():
    parsed = parse_response(None, vocabulary=MOVES)  # type: ignore[arg-type]
    assert not parsed.format_ok and "NoneType" in parsed.error


def test_a_separator_storm_records_a_bounded_number_of_drops():
    parsed = parse_response("<think></think><answer>" + " || ".join(["x"] * 10_000) + "</answer>",
                            vocabulary=MOVES, max_actions=10_000)
    assert parsed.num_dropped == 10_000
    assert len(parsed.dropped) == MAX_DROPPED_RECORDED
    info = parsed.to_info()
    assert info["num_dropped"] == 10_000 and len(info["dropped"]) == MAX_DROPPED_RECORDED


def test_info_clips_huge_answers():
    parsed = parse_response("<think></think><answer>" + "z" * 100_000 + "</answer>", vocabulary=None)
    assert len(parsed.to_info()["answer"]) < 300


def test_hostile_nesting_is_linear_time():
    # 200k unclosed tags would take quadratic time with a backtracking regex.
    parsed = parse_response("<think>" * 200_000 + "</think>" * 200_000, vocabulary=MOVES)
    assert parsed.error == "no <answer> directly after </think>"


@given(st.lists(st.sampled_from(MOVES), min_size=1, max_size=4), st.text(max_size=30).filter(
    lambda s: "</think>" not in s))
def test_format_then_parse_round_trips(actions, think):
    parsed = parse_response(format_response(actions, think=think), vocabulary=MOVES, max_actions=4)
    assert parsed.actions == tuple(actions)
    assert parsed.think == think


PIECES = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "Up", "a", "||", "<"]


@settings(max_examples=400)
@given(st.lists(st.sampled_from(PIECES), max_size=14))
def test_matches_ragens_regex_exactly(pieces):
    text = "".join(pieces)
    parsed = parse_response(text, vocabulary=None, max_actions=99)
    match = RAGEN_THINK.search(text)
    if match is None:
        assert not parsed.format_ok
    else:
        assert parsed.format_ok and (parsed.think, parsed.answer) == match.groups()
    answer_only = parse_response(text, vocabulary=None, require_think=False)
    match = RAGEN_ANSWER.search(text)
    assert (answer_only.answer if answer_only.format_ok else None) == (match.group(1) if match else None)


@given(st.text(max_size=3000))
def test_arbitrary_text_never_raises(text):
    parsed = parse_response(text, vocabulary=MOVES, max_actions=3)
    assert set(parsed.actions) <= set(MOVES)
    assert parsed.format_ok or parsed.error
