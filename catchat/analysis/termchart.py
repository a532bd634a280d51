"""A line chart drawn in a terminal with braille characters (2 x 4 dots a cell), for `catchat watch`.

    lines = braille_chart([(steps, losses, "cyan"), (eval_steps, eval_losses, "magenta")],
                          width_cells=60, height_cells=8)   # -> rich Text lines, y labels included

Each series is binned into the chart's dot columns (the mean of the points that fall in a column,
nan skipped) and drawn as a line: a column's dot is joined to the previous one's by a vertical run,
so a steep fall stays visible. A cell takes the colour of the last series that drew in it. Only rich
is needed: no plotting library.
"""

from __future__ import annotations

import math

import numpy as np
from rich.text import Text

# the bit of each dot in a braille cell, by (column, row) inside the cell (Unicode's dot numbering)
_DOT = {(0, 0): 0x01, (0, 1): 0x02, (0, 2): 0x04, (0, 3): 0x40, (1, 0): 0x08, (1, 1): 0x10, (1, 2): 0x20, (1, 3): 0x80}
LABEL_WIDTH = 8  # "  4.6152 ┤": the y labels' column


def binned(xs: np.ndarray, ys: np.ndarray, x_lo: float, x_hi: float, columns: int) -> np.ndarray:
    """The mean of the finite ys whose x falls in each of `columns` equal bins of [x_lo, x_hi]
    (nan where a bin has none)."""
    ok = np.isfinite(ys) & np.isfinite(xs)
    xs, ys = xs[ok], ys[ok]
    span = max(x_hi - x_lo, 1e-12)
    idx = np.clip(((xs - x_lo) / span * columns).astype(np.int64), 0, columns - 1)
    sums = np.bincount(idx, weights=ys, minlength=columns)
    counts = np.bincount(idx, minlength=columns)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def braille_chart(series: list[tuple[np.ndarray, np.ndarray, str]], width_cells: int, height_cells: int,
                  y_format: str = "{:.3f}") -> list[Text]:
    """`height_cells` + 1 lines: the chart with y labels at the top, middle and bottom, and an x
    axis labelled with the first and last x. series: (xs, ys, rich colour), drawn in order."""
    width_cells, height_cells = max(width_cells, 4), max(height_cells, 2)
    series = [(np.asarray(x, np.float64), np.asarray(y, np.float64), c) for x, y, c in series]
    finite = [(x[np.isfinite(y)], y[np.isfinite(y)]) for x, y, _ in series]
    all_x = np.concatenate([x for x, _ in finite] or [np.zeros(0)])
    all_y = np.concatenate([y for _, y in finite] or [np.zeros(0)])
    if all_y.size == 0:
        return [Text("(no finite values yet)", style="dim")]
    x_lo, x_hi = float(all_x.min()), float(all_x.max())
    cols, rows = width_cells * 2, height_cells * 4
    binned_all = [binned(x, y, x_lo, x_hi, cols) for x, y, _ in series]
    y_lo = min(float(np.nanmin(b)) for b in binned_all if np.isfinite(b).any())
    y_hi = max(float(np.nanmax(b)) for b in binned_all if np.isfinite(b).any())
    if y_hi - y_lo < 1e-12:
        y_lo, y_hi = y_lo - 0.5, y_hi + 0.5
    bits = np.zeros((height_cells, width_cells), np.int64)
    colour: dict[tuple[int, int], str] = {}
    for values, (_, _, style) in zip(binned_all, series):
        prev = None  # (column, row) of the last dot drawn
        for col, v in enumerate(values):
            if not math.isfinite(v):
                continue
            row = (y_hi - v) / (y_hi - y_lo) * (rows - 1)
            start = prev or (col, row)
            for c in range(start[0] + (prev is not None), col + 1):  # across empty columns: a straight line
                r_here = start[1] + (row - start[1]) * (c - start[0]) / max(col - start[0], 1)
                r_before = start[1] + (row - start[1]) * (c - 1 - start[0]) / max(col - start[0], 1)
                lo, hi = sorted((round(r_here), round(r_before) if c > start[0] else round(r_here)))
                for r in range(lo, hi + 1):
                    bits[r // 4, c // 2] |= _DOT[(c % 2, r % 4)]
                    colour[(r // 4, c // 2)] = style
            prev = (col, row)
    labels = {0: y_hi, height_cells // 2: (y_hi + y_lo) / 2, height_cells - 1: y_lo}
    lines = []
    for r in range(height_cells):
        label = f"{y_format.format(labels[r]):>{LABEL_WIDTH - 2}} ┤" if r in labels else " " * (LABEL_WIDTH - 1) + "│"
        line = Text(label, style="dim")
        for c in range(width_cells):
            line.append(chr(0x2800 + int(bits[r, c])), style=colour.get((r, c), ""))
        lines.append(line)
    first, last = f"{x_lo:.0f}", f"{x_hi:.0f}"
    axis = " " * (LABEL_WIDTH - 1) + "└" + first + last.rjust(max(width_cells - len(first), len(last) + 1))
    lines.append(Text(axis, style="dim"))
    return lines
