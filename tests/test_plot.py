"""catchat.analysis.plot on a synthesized run directory: PNGs written, summary numbers, resume handling, errors.

The run: 200 planned steps of 2,048 tokens. A first attempt logged steps 1..120 (and an eval at 110)
then died; it resumed from the checkpoint at step 100 and logged 101..200 again with other values.
Step 150 was skipped (loss empty, grad norm inf). events.jsonl ends in a line cut off mid-write.
"""

import json
import math
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catchat.analysis.plot import load_run, plot_run, summarise_run
from catchat.errors import UsageError
from catchat.run.runlog import METRICS_COLUMNS as COLUMNS
from catchat.run.runlog import WRITTEN_COLUMNS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TOK = 2048
PLOTS = ["loss.png", "lr.png", "grad_norm.png", "throughput.png", "accuracy.png"]


def row(step, attempt):
    """One metrics row; attempt 1 is the abandoned timeline (loss offset by +1, slow)."""
    skipped = attempt == 2 and step == 150
    loss = 4.6 * math.exp(-step / 80) + 1.5 + (1.0 if attempt == 1 else 0.0)
    return {
        "global_step": step, "seqs": step * 32, "cycle": 0, "tokens": step * TOK,
        "lr": 3e-3 * min(1.0, (step + 1) / 10), "tf": 1.0 if step < 100 else 0.9,
        "loss": "" if skipped else f"{loss:.6f}",
        "grad_norm": "inf" if skipped else f"{0.5 + 2.0 * math.exp(-step / 30):.6f}",
        "clipped": 1 if (not skipped and step < 20) else 0, "valid_tokens": TOK,
        "tokens_per_s": 1000.0 if attempt == 1 else 10_000.0 + step, "step_ms": 200.0,
        "gradh_clamp_hits": 0, "skipped": 1 if skipped else 0,
    }


def write_metrics(path, rows):
    with path.open("w") as f:
        f.write(",".join(COLUMNS) + "\n")
        for r in rows:
            f.write(",".join(str(r[c]) for c in COLUMNS) + "\n")


def ev(event, step, **kw):
    return json.dumps({"event": event, "global_step": step, **kw})


def eval_ev(step, loss, free=None):
    e = {"seqs": step * 32, "tokens": step * TOK, "loss": loss, "bpc": loss / math.log(2),
         "top1": 0.6 - loss / 10, "top5": 0.9 - loss / 20, "n_valid": 16384}
    if free is not None:
        e["free_running"] = {"loss": free, "bpc": free / math.log(2), "top1": 0.3, "top5": 0.6}
    return ev("eval", step, **e)


CONFIG = """\
[train]
clip = 1.0
total_steps = 200
label_smoothing = 0.0

[schedule]
warmup_fraction = 0.05
cooldown_fraction = 0.2
"""


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "runs" / "synthetic"
    d.mkdir(parents=True)
    rows = [row(s, 1) for s in range(1, 121)] + [row(s, 2) for s in range(101, 201)]
    write_metrics(d / "metrics.csv", rows)
    lines = [
        ev("start", 0, config="tiny"),
        eval_ev(50, 2.5, free=3.1),
        eval_ev(100, 2.2, free=2.9),
        ev("checkpoint", 100, path="checkpoints/step-0000100"),
        eval_ev(110, 1.0),                              # abandoned timeline: must not count
        ev("resume", 100, **{"from": "checkpoints/step-0000100"}),
        ev("something_new", 120, detail="unknown events are ignored"),
        eval_ev(150, 2.0, free=2.6),
        ev("skipped_step", 150, reason="grad norm not finite"),
        eval_ev(200, 1.9),
        ev("end", 200, reason="total_steps"),
        '{"event": "eval", "global_step": 210, "loss": 1.',  # cut off mid-write
    ]
    (d / "events.jsonl").write_text("\n".join(lines))
    (d / "config.toml").write_text(CONFIG)
    return d


def test_load_run_keeps_the_resumed_timeline(run_dir):
    run = load_run(run_dir)
    steps = run.steps
    assert steps.tolist() == list(range(1, 201))        # 101..120 once each, ascending
    i110 = 109
    assert run.m["tokens_per_s"][i110] == 10_110.0      # the resumed attempt's row wins
    assert [e["global_step"] for e in run.evals] == [50, 100, 150, 200]
    assert run.resumes == [100]
    assert run.skipped_steps == [150]
    assert math.isnan(run.m["loss"][149]) and math.isinf(run.m["grad_norm"][149])
    assert run.clip == 1.0
    assert run.cooldown_start == 160                    # 200 - round(0.2 * 200), as schedule.phases


def test_plot_run_writes_valid_pngs(run_dir):
    paths = plot_run(run_dir)
    assert [p.name for p in paths] == PLOTS
    for p in paths:
        assert p.parent == run_dir / "plots"
        assert p.read_bytes()[:8] == PNG_MAGIC
        assert p.stat().st_size > 10_000
    assert not list((run_dir / "plots").glob(".*"))    # no temporary files left behind


def test_fp16_loss_scale_is_read_and_drawn_beside_the_grad_norm(run_dir, monkeypatch):
    """A metrics.csv with the appended columns (an fp16 run's loss_scale halving at its skipped step):
    load_run reads them (nan where a file has none), and the grad-norm plot draws the scale on a
    second axis; an fp32 run's scale of 1 draws none."""
    import matplotlib.figure

    def write(scale_at):
        rows = [{**row(s, 2), "elapsed_s": f"{s * 0.2:.3f}", "progress": f"{s / 200:.6f}",
                 "loss_scale": f"{scale_at(s):.0f}"} for s in range(1, 201)]
        with (run_dir / "metrics.csv").open("w") as f:
            f.write(",".join(WRITTEN_COLUMNS) + "\n")
            for r in rows:
                f.write(",".join(str(r[c]) for c in WRITTEN_COLUMNS) + "\n")

    labels = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: (
        labels.append([ax.get_ylabel() for ax in fig.axes]), real(fig, *a, **k))[1])
    write(lambda s: 65536 if s < 150 else 32768)
    run = load_run(run_dir)
    assert run.m["loss_scale"][0] == 65536 and run.m["loss_scale"][-1] == 32768
    plot_run(run_dir)
    assert any("fp16 loss scale" in " ".join(y) for y in labels)
    labels.clear()
    write(lambda s: 1)
    plot_run(run_dir)
    assert not any("loss scale" in " ".join(y) for y in labels)
    write_metrics(run_dir / "metrics.csv", [row(s, 2) for s in range(1, 201)])  # no appended columns
    assert np.isnan(load_run(run_dir).m["loss_scale"]).all()


def test_plot_run_out_dir_and_missing_config(run_dir, tmp_path):
    (run_dir / "config.toml").unlink()
    out = tmp_path / "elsewhere" / "plots"
    paths = plot_run(run_dir, out)
    assert [p.name for p in paths] == PLOTS and all(p.parent == out for p in paths)
    run = load_run(run_dir)
    assert run.clip is None and run.cooldown_start is None


def test_no_events_skips_accuracy(run_dir):
    (run_dir / "events.jsonl").unlink()
    names = [p.name for p in plot_run(run_dir)]
    assert names == ["loss.png", "lr.png", "grad_norm.png", "throughput.png"]
    assert "eval: none yet" in summarise_run(run_dir)


def test_summary_numbers(run_dir):
    lines = summarise_run(run_dir)
    text = "\n".join(lines)
    assert lines[0] == f"steps: 200 · tokens: {200 * TOK:,} · cycle 0"
    last = 4.6 * math.exp(-200 / 80) + 1.5
    assert f"train loss: {last:.4f} nats/char ({last / math.log(2):.4f} bpc) at step 200" in text
    assert f"best eval: 1.9000 nats/char ({1.9 / math.log(2):.4f} bpc) at step 200" in text
    mean_tps = np.mean([10_000.0 + s for s in range(181, 201)])   # last 10% = 20 steps
    assert f"throughput: {mean_tps:,.0f} tokens/s (mean over the last 20 steps)" in text
    assert "skipped steps: 1 (150)" in text
    assert "clipped steps: 19 (9.5%)" in text
    assert "resumed from step 100" in text


def test_best_eval_reports_free_running(run_dir):
    with (run_dir / "events.jsonl").open("a") as f:   # after the cut line: a later, better eval
        f.write("\n" + eval_ev(200, 1.8, free=2.4) + "\n")
    text = "\n".join(summarise_run(run_dir))
    assert "best eval: 1.8000 nats/char" in text and "free-running 2.4000 nats/char" in text


def test_empty_run_is_a_usage_error(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    with pytest.raises(UsageError, match="no metrics in .*metrics.csv yet"):
        plot_run(d)                                     # no metrics.csv at all
    (d / "metrics.csv").write_text(",".join(COLUMNS) + "\n")
    with pytest.raises(UsageError, match="no metrics in .*metrics.csv yet") as e:
        summarise_run(d)                                # header only
    assert e.value.hint and e.value.exit_code == 2
    with pytest.raises(UsageError, match="not a directory"):
        summarise_run(d / "nope")


def test_truncated_metrics_row_is_skipped(run_dir):
    with (run_dir / "metrics.csv").open("a") as f:
        f.write("201,6432,0,41")                        # cut off mid-write
    assert load_run(run_dir).steps[-1] == 200
    assert not any(line.startswith("warning") for line in summarise_run(run_dir))   # normal mid-run: quiet


def test_damaged_lines_are_skipped_with_a_warning(run_dir):
    """Invalid UTF-8, a line over 128 KiB and a wrong-typed event: skipped and named, the rest plotted."""
    with (run_dir / "metrics.csv").open("ab") as f:
        f.write(b"201,6432,0,\xff\n" + b"1," * 70_000 + b"\n")
    with (run_dir / "events.jsonl").open("a") as f:
        f.write('\n{"event": "eval", "global_step": 150, "loss": "low"}\n')
    run = load_run(run_dir)
    assert run.steps[-1] == 200 and [e["global_step"] for e in run.evals] == [50, 100, 150, 200]
    lines = summarise_run(run_dir)
    assert "warning: metrics.csv: 2 unusable line(s) (line 222: not valid UTF-8 (byte 11); line 223: longer than " \
           "128 KiB) skipped" in lines
    warned = [line for line in lines if line.startswith("warning: events.jsonl: 2 unusable line(s) (line 12: not JSON")]
    assert warned and warned[0].endswith('line 13: "eval" event: loss is "low", not a number) skipped'), lines


def test_a_header_that_is_not_the_trainers(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    (d / "metrics.csv").write_text("step,loss\n1,2.0\n")
    with pytest.raises(UsageError, match=r"metrics.csv line 1: header is not global_step,seqs,.*; no row read") as e:
        load_run(d)
    assert "is this a run directory" in e.value.hint


def test_a_branch_drops_the_abandoned_evals(run_dir):
    with (run_dir / "events.jsonl").open("a") as f:
        f.write("\n" + ev("branch", 120, **{"from": "step-0000120"}, branch_step=120, abandoned_step=200,
                          side_dir="branches/01-after-step-0000120") + "\n")
    assert [e["global_step"] for e in load_run(run_dir).evals] == [50, 100]


def test_damaged_telemetry_through_the_cli(dev, tmp_path):
    """`catchat plot` on a real run with an invalid UTF-8 row, a 200 KiB line and a wrong-typed event
    (each a traceback before): exit 0, the plots, and the skipped lines named in the summary."""
    from support import catchat, make_tiny_run

    run = make_tiny_run(tmp_path, dev)
    with open(run / "metrics.csv", "ab") as f:
        f.write(b"6,48,0,\xff\xfe,0.02\n" + b"7," * 100_000 + b"\n")
    with open(run / "events.jsonl", "a") as f:
        f.write('{"event": "eval", "global_step": "x", "loss": [1]}\n')
    r = catchat("plot", run, env={"COLUMNS": "1000"})  # no wrapping
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "Traceback" not in out, out
    assert "warning: metrics.csv: 2 unusable line(s) (line 7: not valid UTF-8 (byte 7); line 8: longer than " \
           "128 KiB) skipped" in r.stdout
    assert 'global_step is "x", not a step number) skipped' in r.stdout
    assert "steps: 5" in r.stdout and (run / "plots" / "loss.png").is_file()


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=6)
_ORIGINAL: dict = {}
EVENT_KEYS = ["event", "global_step", "loss", "bpc", "top1", "top5", "tokens", "free_running", "branch_step", "from"]


@settings(derandomize=True, database=None, max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.integers(0, 100), st.sampled_from(EVENT_KEYS),
                                JSON | st.sampled_from(["eval", "resume", "branch", "skipped_step"])),
                      min_size=1, max_size=5),
       cells=st.lists(st.tuples(st.integers(0, 300), st.sampled_from(COLUMNS),
                                st.sampled_from(["", "nan", "inf", "-1", "1e308", "9" * 19, "x", "\u00e9"])),
                      max_size=4))
def test_fuzz_summary_of_damaged_telemetry(run_dir, edits, cells):
    """The summary (and the HTML page's data) of wrong-typed events and cells: a summary or a UsageError."""
    if run_dir not in _ORIGINAL:  # the fixture's files, before any example changed them
        _ORIGINAL[run_dir] = [(run_dir / n).read_text() for n in ("events.jsonl", "metrics.csv")]
    text, csv_text = _ORIGINAL[run_dir]
    events = [json.loads(line) for line in text.splitlines()[:-1]]  # the last line is cut short
    for i, key, value in edits:
        events[i % len(events)][key] = value
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    rows = csv_text.splitlines()
    for i, col, value in cells:
        j = 1 + i % (len(rows) - 1)
        parts = rows[j].split(",")
        parts[COLUMNS.index(col)] = value
        rows[j] = ",".join(parts)
    (run_dir / "metrics.csv").write_text("\n".join(rows) + "\n")
    try:
        assert summarise_run(run_dir)
    except UsageError:
        pass


def test_missing_matplotlib(run_dir, monkeypatch):
    for mod in [k for k in sys.modules if k == "matplotlib" or k.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib -> ImportError
    with pytest.raises(UsageError, match="matplotlib is not installed") as e:
        plot_run(run_dir)
    assert e.value.hint == "pip install 'catchat[plot]'"
    assert summarise_run(run_dir)                       # the summary needs no matplotlib


def test_smoothing_restarts_at_resumes():
    from catchat.analysis.plot import _smooth_segments

    steps = np.arange(1, 201, dtype=np.float64)
    y = np.where(steps <= 197, 1.0, 5.0)                # a 3-step stretch after a resume at 197
    sm = _smooth_segments(y, 10, steps, [197])
    assert sm.shape == y.shape
    assert np.all(sm[:197] == 1.0) and np.all(sm[197:] == 5.0)


def test_html_page_shows_everything(run_dir):
    import html
    import re

    land = run_dir / "landscape" / "step-0000200"           # what `catchat landscape` leaves in a run
    land.mkdir(parents=True)
    (land / "landscape-layer0.png").write_bytes(PNG_MAGIC + b"0" * 64)
    (land / "landscape.txt").write_text("layer 0 [ih:z+hh:z]: centre 1.9000 nats/char · mean rise +0.01\n")
    paths = plot_run(run_dir)
    page = (run_dir / "plots" / "index.html").read_text()
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    srcs = re.findall(r'<img src="([^"]+)"', page)
    assert srcs == [p.name for p in paths] + ["../landscape/step-0000200/landscape-layer0.png"]  # relative
    for line in summarise_run(run_dir):
        assert f"<li>{html.escape(line)}</li>" in page
    assert "centre 1.9000 nats/char" in page
    assert html.escape(CONFIG.splitlines()[1]) in page              # the run's config.toml, verbatim
    assert "resumes at step 100" in page and "cooldown from step 160" in page
    assert page.count("<tr>") == 1 + 4                               # the evals table: header + 4 evals
    assert "<script" not in page and "http" not in page              # self-contained


def test_html_page_optional(run_dir, tmp_path):
    out = tmp_path / "p"
    plot_run(run_dir, out, html_page=False)
    assert not (out / "index.html").exists()
