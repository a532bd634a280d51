"""tools/coopmat_layout.py's reading of what each invocation of a subgroup holds (the shader itself needs
VK_KHR_cooperative_matrix: it compiles here and runs on a GPU). Checked on the layout NVIDIA documents for
mma.m16n8k16's operands, where each invocation's 8 halves are 4 pairs in catchat's stored blocks."""

import numpy as np

from catchat.vk import shaders

from support import load_tool

LANES, MAXLEN = 32, 32


def mma_map(use: str) -> np.ndarray:
    """(row, column) of element i of lane l in PTX's m16n8k16 fragments (A: rows g, g + 8 and columns
    2t, 2t + 1, +8; B: k rows 2t, 2t + 1, +8 of columns g and g + 8); accumulators as A."""
    out = np.zeros((LANES, 8, 2), np.int64)
    for lane in range(LANES):
        g, t = lane // 4, lane % 4
        if use == "B":
            cells = [(2 * t + dk + kk, g + n8) for n8 in (0, 8) for kk in (0, 8) for dk in (0, 1)]
        else:
            cells = [(g + r8, 2 * t + dc + c8) for c8 in (0, 8) for r8 in (0, 8) for dc in (0, 1)]
        out[lane] = cells
    return out


def raw_from(maps: dict) -> np.ndarray:
    """What the shader writes for these maps: each use loaded row-major (value r * 16 + c) and column-major
    (value c * 16 + r)."""
    raw = np.full((6, LANES, MAXLEN), -1.0, np.float32)
    for u, use in enumerate(("A", "B", "accumulator")):
        rc = maps[use]
        raw[2 * u, :, :8] = rc[..., 0] * 16 + rc[..., 1]
        raw[2 * u + 1, :, :8] = rc[..., 1] * 16 + rc[..., 0]
    return raw


def test_the_mma_layout_costs_four_loads_a_fragment_and_both_orders_agree():
    tool = load_tool("coopmat_layout")
    maps = {u: mma_map(u) for u in ("A", "B", "accumulator")}
    res = tool.analyse(raw_from(maps), [8] * 6)
    for use in ("A", "B"):
        r = res[use]
        assert r["elements"] == 8 and r["orders_agree"] and r["covers_all"]
        assert (r["runs_fewest"], r["runs_most"], r["run_halves"]) == (4, 4, [2]), (use, r)
        assert r["map"][5] == maps[use][5].tolist()
    assert res["B"]["stored"] == "column-major" and res["A"]["stored"] == "row-major"


def test_a_fragment_order_copy_is_one_run_and_a_disagreement_is_caught():
    tool = load_tool("coopmat_layout")
    maps = {u: mma_map(u) for u in ("A", "B", "accumulator")}
    order = np.arange(256).reshape(LANES, 8)  # lane l's 8 elements consecutive in the stored block
    maps["A"] = np.stack([order // 16, order % 16], -1)
    raw = raw_from(maps)
    res = tool.analyse(raw, [8] * 6)
    assert (res["A"]["runs_most"], res["A"]["run_halves"]) == (1, [8])
    raw[3, 7, 2] = raw[3, 7, 3]  # the column-major B load says something else for one element
    res = tool.analyse(raw, [8] * 6)
    assert not res["B"]["orders_agree"] and res["A"]["orders_agree"]


def test_the_probe_shader_compiles_for_the_khr_extension():
    spirv = shaders.compile_shader("coopmat_layout", {})
    words = np.frombuffer(spirv[:8], np.uint32)
    assert words[0] == 0x07230203 and (words[1] >> 8) & 0xFF == 6


def test_the_tool_says_in_one_line_where_there_is_nothing_to_probe(capsys):
    """On a device without the KHR extension (lavapipe; here on any device) the tool refuses with exit 2
    and one line, no traceback."""
    import sys

    tool = load_tool("coopmat_layout")
    tool.coopmat_khr_runs = lambda dev: False
    argv, sys.argv = sys.argv, ["coopmat_layout.py"]
    try:
        assert tool.main() == 2
    finally:
        sys.argv = argv
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no VK_KHR_cooperative_matrix" in err[0]
