"""`catchat parity`: every check passes here, the table and the per-family summary are printed."""

from catchat import parity
from catchat.parity import compare


def test_parity_command_passes_and_summarises(cli):
    code, out, _ = cli("parity", "--summary")
    assert code == 0, out
    assert "0 failed" in out
    for group in ("axpby", "gemm", "gru", "norm", "loss", "optim", "sampling", "ordering", "model"):
        assert group in out


def test_summarise_counts_failures():
    rows = [("gemm", compare("a", "1", [1.0], [1.0], 0, 0)), ("gemm", compare("b", "1", [2.0], [1.0], 0, 0)),
            ("gru", compare("c", "1", [1.0], [1.0 + 1e-7], 1e-6, 0))]
    s = parity.summarise(rows)
    assert [(g["group"], g["checks"], g["failed"]) for g in s] == [("gemm", 2, 1), ("gru", 1, 0)]
    assert s[0]["max_abs"] == 1.0


def test_only_runs_the_named_groups_and_refuses_unknown_ones(cli):
    code, out, _ = cli("parity", "--summary", "--only", "gemm", "--only", "norm")
    assert code == 0, out
    assert "gemm" in out and "norm" in out and "0 failed" in out
    assert "ordering" not in out and "model" not in out
    code, _, err = cli("parity", "--only", "gem")
    assert code == 2 and "gem is not a parity group" in err and "Traceback" not in err
