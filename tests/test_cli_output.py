"""Tables and lines through a pipe (CI, `| tee log`): every row whole on one line, no cell cut with "…"
(catchat/console.py). At a terminal, rich still fits the terminal's width, folding cells instead of cutting."""

import io
import os
import re
import subprocess
import sys

from catchat.console import LOG_WIDTH, make_console, new_table

from support import catchat, make_tiny_run

ELLIPSIS = "\u2026"
# parity's groups that run in a few seconds on lavapipe, gru among them (its shapes are the widest cells)
FAST_PARITY_GROUPS = ("axpby", "dropout", "embedding", "gru", "norm", "loss", "optim", "sampling")


def _rows(out: str) -> list[list[str]]:
    """The body rows of rich tables in `out` (lines between the box's vertical bars), split into cells."""
    return [[c.strip() for c in line.strip()[1:-1].split("\u2502")]
            for line in out.splitlines() if line.startswith("\u2502") and line.rstrip().endswith("\u2502")]


def _assert_whole(out: str, rows: list[list[str]]):
    assert ELLIPSIS not in out, [line for line in out.splitlines() if ELLIPSIS in line][:5]
    assert rows, out
    # a folded cell would add a continuation line whose first cell is empty
    assert [r for r in rows if not r[0]] == [], out


def test_parity_rows_whole_through_a_pipe(tmp_path):
    env = {"COLUMNS": "80"}  # rich would take it as the width; a pipe has none
    only = [a for g in FAST_PARITY_GROUPS for a in ("--only", g)]
    # the timeout only guards against a hang: with a warm SPIR-V cache this takes ~14 s on lavapipe, but a
    # source checkout's first run compiles every gru variant with glslc, which on a loaded 2-core machine
    # (beside test_gru's own parity compiling the same) took past 300 s (2026-12-06)
    r = subprocess.run([sys.executable, "-m", "catchat.cli", "parity", *only],
                       capture_output=True, text=True, timeout=900, env={**os.environ, **env})
    assert r.returncode == 0, r.stdout + r.stderr
    rows = _rows(r.stdout)
    _assert_whole(r.stdout, rows)
    passed = int(re.search(r"^(\d+) passed, 0 failed", r.stdout, re.M).group(1))
    assert passed > 300 and len(rows) == passed  # one line per check
    assert {row[0] for row in rows} == set(FAST_PARITY_GROUPS)
    assert all(len(row) == 7 and row[-1] == "pass" for row in rows)
    widest = max(rows, key=lambda row: len(row[2]))
    assert len(widest[2]) > 150 and widest[0] == "gru"  # gru's resident tiles: a cell far wider than 80 columns
    assert max(map(len, r.stdout.splitlines())) > 200
    assert r.stdout.startswith("device: ") and len(r.stdout.splitlines()[0]) > 0
    # a line per group on stderr as it ends (a slow or stuck group is named before the table)
    progress = re.findall(r"^  (\w+) \((\d+)/(\d+)\): (\d+) checks, 0 failed, [\d.]+ s$", r.stderr, re.M)
    assert [p[0] for p in progress] == list(FAST_PARITY_GROUPS), r.stderr
    assert [(int(p[1]), int(p[2])) for p in progress] == [(i + 1, len(FAST_PARITY_GROUPS)) for i in range(8)]
    assert sum(int(p[3]) for p in progress) == passed


def test_devices_rows_whole_through_a_pipe():
    from catchat.vk.probe import probe_devices

    r = catchat("devices", env={"COLUMNS": "40"})
    assert r.returncode == 0, r.stdout + r.stderr
    rows = _rows(r.stdout)
    _assert_whole(r.stdout, rows)
    devices = probe_devices()
    assert [row[:2] for row in rows] == [[str(d.index), d.name] for d in devices]
    assert all(len(row) == 9 for row in rows)


def test_scan_rows_whole_through_a_pipe(dev, tmp_path):
    """A real run with damaged telemetry, so the detail cells are long."""
    from catchat.analysis.scan import scan_run, table_rows

    run = make_tiny_run(tmp_path, dev)
    lines = (run / "metrics.csv").read_text().splitlines(keepends=True)
    (run / "metrics.csv").write_text(lines[0] + lines[1] + "".join(lines[4:]) + "not,a,row\n")
    with open(run / "events.jsonl", "a") as f:
        f.write('{"event": "eval", "global_step": "x"}\n')
    r = catchat("scan", run, env={"COLUMNS": "60"})
    assert r.returncode == 1, r.stdout + r.stderr  # defects
    rows = _rows(r.stdout)
    _assert_whole(r.stdout, rows)
    expected = table_rows(scan_run(run))
    assert [(row[0], row[2], row[3]) for row in rows] == [(c, n, d) for c, _, n, d in expected]
    from catchat.run.runlog import WRITTEN_COLUMNS

    assert "2 step(s) missing: 2..3" in r.stdout
    assert f"(line 5: 3 cells, the header has {len(WRITTEN_COLUMNS)})" in r.stdout


def test_console_width_follows_the_file():
    """A file that is not a terminal gets LOG_WIDTH, whatever COLUMNS or FORCE_COLOR say; a terminal keeps
    its width (COLUMNS here), and the tables fold long cells there."""
    piped = make_console(file=io.StringIO(), _environ={"COLUMNS": "80", "FORCE_COLOR": "1"})
    assert piped.width == LOG_WIDTH

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = make_console(file=Tty(), _environ={"COLUMNS": "50", "TERM": "xterm"}, color_system=None)
    assert tty.width == 50
    t = new_table("name", "value")
    t.add_row("x" * 80, "1.23e-04")
    tty.print(t)
    out = tty.file.getvalue()
    assert ELLIPSIS not in out and max(map(len, out.splitlines())) <= 50
    assert out.count("x") == 80 and "1.23e-04" in out  # folded onto more lines, nothing lost
    piped.print(t)
    assert sum("x" * 80 in line for line in piped.file.getvalue().splitlines()) == 1


def test_terminal_output_fits_the_terminal(tmp_path):
    """`catchat devices` on a pseudo-terminal 60 columns wide: lines fit it, cells fold, nothing is cut."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 60, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE")}
    proc = subprocess.Popen([sys.executable, "-m", "catchat.cli", "devices"], stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=slave, env={**env, "TERM": "xterm"})
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed its side
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode()).replace("\r", "")
    assert ELLIPSIS not in out
    assert 0 < max(map(len, out.splitlines())) <= 60, out


def test_eval_lines_say_what_free_running_measures():
    """The first free-running eval line is followed by the note on what it measures (once per run)."""
    from catchat.training.progress import TrainReporter

    con = make_console(file=io.StringIO())
    rep = TrainReporter(con)
    scores = dict(loss=5.96, bpc=8.6, top1=0.1, top5=0.25)
    for step in (50, 100):
        rep("eval", global_step=step, loss=2.5, bpc=3.6, top1=0.3, top5=0.6, free_running=scores)
    lines = con.file.getvalue().splitlines()
    assert len(lines) == 5, lines  # 2 evals x 2 lines + the note, each whole on one line
    assert lines[1].startswith("eval step 50: free-running   loss 5.9600") and "own argmax" in lines[1]
    assert lines[2].startswith("free-running = the model fed its own argmax predictions") and "rise" in lines[2]
    assert not any(line.startswith("free-running =") for line in lines[3:])
