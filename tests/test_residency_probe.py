"""tools/residency_probe.py: workgroups that all pass the grid barrier are reported resident together;
more than the device runs at once are reported as failing, without hanging (lavapipe runs a workgroup
per thread, so 1,024 of them cannot all be resident on a CPU)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import residency_probe as rp  # noqa: E402


def test_one_workgroup_always_holds_and_too_many_fail(dev):
    assert rp.held_all(dev, 64, 16 * 256, 1)[0]
    assert not rp.held_all(dev, 64, 16 * 256, 1024)[0]  # more than any CPU runs at once


def test_rows_stop_at_the_first_failure(dev, tmp_path):
    out = tmp_path / "probe.json"
    assert rp.main(["--threads", "64", "--shared-kb", "0,8", "--per-sm", "64", "--sms", "1",
                    "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["threads"], r["shared_kb"]) for r in rows] == [(64, 0), (64, 8)]
    for r in rows:
        assert 1 <= r["per_sm"] < 64 and r["shared_kb_per_sm"] == r["per_sm"] * r["shared_kb"]
        assert [t["held"] for t in r["tries"]] == [True] * r["per_sm"] + [False]
        assert [t["per_sm"] for t in r["tries"]] == list(range(1, r["per_sm"] + 2))
