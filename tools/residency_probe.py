"""How many workgroups of a given size and shared memory does the driver run at once, per SM?

A measurement aid for kernel designs (docs/benchmarks.md), not part of catchat's program:

    python tools/residency_probe.py [--threads 128,256,512] [--shared-kb 0,16,24,32,40,48]
                                    [--per-sm 1..8] [--sms N] [--device D] [--json FILE]

Vulkan exposes neither an SM's shared memory nor how many workgroups it holds, so catchat's
co-residency check (catchat/vk/occupancy.py) assumes one workgroup per SM once a kernel takes the
48 KB a workgroup may have. A Hopper SM has 228 KB: four 48 KB workgroups would fit, if the driver
places them so. This launches SMs x k workgroups of glsl/residency_probe.comp (each fills its shared
array and meets every other at the persistent sweeps' grid barrier, its spin shortened) for
k = 1, 2, ... and reports, for each workgroup size and shared size, the largest k where every
workgroup arrived: all of them were resident at once. A k that fails costs the barrier's spin
(~0.3 s) and ends that row. On a device without an SM count (a CPU) --sms defaults to 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catchat.console import make_console, new_table  # noqa: E402
from catchat.vk import slots  # noqa: E402
from catchat.vk.device import open_device  # noqa: E402
from catchat.vk.kernels import Kernel, device_sms, run_ops  # noqa: E402
from catchat.vk.kernels.gru.plan import sync_words  # noqa: E402

HEADROOM_WORDS = 16  # the barrier's own shared flag: "48 KB" is 64 bytes short of the 49,152 a workgroup may have


def held_all(dev, threads: int, shared_words: int, workgroups: int) -> tuple[bool, float]:
    """Whether every one of `workgroups` probe workgroups passed the grid barrier, and the run's seconds."""
    stats = dev.tensor(np.zeros(slots.ST_WORDS, np.uint32), np.uint32)
    sync = dev.tensor(np.zeros(sync_words(1), np.uint32), np.uint32)  # the sweeps' grid-barrier words
    held = dev.tensor(np.zeros(workgroups, np.uint32), np.uint32)
    k = Kernel(dev, [stats, sync, held], (workgroups, 1, 1), spec=[threads, max(1, shared_words)], push=(1,),
               shader="residency_probe")
    start = time.perf_counter()
    got = run_ops(dev, [stats, sync, held], [k.op(1)], [held])[0]
    seconds = time.perf_counter() - start
    if np.any(got & 2):
        raise SystemExit(f"{threads} threads, {shared_words} words: a workgroup's shared array was overwritten")
    return bool(np.all(got == 1)), seconds


def max_per_sm(dev, threads: int, shared_kb: int, sms: int, per_sm: range) -> tuple[int, list]:
    """The largest k in per_sm (in order, stopping at the first failure) for which sms x k workgroups
    were all resident, and (k, held, seconds) per k tried."""
    best, tries = 0, []
    for k in per_sm:
        try:
            ok, seconds = held_all(dev, threads, max(1, shared_kb * 256 - HEADROOM_WORDS), sms * k)
        except RuntimeError as exc:  # a pipeline the driver would not build: the row ends, the others run
            print(f"  {threads} threads, {shared_kb} KB, {k} per SM: {exc}")
            tries.append((k, False, 0.0))
            break
        tries.append((k, ok, seconds))
        if not ok:
            break
        best = k
    return best, tries


def parse_ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers separated by commas") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=parse_ints, default=[128, 256, 512], help="workgroup sizes")
    ap.add_argument("--shared-kb", type=parse_ints, default=[0, 16, 24, 32, 40, 48],
                    help="KB of shared memory per workgroup (at most the device's limit)")
    ap.add_argument("--per-sm", type=int, default=8, help="try up to this many workgroups per SM")
    ap.add_argument("--sms", type=int, default=0, help="SMs (default: the driver's count, else 1)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", default=None, metavar="FILE")
    args = ap.parse_args(argv)
    dev = open_device(args.device)
    sms = args.sms or device_sms(dev) or 1
    limit_kb = dev.info.max_shared_memory_bytes // 1024
    print(f"{dev.info.name} ({dev.info.driver}): {sms} SMs, {limit_kb} KB of shared memory per workgroup at most")
    table = new_table("threads", "shared KB", "workgroups per SM held", "shared KB per SM held", "tries (k: s)")
    rows = []
    for threads in args.threads:
        if threads > dev.info.max_workgroup_invocations:
            print(f"  {threads} threads: above the device's {dev.info.max_workgroup_invocations}, skipped")
            continue
        for kb in args.shared_kb:
            if kb > limit_kb:
                print(f"  {kb} KB: above the device's {limit_kb} KB per workgroup, skipped")
                continue
            best, tries = max_per_sm(dev, threads, kb, sms, range(1, args.per_sm + 1))
            rows.append(dict(threads=threads, shared_kb=kb, per_sm=best, shared_kb_per_sm=best * kb,
                             tries=[dict(per_sm=k, held=ok, seconds=s) for k, ok, s in tries]))
            table.add_row(str(threads), str(kb), str(best) + ("+" if best == args.per_sm else ""),
                          str(best * kb), ", ".join(f"{k}{'' if ok else ' failed'}: {s:.2f}" for k, ok, s in tries))
    make_console().print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(tool="tools/residency_probe.py", argv=sys.argv[1:],
                                                   date=time.strftime("%Y-%m-%d"), device=dev.info.name,
                                                   driver=dev.info.driver, sms=sms, rows=rows), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
