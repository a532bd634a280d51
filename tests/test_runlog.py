"""catchat.run.runlog, the one reader of metrics.csv and events.jsonl: every kind of bad line is reported
with its line number and skipped, nothing in a file makes it raise, and a hostile file costs bounded
time and memory (hypothesis: arbitrary bytes and mutated valid files)."""

import json
import math
import os
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catchat.run.runlog import (
    MAX_BAD,
    MAX_LINE_BYTES,
    METRICS_COLUMNS,
    EventsLog,
    MetricsLog,
    describe_bad,
    numbers,
    read_events,
    read_metrics,
)

HEADER = ",".join(METRICS_COLUMNS) + "\n"


def row(step, loss="4.600000", **over):
    cells = dict(global_step=step, seqs=8 * step, cycle=0, tokens=128 * step, lr="0.001", tf="1", loss=loss,
                 grad_norm="1.5", clipped=0, valid_tokens=128, tokens_per_s="4000.0", step_ms="30.00",
                 gradh_clamp_hits=0, skipped=0)
    cells.update(over)
    return ",".join(str(cells[c]) for c in METRICS_COLUMNS) + "\n"


def ev(event, step, **fields):
    return json.dumps({"event": event, "global_step": step, "time": 1.5, **fields}) + "\n"


GOOD_METRICS = (HEADER + "".join(row(s) for s in range(1, 6))).encode()
GOOD_EVENTS = (ev("start", 0, total_steps=5, seqs_per_step=8, faults=[],
                  schedule=dict(total_steps=5, lr=0.001, warmup_fraction=0.1, cooldown_fraction=0.2,
                                cooldown_shape="cosine", lr_min=0.0),
                  teacher_forcing=dict(start=1.0, floor=0.7, schedule="constant", hold_cycles=0.0, decay_cycles=1.0),
                  rss_mb=None, peak_rss_mb=150.0)
               + ev("eval", 2, loss=2.0, bpc=2.9, top1=0.3, top5=0.6, tokens=256, free_running={"loss": 2.5})
               + ev("checkpoint", 3, path="runs/x/checkpoints/step-0000003", reason="interval")
               + ev("skipped_step", 4, reason="no valid targets")
               + ev("resume", 3, **{"from": "runs/x/checkpoints/step-0000003", "foreign": False}, seqs=24)
               + ev("branch", 3, **{"from": "step-0000003"}, branch_step=3, abandoned_step=5, side_dir="branches/01")
               + ev("end", 5, reason="done", skipped_steps=1, applied_steps=4)
               + ev("something_new", 5, anything=[1, {"x": None}])).encode()


def metrics(tmp_path, data: bytes) -> MetricsLog:
    p = tmp_path / "metrics.csv"
    p.write_bytes(data)
    return read_metrics(p)


def events(tmp_path, data: bytes) -> EventsLog:
    p = tmp_path / "events.jsonl"
    p.write_bytes(data)
    return read_events(p)


# ---------------------------------------------------------------------------------------------
# metrics.csv
# ---------------------------------------------------------------------------------------------

def test_good_metrics(tmp_path):
    log = metrics(tmp_path, GOOD_METRICS)
    assert log.header == list(METRICS_COLUMNS) and not log.bad and not log.truncated_tail and log.n_bad == 0
    assert [r[0] for r in log.rows] == ["1", "2", "3", "4", "5"] and log.line_nos == [2, 3, 4, 5, 6]
    v = numbers(log.rows[0])
    assert v["global_step"] == 1 and isinstance(v["seqs"], int) and v["lr"] == 0.001 and v["skipped"] == 0


def test_each_bad_metrics_row_is_reported_and_skipped(tmp_path):
    data = (HEADER + row(1)).encode() + b"2,\xff\n"  # line 3: not UTF-8
    data += row(3).encode() + b"x" * (MAX_LINE_BYTES + 1) + b"\n"  # line 5: too long
    data += b"5,8,0\n"  # wrong number of cells
    data += row("x").encode() + row(7, lr="fast").encode() + row(8, seqs="1.5").encode()
    data += row(-9).encode() + row(10, loss="").encode() + b"\n" + row(11).encode()
    data += b'12,"8\n' + row(13, loss="nan").encode() + row(14)[:-1].encode()  # an open quote; a cut last line
    log = metrics(tmp_path, data)
    assert [r[0] for r in log.rows] == ["1", "3", "10", "11", "13"] and log.line_nos == [2, 4, 11, 13, 15]
    why = dict(log.bad)
    assert why[3].startswith("not valid UTF-8") and why[5] == "longer than 128 KiB"
    assert why[6] == "3 cells, the header has 14"
    assert why[7] == "global_step is not an integer: 'x'" and why[8] == "lr is not a number: 'fast'"
    assert why[9] == "seqs is not an integer: '1.5'" and why[10] == "global_step is negative: -9"
    assert why[14] == "not one csv row" and len(why) == 8  # the empty line 12 and the cut line 16: not bad
    assert log.truncated_tail and log.n_bad == 8
    assert math.isnan(numbers(log.rows[2])["loss"]) and math.isnan(numbers(log.rows[4])["loss"])
    assert describe_bad(log).startswith("8 unusable line(s) (line 3: not valid UTF-8")


def test_header_rules(tmp_path):
    extra = metrics(tmp_path, (HEADER[:-1] + ",new_column\n" + row(1)[:-1] + ",7\n" + row(2)).encode())
    assert (extra.header[-1] == "new_column" and len(extra.rows) == 1
            and extra.bad == [(3, "14 cells, the header has 15")])
    other = metrics(tmp_path, ("step,loss\n" + row(1)).encode())
    assert not other.header and not other.rows and len(other.bad) == 1 and other.bad[0][0] == 1
    assert other.bad[0][1].startswith("header is not global_step,seqs,") and "'step,loss'" in other.bad[0][1]
    assert metrics(tmp_path, b"").bad == [(1, "no header (empty file)")]
    cut = metrics(tmp_path, HEADER[:20].encode())
    assert cut.truncated_tail and cut.bad == [(1, "no header: the line is cut short")]
    assert metrics(tmp_path, b"\xff\xfe\n" + row(1).encode()).bad[0][1].startswith("header is not")
    crlf = metrics(tmp_path, (HEADER + row(1)).replace("\n", "\r\n").encode())
    assert crlf.header == list(METRICS_COLUMNS) and len(crlf.rows) == 1 and not crlf.bad


def test_an_over_long_line_is_skipped_without_holding_it(tmp_path):
    """A 40 MiB line costs no more memory than one chunk and one 128 KiB line."""
    p = tmp_path / "metrics.csv"
    with open(p, "wb") as f:
        f.write(HEADER.encode() + row(1).encode())
        f.write(b"9" * (40 << 20) + b"\n")
        f.write(row(2).encode())
    tracemalloc.start()
    try:
        log = read_metrics(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert log.line_nos == [2, 4] and log.bad == [(3, "longer than 128 KiB")]
    assert peak < 2 * MAX_LINE_BYTES + (1 << 20), peak


def test_bad_lines_are_listed_up_to_a_limit(tmp_path):
    log = metrics(tmp_path, HEADER.encode() + b"x\n" * (MAX_BAD + 500))
    assert len(log.bad) == MAX_BAD and log.n_bad == MAX_BAD + 500 and not log.rows


def test_unreadable_files_raise_oserror_and_a_fifo_does_not_block(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_metrics(tmp_path / "nope.csv")
    with pytest.raises(OSError):
        read_events(tmp_path)  # a directory
    os.mkfifo(tmp_path / "fifo")
    start = time.monotonic()
    with pytest.raises(OSError, match="not a regular file"):
        read_events(tmp_path / "fifo")
    assert time.monotonic() - start < 5


# ---------------------------------------------------------------------------------------------
# events.jsonl
# ---------------------------------------------------------------------------------------------

def test_good_events(tmp_path):
    log = events(tmp_path, GOOD_EVENTS)
    assert not log.bad and not log.truncated_tail
    assert [e["event"] for e in log.events] == ["start", "eval", "checkpoint", "skipped_step", "resume", "branch",
                                               "end", "something_new"]
    assert log.line_nos == list(range(1, 9))


BAD_EVENTS = [
    ('{"event": "eval", "global_step": "x", "loss": [1]}', 'global_step is "x", not a step number'),
    ('{"event": "eval", "global_step": 3, "loss": [1]}', '"eval" event: loss is [1], not a number'),
    ('{"event": "eval", "global_step": 3}', '"eval" event: loss is missing'),
    ('{"event": "eval", "global_step": 3, "loss": 1, "free_running": {"top1": "a"}}',
     '"eval" event: free_running.top1 is "a", not a number'),
    ('{"event": "eval", "global_step": true, "loss": 1}', "global_step is true, not a step number"),
    ('{"event": "eval", "global_step": -2, "loss": 1}', "global_step is -2, not a step number"),
    ('{"event": "eval", "global_step": 1e3, "loss": 1}', "global_step is 1000.0, not a step number"),
    ('{"event": "end", "global_step": 99999999999999999999}', "global_step is 99999999999999999999, not a step number"),
    ('{"event": 5, "global_step": 1}', "event is 5, not a string"),
    ('{"global_step": 1}', "event is null, not a string"),
    ('[1, 2]', "not a JSON object (list)"),
    ('{"event": "end", "global_step": 1, "reason": "\\ud800"}', '"end" event: reason is "\\ud800", not a string'),
    ('{"event": "end", "global_step": 1, "time": "noon"}', '"end" event: time is "noon", not a number'),
    ('{"event": "end", "global_step": 1, "rss_mb": "big"}', '"end" event: rss_mb is "big", not a number'),
    ('{"event": "resume", "global_step": 4}', '"resume" event: from is missing'),
    ('{"event": "resume", "global_step": 4, "from": 7}', '"resume" event: from is 7, not a string'),
    ('{"event": "resume", "global_step": 4, "from": "a", "foreign": 1}',
     '"resume" event: foreign is 1, not true or false'),
    ('{"event": "start", "global_step": 0, "schedule": {"lr": 1}}', '"start" event: schedule.total_steps is missing'),
    ('{"event": "start", "global_step": 0, "faults": "nan_grad"}',
     '"start" event: faults is "nan_grad", not a list of strings'),
    ('{"event": "start", "global_step": 0, "teacher_forcing": [1]}',
     '"start" event: teacher_forcing is [1], not an object'),
    ('{"event": "branch", "global_step": 3, "branch_step": "3", "abandoned_step": 5}',
     '"branch" event: branch_step is "3", not an integer'),
    ('{"event": "checkpoint", "global_step": 3, "path": null}', '"checkpoint" event: path is null, not a string'),
]


@pytest.mark.parametrize("line,why", BAD_EVENTS)
def test_each_wrong_typed_event_is_reported_and_skipped(tmp_path, line, why):
    log = events(tmp_path, GOOD_EVENTS + line.encode() + b"\n" + ev("end", 9, reason="done").encode())
    assert log.bad == [(9, why)]
    assert len(log.events) == 9 and log.line_nos[-1] == 10


def test_hostile_json_lines(tmp_path):
    data = (b"[" * 100_000 + b"\n" + b'{"a": ' + b"1" * 5000 + b"}\n" + b"\xc3\x28\n" + b"not json\n"
            + b"x" * (MAX_LINE_BYTES + 10) + b"\n" + b"   \n\n" + ev("end", 1).encode() + b'{"event": "ev')
    log = events(tmp_path, data)
    why = dict(log.bad)
    assert why[1] == "nested too deeply" and why[2].startswith("not JSON (Exceeds the limit")
    assert why[3].startswith("not valid UTF-8") and why[4].startswith("not JSON")
    assert why[5] == "longer than 128 KiB" and len(why) == 5
    assert [e["event"] for e in log.events] == ["end"] and log.line_nos == [8] and log.truncated_tail


# ---------------------------------------------------------------------------------------------
# fuzz: nothing raises, time stays bounded
# ---------------------------------------------------------------------------------------------

FUZZ = settings(derandomize=True, database=None, max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
JUNK = st.sampled_from([b"", b"\n", b"\xff", b"\x00", b",", b'"', b"{", b"[" * 3000, b"\r", b"nan", b"-1",
                        b"9" * 30, b"1e999", b"\\ud800", b'"event"', b'"global_step": ', b"null", b"\xe2\x82"])


@st.composite
def mutated(draw, good: bytes):
    """`good` with a few bytes replaced, cut, or junk inserted at drawn places."""
    data = bytearray(good)
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["insert", "replace", "delete", "truncate"]))
        if kind == "insert":
            data[at:at] = draw(JUNK | st.binary(max_size=20))
        elif kind == "replace":
            data[at:at + 1] = bytes([draw(st.integers(0, 255))])
        elif kind == "delete":
            del data[at:at + draw(st.integers(1, 40))]
        else:
            del data[at:]
    return bytes(data)


def _read_both(tmp_path, data: bytes):
    start = time.monotonic()
    for log in (metrics(tmp_path, data), events(tmp_path, data)):
        assert log.n_bad >= len(log.bad) and all(isinstance(n, int) and isinstance(w, str) for n, w in log.bad)
    assert time.monotonic() - start < 2.0


@FUZZ
@given(data=st.binary(max_size=4096))
def test_fuzz_arbitrary_bytes(tmp_path, data):
    _read_both(tmp_path, data)


@FUZZ
@given(data=mutated(GOOD_METRICS))
def test_fuzz_mutated_metrics(tmp_path, data):
    log = metrics(tmp_path, data)
    for cells in log.rows:  # every row a consumer gets converts
        numbers(cells)
    _read_both(tmp_path, data)


@FUZZ
@given(data=mutated(GOOD_EVENTS))
def test_fuzz_mutated_events(tmp_path, data):
    log = events(tmp_path, data)
    assert all(isinstance(e["event"], str) and type(e["global_step"]) is int for e in log.events)
    _read_both(tmp_path, data)
