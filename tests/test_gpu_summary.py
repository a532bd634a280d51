"""tools/gpu_summary.py: the table a device call ends with, from the files gpu-check's parts leave
(a bench JSON named on the part's command line, a parity JSON, speedrun rows, plain text), and
gpu-check's part() writing the command line and running the summary over the parts it ran."""

import os
import shutil
import subprocess
from pathlib import Path

from support import load_tool

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"


def tool():
    return load_tool("gpu_summary")


def part_text(cmd: str, body: str, rc: int = 0, wall: str = "1m2.500s") -> str:
    return f"cmd: {cmd}\n{body}\nreal\t{wall}\nuser\t0m1.000s\nsys\t0m0.100s\nrc={rc}\n"


def test_rows_from_each_kind_of_part(tmp_path):
    mod = tool()
    shutil.copy(RESULTS / "2026-12-06-h100-catchat-v5-fp32.json", tmp_path / "bench-v5.json")
    (tmp_path / "bench-v5-fp32-stream.txt").write_text(part_text(
        f"python3 -m catchat.cli bench configs/catchat-v5.toml --json {tmp_path}/bench-v5.json", "a rich table"))
    shutil.copy(RESULTS / "2026-12-06-h100-parity-gru-split32.json", tmp_path / "parity-gru.json")
    (tmp_path / "parity-gru.txt").write_text(part_text("python3 -m catchat.cli parity", "1440 passed, 0 failed"))
    shutil.copy(RESULTS / "2026-12-06-h100-catchat-v3-gen-small.json", tmp_path / "gen-small-v3.json")
    (tmp_path / "gen-small-v3.txt").write_text(part_text("python3 tools/bench_generate.py", "a table"))
    (tmp_path / "speedrun-300.txt").write_text(part_text("python3 tools/speedrun.py base", (
        "| variant | changes | steps | train tok/s | held-out nats/char | wall s |\n|---|---|---|---|---|---|\n"
        "| base-s4 | train.seed=4 | 6,235 | 1,480,028 | 1.3939 | 297.3 |"), wall="4m57.606s"))
    (tmp_path / "phases.txt").write_text(part_text("python3 tools/sweep_phases.py", (
        "forward: 111,373 cycles per step; the sweep takes 57.42 us per step (~1.94 GHz)\n  product  93,210 cycles\n"
        "backward: 81,686 cycles per step; the sweep takes 82.16 us per step (~0.99 GHz)")))
    (tmp_path / "stats.txt").write_text(part_text("python3 tools/shader_stats.py", "first\nthe last line", rc=124))
    rows = {r[0]: r[1:] for r in mod.rows(tmp_path, ["bench-v5-fp32-stream", "parity-gru", "gen-small-v3",
                                                     "speedrun-300", "phases", "stats", "never-ran"])}
    rc, wall, h = rows["bench-v5-fp32-stream"]
    assert (rc, wall) == ("0", "62")
    assert h == ("train 68,278 tok/s, 1.23x FP32, 0.38x bf16, step 479.9 ms, eval 169,493, sweeps 49.9-50.1 fwd, "
                 "37.2-37.4 bwd ms, GEMMs 184.7 ms")
    assert rows["parity-gru"] == ("0", "62", "parity 1440 passed, 0 failed")
    assert rows["gen-small-v3"][2].startswith("chars/s fused b1 35,226, fused16 b1 33,444, coop b1 ")
    assert rows["speedrun-300"] == ("0", "298", "base-s4 1.3939 (6,235 steps)")
    assert rows["phases"][2] == "forward 57.42 us a step, backward 82.16 us a step"
    assert rows["stats"] == ("124", "62", "the last line")
    assert rows["never-ran"] == ("?", "?", "(no output)")
    assert all(len(r[3]) <= mod.WIDTH for r in mod.rows(tmp_path, list(rows)))


def test_gpu_check_writes_the_command_and_ends_with_the_table(tmp_path):
    """A part whose command is `echo` (PYTHON=echo stands in for python): its text starts with the
    command line, and the summary's table (run by the same PYTHON, so echoed) names the part."""
    env = {**os.environ, "PYTHON": "echo", "PARTS": "doctor"}
    r = subprocess.run(["bash", str(ROOT / "tools" / "gpu-check.sh"), str(tmp_path)], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    txt = (tmp_path / "doctor.txt").read_text()
    assert txt.startswith("cmd: echo -m catchat.cli doctor\n") and "rc=0" in txt
    assert r.stdout.strip().splitlines()[-1] == f"tools/gpu_summary.py {tmp_path} doctor"
    assert tool().rows(tmp_path, ["doctor"])[0][:2] == ("doctor", "0")


def test_a_group_runs_its_parts_in_the_scripts_order(tmp_path):
    """PARTS naming a group (tools/gpu-check.sh's `group`) runs the parts it names and no others, in the
    script's order (the training records: v5's fp32 bench, declared after the speedrun's, runs after it);
    a group and one of its parts named both run the part once."""
    env = {**os.environ, "PYTHON": "echo", "PARTS": "records-train bench-v3"}
    r = subprocess.run(["bash", str(ROOT / "tools" / "gpu-check.sh"), str(tmp_path)], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    ran = [line[3:] for line in r.stdout.splitlines() if line.startswith("== ")]
    assert ran == ["bench-v3", "bench-v3-fp16-torch", "bench-v5-fp16-torch", "bench-speedrun",
                   "bench-v5-fp32-stream"], ran
    assert "--compare-torch" in (tmp_path / "bench-v5-fp32-stream.txt").read_text()
