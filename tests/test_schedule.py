"""WSD schedule (lesson 2: a pure function of the absolute step) and boundary-crossing intervals (lesson 4)."""

import math
import random

import pytest

from catchat import config
from catchat.run import schedule
from catchat.run.schedule import WSD, interval_crossed, lr_at

COS = WSD(lr=1.0, warmup_fraction=0.1, cooldown_fraction=0.2, cooldown_shape="cosine", lr_min=0.1)
LIN = WSD(lr=1.0, warmup_fraction=0.1, cooldown_fraction=0.2, cooldown_shape="linear", lr_min=0.1)


def test_phases():
    p = schedule.phases(100, COS)
    assert (p.warmup_end, p.cooldown_start, p.total_steps) == (10, 80, 100)
    assert [schedule.phase_at(s, 100, COS) for s in (0, 9, 10, 79, 80, 99, 100)] == \
        ["warmup", "warmup", "stable", "stable", "cooldown", "cooldown", "done"]


def test_warmup_values():
    # the update after 0 completed steps already has a non-zero lr (lesson 3: step 1 uses lr_at(0))
    assert [lr_at(s, 100, COS) for s in range(10)] == pytest.approx([(s + 1) / 10 for s in range(10)])


def test_stable_values():
    assert all(lr_at(s, 100, COS) == 1.0 for s in range(10, 80))


def test_cooldown_values():
    # cooldown progress p = (s - 80 + 1) / 20: p = 0.5 at s = 89, p = 1 at the last planned step
    assert lr_at(89, 100, COS) == pytest.approx(0.55)  # cosine midpoint: (lr + lr_min) / 2
    assert lr_at(89, 100, LIN) == pytest.approx(0.55)
    assert lr_at(84, 100, LIN) == pytest.approx(1.0 - 0.9 * 0.25)
    assert lr_at(84, 100, COS) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.25)))
    assert lr_at(99, 100, COS) == pytest.approx(0.1) and lr_at(99, 100, LIN) == pytest.approx(0.1)
    assert lr_at(80, 100, COS) < 1.0 and lr_at(80, 100, COS) > lr_at(81, 100, COS)
    cool = [lr_at(s, 100, COS) for s in range(79, 100)]
    assert all(a >= b for a, b in zip(cool, cool[1:]))  # monotone down


def test_past_the_plan_holds_lr_min():
    assert lr_at(100, 100, COS) == 0.1 and lr_at(10**6, 100, LIN) == 0.1


def test_no_warmup_no_cooldown():
    flat = WSD(lr=0.5)
    assert lr_at(0, 10, flat) == 0.5 and lr_at(9, 10, flat) == 0.5


def test_from_config():
    cfg = config.loads('[train]\nlr = 0.002\ntotal_steps = 1000\n[schedule]\nwarmup_fraction = 0.02\n'
                       'cooldown_fraction = 0.1\ncooldown_shape = "cosine"\nlr_min = 0.0002\n')
    assert lr_at(0, 1000, cfg) == pytest.approx(0.002 / 20)
    assert lr_at(500, 1000, cfg) == 0.002
    assert lr_at(999, 1000, cfg) == pytest.approx(0.0002)


def test_lr_at_is_pure():
    steps = list(range(0, 120))
    first = [lr_at(s, 100, COS) for s in steps]
    random.Random(0).shuffle(steps)
    again = {s: lr_at(s, 100, COS) for s in steps}  # any order, any number of times
    assert first == [again[s] for s in range(120)]


@pytest.mark.parametrize("stop_at", [1, 5, 10, 50, 80, 95])
def test_resume_lands_at_the_same_point(stop_at):
    """Lesson 2: a run stopped after `stop_at` steps and resumed continues the same curve; no second warmup."""
    total = 100
    uninterrupted = [lr_at(s, total, COS) for s in range(total)]
    before = [lr_at(s, total, COS) for s in range(stop_at)]
    after = [lr_at(s, total, COS) for s in range(stop_at, total)]  # the resumed process knows only global_step
    assert before + after == uninterrupted
    if stop_at >= 10:
        assert after[0] <= 1.0 and schedule.phase_at(stop_at, total, COS) != "warmup"


def test_bad_arguments():
    with pytest.raises(ValueError):
        lr_at(-1, 100, COS)
    with pytest.raises(ValueError):
        lr_at(0, 0, COS)
    with pytest.raises(ValueError):
        lr_at(90, 100, WSD(lr=1.0, cooldown_fraction=0.5, cooldown_shape="exp"))


# --- interval_crossed (lesson 4) -----------------------------------------------------------------

@pytest.mark.parametrize("prev,new,every,expected", [
    (0, 10, 10, True),  # landing exactly on the boundary fires
    (9, 10, 10, True),
    (10, 19, 10, False),  # leaving a boundary does not fire again
    (10, 20, 10, True),
    (0, 9, 10, False),
    (0, 35, 10, True),  # a step bigger than the interval fires (once)
    (5, 5, 10, False),  # nothing consumed
    (0, 0, 10, False),  # seqs 0 is not a crossing
    (0, 100, 0, False),  # 0 = off
    (0, 100, -3, False),
    (95, 105, 100, True),
    (100, 199, 100, False),
])
def test_interval_crossed(prev, new, every, expected):
    assert interval_crossed(prev, new, every) is expected


def test_interval_with_step_size_that_does_not_divide():
    # 32 seqs per step, every 100 seqs: fires on the steps that cross 100, 200, 300 ...
    fired = [s for s in range(1, 101) if interval_crossed((s - 1) * 32, s * 32, 100)]
    assert fired[:4] == [4, 7, 10, 13]
    assert len(fired) == 3200 // 100
    assert schedule.crossings(0, 350, 100) == 3 and schedule.crossings(0, 350, 0) == 0


def test_interval_backwards_is_an_error():
    with pytest.raises(ValueError):
        interval_crossed(10, 9, 5)
