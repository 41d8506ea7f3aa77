"""The delay level table (RocketMQ's ``messageDelayLevel``), the retry ladder, and their
configuration: pure, no cluster."""

from __future__ import annotations

import doctest
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import given
from pydantic import ValidationError

from tickwheel.node.delivery import levels
from tickwheel.node.delivery.levels import (
    DEFAULT_LEVELS,
    UNIT_MS,
    DelayLevels,
    RetryPolicy,
    format_levels,
    parse_levels,
)
from tickwheel.node.settings.config import load

tokens = st.tuples(st.integers(0, 10_000), st.sampled_from(sorted(UNIT_MS)))
tables = st.lists(tokens, min_size=1, max_size=40)
separators = st.text(alphabet=" \t\n", min_size=1, max_size=3)


def test_the_module_example_runs() -> None:
    assert doctest.testmod(levels).failed == 0


def test_the_default_table_is_rocketmqs() -> None:
    seconds = [1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1_200, 1_800,
               3_600, 7_200]
    assert parse_levels(DEFAULT_LEVELS) == DelayLevels(tuple(s * 1_000 for s in seconds))
    assert format_levels(parse_levels(DEFAULT_LEVELS)) == DEFAULT_LEVELS


@given(tables, st.data())
def test_a_table_parses_to_its_delays_whatever_the_spacing(table: list, data: st.DataObject
                                                            ) -> None:
    text = "".join(f"{number}{unit}" + data.draw(separators) for number, unit in table)
    assert parse_levels(data.draw(separators) + text).delays_ms == tuple(
        number * UNIT_MS[unit] for number, unit in table)


@given(tables)
def test_format_and_parse_round_trip(table: list) -> None:
    parsed = parse_levels(" ".join(f"{number}{unit}" for number, unit in table))
    assert parse_levels(format_levels(parsed)) == parsed
    assert format_levels(parse_levels(format_levels(parsed))) == format_levels(parsed)


@given(tables, st.integers(0, 39), st.text(min_size=1, max_size=3).filter(
    # a unit starting with a digit would only extend the number ("0s" after "5" is "50s")
    lambda unit: unit not in UNIT_MS and not unit[-1:].isspace() and not unit[0].isdigit()))
def test_an_unknown_unit_is_rejected_naming_the_level(table: list, index: int,
                                                      unit: str) -> None:
    index %= len(table)
    parts = [f"{number}{u}" for number, u in table]
    parts[index] = f"{table[index][0]}{unit}"
    text = " ".join(parts)
    if len(text.split()) != len(table):
        return  # the drawn unit held whitespace and split the token: not the case under test
    with pytest.raises(ValueError, match=f"level {index + 1} is"):
        parse_levels(text)


@pytest.mark.parametrize("text", ["", "   ", "\n"])
def test_an_empty_table_is_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="empty"):
        parse_levels(text)


@pytest.mark.parametrize("text", ["5", "s", "1.5s", "-1s", "1s5s", "1 s"])
def test_a_level_without_a_whole_number_and_one_unit_is_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="not a whole number"):
        parse_levels(text)


def test_a_level_above_the_last_is_clamped() -> None:
    table = parse_levels(DEFAULT_LEVELS)
    assert table.delay_ms(18) == (7_200_000, 18)
    assert table.delay_ms(19) == table.delay_ms(1_000) == (7_200_000, 18)


def test_the_default_ladder_starts_at_level_3_and_dead_letters_after_16_attempts() -> None:
    policy = RetryPolicy(parse_levels(DEFAULT_LEVELS))
    steps = [policy.next_copy("orders", attempt) for attempt in range(1, 17)]
    assert [delay_ms for _, delay_ms in steps[:4]] == [10_000, 30_000, 60_000, 120_000]
    assert steps[14] == ("orders", 3_600_000)  # attempt 15 waits level 17, 1 h
    assert steps[15] == ("%DLQ%orders", 0)
    # a dead letter nacked again stays in the dead-letter topic, on the ladder's last step
    assert policy.next_copy("%DLQ%orders", 17) == ("%DLQ%orders", 7_200_000)


def test_a_ladder_that_does_not_fit_its_table_is_refused() -> None:
    with pytest.raises(ValueError, match="retry_start_level"):
        RetryPolicy(parse_levels("1s 2s"), start_level=3)
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(parse_levels("1s 2s"), start_level=1, max_attempts=0)


def test_level_settings_come_from_flags_env_and_toml_and_fail_at_start_up(
        tmp_path: Path, tls_env: pytest.MonkeyPatch) -> None:
    monkeypatch = tls_env
    config = tmp_path / "node.toml"
    config.write_text('delay_levels = "1s 2s 3s"\nmax_attempts = 5\n')
    monkeypatch.setenv("TICKWHEEL_RETRY_START_LEVEL", "2")
    policy = load(config, {}).retry_policy()
    assert (policy.levels.delays_ms, policy.start_level, policy.max_attempts) == (
        (1_000, 2_000, 3_000), 2, 5)
    assert load(config, {"max_attempts": 7}).retry_policy().max_attempts == 7
    for bad, message in [({"delay_levels": "1s 2w"}, "level 2 is '2w'"),
                         ({"delay_levels": ""}, "empty"),
                         ({"retry_start_level": 4}, "retry_start_level is 4"),
                         ({"delay_levels": "1s 400d"}, "beyond max_delay_ms")]:
        with pytest.raises(ValidationError, match=message):
            load(config, bad)
