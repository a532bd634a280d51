#!/usr/bin/env python3
"""What the register-resident tensor-core sweeps' parity rows catch: `catchat parity`'s `coop` and `rsplit32`
gru rows on this device, as built and with one deliberate fault each (the shader text changed in a scratch
copy of glsl/, nothing in the tree touched). On lavapipe the fragments are emulated.

    python tools/resident_faults.py

Prints a line a fault: how many rows fail and the largest error. A fault no row catches is a hole in the
parity (docs/results/2026-12-08-lavapipe-resident-faults.txt is this machine's run).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from catchat.parity import gru as gru_parity  # noqa: E402
from catchat.vk import shaders  # noqa: E402
from catchat.vk.device import open_device  # noqa: E402

# label: [(shader file, text, replacement)]
FAULTS = {
    "as built": [],
    "forward reads W_hh^T's blocks untransposed (EMU W_FRAG_REF col=false)":
        [("gru_forward_resident.comp", "W_FRAG_REF(g * pc.H + j0, k0, true, lo)",
          "W_FRAG_REF(g * pc.H + j0, k0, false, lo)")],
    "backward reads W_hh's blocks transposed (EMU W_FRAG_REF col=true)":
        [("gru_backward_resident.comp", "W_FRAG_REF(q * pc.H + j0, k0, false, false)",
          "W_FRAG_REF(q * pc.H + j0, k0, true, false)")],
    "split forward drops the lo products (accl scaled by 0)":
        [("gru_forward_resident.comp", "ACC_ADD_SCALED(acc, accl, 1.0 / SPLIT_SCALE)",
          "ACC_ADD_SCALED(acc, accl, 0.0)")],
    "split forward multiplies hi h_prev for lo (al -> a)":
        [("gru_forward_resident.comp", "accl = MUL_ADD(al, wf[f], accl)", "accl = MUL_ADD(a, wf[f], accl)")],
}


def faulty_glsl(edits) -> Path:
    """A scratch copy of glsl/ with the edits made (each text found exactly once)."""
    tmp = Path(tempfile.mkdtemp(prefix="catchat-faults-")) / "glsl"
    shutil.copytree(ROOT / "glsl", tmp)
    for file, old, new in edits:
        path = tmp / file
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"{file}: {old!r} is not in it exactly once (the shader changed: update FAULTS)")
        path.write_text(text.replace(old, new))
    return tmp


def main() -> int:
    dev = open_device()
    for name in ("CASES", "PERSISTENT_CASES", "HALF_W_CASES", "STREAM_CASES", "STREAM_F32_CASES", "KSPLIT_CASES"):
        setattr(gru_parity, name, [])  # the resident tensor-core rows alone
    print(f"device: {dev.info.name}; rows: the gru parity's coop and rsplit32 variants "
          f"({len(gru_parity.COOP_CASES)} + {len(gru_parity.RSPLIT_CASES)} cases here)")
    for label, edits in FAULTS.items():
        glsl = faulty_glsl(edits)
        shaders.GLSL_DIR, shaders.INCLUDE_DIR = glsl, glsl / "include"
        start = time.time()
        rows = [r for r in gru_parity.parity_checks(dev) if "_coop" in r.kernel or "_rsplit32" in r.kernel]
        bad = [r for r in rows if not r.ok]
        worst = max((r.max_abs for r in bad), default=0.0)
        print(f"{label}: {len(bad)} of {len(rows)} rows fail (largest error {worst:.3g}; {time.time() - start:.1f} s)")
        for file, old, new in edits:
            print(f"    {file}: {old!r} -> {new!r}")
        shutil.rmtree(glsl.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
