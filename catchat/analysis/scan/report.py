"""Statuses, findings and the report of `catchat scan`, and the text helpers its checks share.

Each check module holds its own thresholds (docs/reliability.md lists them all)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

OK, WARN, FAIL = "ok", "warn", "FAIL"

MAX_LISTED = 5  # steps listed per finding
MAX_STEPS = 1000  # steps kept in a finding (a gap may be any size)


@dataclass
class Finding:
    check: str
    status: str
    detail: str
    steps: list[int] = field(default_factory=list)
    total: int | None = None  # how many steps are concerned, when more than `steps` holds

    @property
    def count(self) -> int:
        return len(self.steps) if self.total is None else self.total


@dataclass
class ScanReport:
    run_dir: Path
    rows: int
    findings: list[Finding]

    @property
    def defects(self) -> list[Finding]:
        return [f for f in self.findings if f.status == FAIL]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.status == WARN]

    def status(self, check: str) -> str:
        return next(f.status for f in self.findings if f.check == check)

    def finding(self, check: str) -> Finding:
        return next(f for f in self.findings if f.check == check)


def steps_text(steps: list[int]) -> str:
    shown = ", ".join(str(s) for s in steps[:MAX_LISTED])
    return f"step{'s' if len(steps) > 1 else ''} {shown}" + (f" (+{len(steps) - MAX_LISTED} more)"
                                                           if len(steps) > MAX_LISTED else "")


def cell_text(value, limit: int = 120) -> str:
    """A string from the telemetry, fit for one table cell: control characters escaped, cut at `limit`."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value)[:limit + 1])
    return text if len(text) <= limit else text[:limit - 3] + "..."


def table_rows(report: ScanReport) -> list[tuple[str, str, str, str]]:
    """(check, status, count, detail) per finding, for the CLI table."""
    return [(f.check, f.status, str(f.count) if f.steps else "", f.detail) for f in report.findings]
