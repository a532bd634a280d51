"""`catchat parity`: the table and the per-family summary, --only and --json. The whole command (every
group, every check passing) runs once in the suite, from the installed wheel without glslc
(tests/test_package.py::test_installed_wheel_runs_parity_without_glslc)."""

import json

from catchat import parity
from catchat.parity import compare


def test_summarise_counts_failures():
    rows = [("gemm", compare("a", "1", [1.0], [1.0], 0, 0)), ("gemm", compare("b", "1", [2.0], [1.0], 0, 0)),
            ("gru", compare("c", "1", [1.0], [1.0 + 1e-7], 1e-6, 0))]
    s = parity.summarise(rows)
    assert [(g["group"], g["checks"], g["failed"]) for g in s] == [("gemm", 2, 1), ("gru", 1, 0)]
    assert s[0]["max_abs"] == 1.0


def test_only_runs_the_named_groups_and_refuses_unknown_ones(cli, tmp_path):
    """Two of the groups that take well under a second on lavapipe (gemm's checks, ~12 s, run in
    tests/kernels/test_gemm.py and in the wheel's whole parity)."""
    record = tmp_path / "parity.json"
    code, out, _ = cli("parity", "--summary", "--only", "axpby", "--only", "norm", "--json", record)
    assert code == 0, out
    assert "axpby" in out and "norm" in out and "0 failed" in out
    assert "ordering" not in out and "model" not in out
    # --json: the run as a record, every check with its group, the totals the table printed
    r = json.loads(record.read_text())
    assert r["tool"] == "catchat parity" and r["groups"] == ["axpby", "norm"] and r["device"]
    assert {c["group"] for c in r["checks"]} == {"axpby", "norm"} and all(c["ok"] for c in r["checks"])
    assert r["passed"] == len(r["checks"]) and r["failed"] == 0 and f"{r['passed']} passed" in out
    assert [g["group"] for g in r["summary"]] == ["axpby", "norm"]
    code, _, err = cli("parity", "--only", "gem")
    assert code == 2 and "gem is not a parity group" in err and "Traceback" not in err


def test_scaled_error_is_the_largest_difference_over_the_largest_magnitude():
    r = compare("g", "1", [1.0, -3.9], [1.0, -4.0], 0, 0)
    assert r.scale == 4.0 and abs(r.scaled_error() - 0.1 / 4.0) < 1e-12
    assert compare("g", "1", [float("nan")], [1.0], 0, 0).scaled_error() == float("inf")


def test_full_shape_tool_checks_a_config_at_its_own_window_and_lanes(dev):
    """tools/full_shape_parity.py (docs/architecture.md "lavapipe's loop limit"): the whole model at the
    config's shape (shrunk here) against the reference; past --max-error it says FAIL and exits 1; a
    shape the device cannot hold is refused in `catchat train`'s words (exit 2)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    tool = [sys.executable, str(root / "tools" / "full_shape_parity.py"), "configs/tiny.toml",
            "--set", "data.batch_lanes=3", "--set", "data.window=5"]
    r = subprocess.run(tool, capture_output=True, text=True, timeout=120, cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "H=64 L=2 T=5 B=3 fp32" in r.stdout and "OK: largest" in r.stdout
    rows = [line for line in r.stdout.splitlines() if "of its size" in line]
    assert any(line.startswith("grad head.weight") for line in rows) and all(line.endswith(" ok") for line in rows)
    strict = subprocess.run([*tool, "--max-error", "0"], capture_output=True, text=True, timeout=120, cwd=root)
    assert strict.returncode == 1 and "FAIL: largest" in strict.stdout, strict.stdout + strict.stderr
    if dev.info.type == "CPU":  # lavapipe's 128 MiB storage buffers: v5's width at 2 layers does not fit
        wide = [*tool, "--set", "model.hidden=2048", "--set", "model.layers=2"]
        big = subprocess.run(wide, capture_output=True, text=True, timeout=120, cwd=root)
        assert big.returncode == 2 and "fix:" in big.stderr and "Traceback" not in big.stderr, big.stderr
