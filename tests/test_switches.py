"""catchat/vk/switches.py: the 0/1 environment switches and a variable set for one `with`."""

import pytest

from catchat.errors import UsageError
from catchat.vk.switches import env_choice, env_count, env_override, env_switch


def test_a_switch_is_on_off_or_unset_and_anything_else_is_a_usage_error(monkeypatch):
    monkeypatch.delenv("CATCHAT_TEST_SWITCH", raising=False)
    assert env_switch("CATCHAT_TEST_SWITCH", "hint") is None
    for raw, on in (("1", True), (" 0 ", False), ("", None)):
        monkeypatch.setenv("CATCHAT_TEST_SWITCH", raw)
        assert env_switch("CATCHAT_TEST_SWITCH", "hint") is on
    for raw, on in (("1", True), ("0", False), ("", True)):  # a default stands only where unset
        monkeypatch.setenv("CATCHAT_TEST_SWITCH", raw)
        assert env_switch("CATCHAT_TEST_SWITCH", "hint", True) is on
    monkeypatch.setenv("CATCHAT_TEST_SWITCH", "yes")
    with pytest.raises(UsageError, match="CATCHAT_TEST_SWITCH='yes' is not 0 or 1"):
        env_switch("CATCHAT_TEST_SWITCH", "hint")


def test_a_choice_is_one_of_its_numbers_or_the_default(monkeypatch):
    monkeypatch.delenv("CATCHAT_TEST_CHOICE", raising=False)
    assert env_choice("CATCHAT_TEST_CHOICE", (16, 32, 64), 32) == 32
    for raw, got in ((" 64 ", 64), ("16", 16), ("", 32)):
        monkeypatch.setenv("CATCHAT_TEST_CHOICE", raw)
        assert env_choice("CATCHAT_TEST_CHOICE", (16, 32, 64), 32) == got
    for raw in ("48", "x", "032"):
        monkeypatch.setenv("CATCHAT_TEST_CHOICE", raw)
        with pytest.raises(UsageError, match=f"CATCHAT_TEST_CHOICE='{raw}' is not one of 16, 32, 64"):
            env_choice("CATCHAT_TEST_CHOICE", (16, 32, 64), 32)


def test_a_count_is_a_whole_number_from_its_floor_or_none(monkeypatch):
    monkeypatch.delenv("CATCHAT_TEST_COUNT", raising=False)
    assert env_count("CATCHAT_TEST_COUNT", "hint") is None
    for raw, got in ((" 7 ", 7), ("1", 1), ("", None)):
        monkeypatch.setenv("CATCHAT_TEST_COUNT", raw)
        assert env_count("CATCHAT_TEST_COUNT", "hint") == got
    for raw in ("0", "-3", "2.5", "x"):
        monkeypatch.setenv("CATCHAT_TEST_COUNT", raw)
        with pytest.raises(UsageError, match=f"CATCHAT_TEST_COUNT='{raw}' is not a whole number of at least 1"):
            env_count("CATCHAT_TEST_COUNT", "hint")


def test_an_override_lasts_for_its_with_and_restores_set_and_unset_values(monkeypatch):
    import os

    monkeypatch.delenv("CATCHAT_TEST_OVERRIDE", raising=False)
    with env_override("CATCHAT_TEST_OVERRIDE", "a"):
        assert os.environ["CATCHAT_TEST_OVERRIDE"] == "a"
    assert "CATCHAT_TEST_OVERRIDE" not in os.environ
    monkeypatch.setenv("CATCHAT_TEST_OVERRIDE", "before")
    with pytest.raises(RuntimeError):
        with env_override("CATCHAT_TEST_OVERRIDE", "b"):
            assert os.environ["CATCHAT_TEST_OVERRIDE"] == "b"
            raise RuntimeError("inside")
    assert os.environ["CATCHAT_TEST_OVERRIDE"] == "before"
