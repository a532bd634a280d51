"""Data parallelism over MPI (mpi4py): which rank owns which lanes, and the collectives a step needs.

`mpiexec -n N catchat train CONFIG` starts N processes (ranks); each opens its own Vulkan device
(local rank modulo the devices, `--device A,B,...` / CATCHAT_DEVICE to choose), builds the global
lanes of `data.batch_lanes` and owns a contiguous share of them (`lane_share`): its columns of every
window, their carried state, their dropout and scheduled-sampling draws (the GPU draws with the
global lane index: HP_LANE_OFFSET / HP_LANES in the hyper buffer). A step: each rank runs its
micro-batches, downloads its gradient sum, `Comm.sum_grads` adds the ranks' sums in rank order
(reduce-scatter by Alltoall, float32 additions in rank order, all-gather), uploads the total and
runs the same optimizer step as every other rank (grad norm, clip and the skip guard see the same
total). The loss is divided by the step's global valid-target count, which every rank counts on the
host from the global windows (lesson 10), so N ranks compute the one-process step up to float32
summation order, on any MPI implementation.

A single process (no launcher, or `mpiexec -n 1`) never imports mpi4py: `init()` returns None.

Faults: every collective is non-blocking and waited on with a deadline (CATCHAT_MPI_TIMEOUT
seconds, default 600; the start-up's exchange waits START_TIMEOUT_S at least): a rank that hangs or
dies makes the others raise `RankLost`, which the command line prints as one line before exiting
without MPI_Finalize (that would wait for the lost rank). A rank that fails with an error of its own
(its device lost, a disk full) prints its one line, flushes it, and tells the others (`end_ranks`):
each of them, waiting in a collective, raises `RankFailed` with that line, records it in the run's
events (rank 0), prints "stopped: rank N failed: ..." and answers; the failing rank waits for the
answers (at most the deadline), then every rank leaves with os._exit, skipping a slow wind-down.
Never MPI_Abort: the launcher tears the job down on an abort without draining the ranks' output, and
the failing rank's line was lost that way (1 run in 40 with MPICH's Hydra). A process that exits,
however abruptly, has its written output read to the end; Hydra then ends the ranks still running.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from catchat import exchange
from catchat.errors import CatchatError, UsageError

ENV_TIMEOUT = "CATCHAT_MPI_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
START_TIMEOUT_S = 1800.0  # rank 0 may build a corpus or load a large checkpoint while the others wait
# what launchers set: Open MPI, MPICH/Intel MPI (Hydra, also Slurm's PMI2), MVAPICH
SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK")


class RankLost(CatchatError):
    """Another rank stopped answering (died or hangs), or MPI reported it gone."""

    exit_code = 1


class RankFailed(RankLost):
    """Another rank failed with an error and said so: its line is in `message`; this rank only stops
    (the command line prints it as "stopped:", not as a second error)."""

    label = "stopped"

    def __init__(self, rank: int, line: str):
        super().__init__(f"rank {rank} failed: {line}")
        self.rank = rank


def _env_int(names, environ) -> int | None:
    """The first of the environment variables `names` that holds a number (None: none does)."""
    for var in names:
        value = environ.get(var, "").strip()
        if value.isdigit():
            return int(value)
    return None


def launched_size(environ=os.environ) -> int:
    """The number of ranks a launcher (mpiexec, mpirun, srun) started, from its environment; 1 without one."""
    size = _env_int(SIZE_VARS, environ)
    return 1 if size is None else size


def local_rank_env(environ=os.environ) -> int | None:
    """This process's rank on its host as the launcher says it (None: not said)."""
    return _env_int(LOCAL_RANK_VARS, environ)


def find_mpiexec() -> str | None:
    """The launcher for this Python's ranks: the mpiexec beside it (MPICH's wheel in a venv, as `make
    setup` installs it), else the first on PATH; None where there is none."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def lane_share(lanes: int, size: int, rank: int) -> tuple[int, int]:
    """Lanes [lo, hi) of `rank` among `size`: contiguous, sizes differing by at most one (the first
    lanes % size ranks take one more)."""
    if lanes < size:
        raise UsageError(f"data.batch_lanes = {lanes} lanes cannot be shared by {size} ranks (each needs one)",
                         f"raise data.batch_lanes to at least {size}, or start fewer ranks")
    base, extra = divmod(lanes, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def device_selector(selector: str | None, local_rank: int, devices) -> str:
    """The device a rank opens: from a comma list ("0,1" or names) the entry local_rank modulo its
    length; a single selector as given; none: local rank modulo the discrete GPUs (or all devices
    when there is none)."""
    if selector is not None and str(selector).strip():
        items = [s.strip() for s in str(selector).split(",") if s.strip()]
        return items[local_rank % len(items)] if items else ""
    gpus = [d for d in devices if d.type == "discrete GPU"] or list(devices)
    if not gpus:
        return ""
    return str(gpus[local_rank % len(gpus)].index)


def timeout_from_env(environ=os.environ) -> float:
    raw = environ.get(ENV_TIMEOUT, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(f"{ENV_TIMEOUT}={raw!r} is not a positive number of seconds", f"unset it (default "
                         f"{DEFAULT_TIMEOUT_S:g} s) or set e.g. {ENV_TIMEOUT}=120")
    return value


_started: Comm | None = None  # this process's communicator, once init() made one


def init(*, force: bool = False) -> Comm | None:
    """The world communicator when launched on more than one rank (or `force`), else None; only then
    is mpi4py imported (a single process needs no MPI)."""
    if launched_size() <= 1 and not force:
        return None
    try:
        import mpi4py

        mpi4py.rc.finalize = False  # finalized by Comm.finish on a clean end only: never wait on a lost rank
        from mpi4py import MPI
    except ImportError:
        raise UsageError("catchat was started by an MPI launcher (or with --distributed), but mpi4py is not "
                         "installed", "run `make setup` (it installs mpi4py and MPICH into .venv), or "
                                      "`pip install mpi4py mpich`") from None
    world = MPI.COMM_WORLD
    if world.Get_size() <= 1 and not force:
        return None
    global _started
    _started = Comm(MPI, world, timeout_from_env())
    return _started


def end_ranks(exit_code: int, line: str) -> None:
    """After this rank printed why it stops (`line`): make sure that line is out, let the others know
    (or answer the rank whose failure stops this one), and leave now with os._exit: no MPI_Finalize
    (a lost rank would never join it) and no slow wind-down. Nothing for a single process."""
    comm = _started
    if comm is None or comm.size <= 1:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        comm.settle_failure(line)
    finally:
        os._exit(exit_code)


@dataclass
class Timing:
    """The sum_grads calls since the last `Comm.take_timing`: seconds waiting for the slowest rank to
    arrive (a barrier; `waits` holds each wait's (start, end) on time.perf_counter's clock), and of
    the exchange itself once all are there (collectives and the host's sum). The device's download
    and upload of the gradient are timed by the Program (Program.exchange.times)."""

    wait_s: float = 0.0
    exchange_s: float = 0.0
    waits: list[tuple[float, float]] = field(default_factory=list)

    def wait_within(self, begin: float, end: float) -> float:
        """Seconds of the waits that fell between begin and end."""
        return sum(max(0.0, min(b, end) - max(a, begin)) for a, b in self.waits)


class Comm:
    """The world communicator with deadlines on every collective, and the few operations training uses."""

    def __init__(self, MPI, world, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.MPI, self.world, self.timeout_s = MPI, world, float(timeout_s)
        self.rank, self.size = world.Get_rank(), world.Get_size()
        self.host = MPI.Get_processor_name()
        self.hosts = self.allgather_obj(self.host, "exchanging host names")  # every rank's, in rank order
        local = local_rank_env()
        self.local_rank = exchange.host_layout(self.hosts)[1][self.rank] if local is None else local  # rank order
        self.timing = Timing()
        self.exchange_dtype, self.hierarchical = "fp32", False
        self._exchange: exchange.GradExchange | None = None  # made by the first sum_grads (set_exchange)
        self.failed_peer: int | None = None  # the rank whose failure notice stopped this one
        self.unresponsive = False  # a deadline passed: the others may never answer a notice

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ failure notices
    # Point-to-point messages on the world communicator never match a collective's traffic.
    NOTICE_TAG, ANSWER_TAG = 0x6361, 0x6362

    def _take(self, tag: int):
        """(source, message) of a waiting message with `tag` from any rank, or None."""
        status = self.MPI.Status()
        if not self.world.Iprobe(source=self.MPI.ANY_SOURCE, tag=tag, status=status):
            return None
        src = status.Get_source()
        return src, self.world.recv(source=src, tag=tag)

    def _check_notices(self) -> None:
        """Raise RankFailed when another rank has sent word of its failure."""
        notice = self._take(self.NOTICE_TAG)
        if notice is not None:
            self.failed_peer = notice[0]
            raise RankFailed(*notice)

    def settle_failure(self, line: str) -> None:
        """This rank stops. Stopped by another's failure: answer it (it waits for that before it
        exits, so that this rank's record of it is written), within the deadline. Failing itself:
        send `line` to every other rank and wait for their answers, at most the deadline (none when
        a deadline already passed: the others may be hung); a rank failing at the same moment counts
        as answered, and is answered."""
        if self.failed_peer is not None:
            self._wait(self.world.isend(self.rank, dest=self.failed_peer, tag=self.ANSWER_TAG),
                       f"answering rank {self.failed_peer}")
            return
        waiting = {r for r in range(self.size) if r != self.rank}
        # every request is kept until this process ends: its pickled message must outlive the send
        sends = [self.world.isend(line, dest=r, tag=self.NOTICE_TAG) for r in sorted(waiting)]
        deadline = time.monotonic() + (0.0 if self.unresponsive else self.timeout_s)
        while waiting and time.monotonic() < deadline:
            answer, notice = self._take(self.ANSWER_TAG), self._take(self.NOTICE_TAG)
            for src, _ in filter(None, (answer, notice)):
                waiting.discard(src)
            if notice is not None:  # failing too: it waits for our answer as we wait for its
                sends.append(self.world.isend(self.rank, dest=notice[0], tag=self.ANSWER_TAG))
            if answer is None and notice is None:
                time.sleep(self.MAX_PAUSE_S)

    # ------------------------------------------------------------------ waiting with a deadline
    SPIN_S = 2e-3  # a wait polls without pause this long, then sleeps between polls (up to MAX_PAUSE_S)
    MAX_PAUSE_S = 1e-3

    def _wait(self, req, what: str, timeout_s: float | None = None, *, spin: bool = False) -> None:
        """Wait for a non-blocking request; past the deadline raise RankLost. MPI moves a message only
        while a rank is inside an MPI call, so a transfer whose peers are all present is waited for by
        polling without pause (`spin`: MPI's own blocking calls spin the same way); a wait for a rank
        still computing (a barrier) polls SPIN_S, then sleeps between polls, leaving the CPU to the
        others (lavapipe's threads, on a CPU device). A signal handler runs between polls, and
        another rank's failure notice is looked for whenever the clock is read."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        start = time.monotonic()
        deadline, calm = start + limit, start + self.SPIN_S
        pause, polls, spinning = 0.0, 0, True
        try:
            while not req.Test():
                polls += 1
                if spinning and polls % 256:  # the clock is read every 256 polls while spinning
                    continue
                self._check_notices()
                now = time.monotonic()
                if now > deadline:
                    self.unresponsive = True
                    raise RankLost(f"rank {self.rank} ({self.host}): no answer from the other ranks for {limit:g} s "
                                   f"while {what}: a rank died or hangs; stopping ({ENV_TIMEOUT} sets the wait)")
                if not spin and now > calm:
                    spinning = False
                    time.sleep(pause)
                    pause = min(self.MAX_PAUSE_S, max(2e-5, pause * 2))
        except self.MPI.Exception as exc:
            raise RankLost(f"rank {self.rank} ({self.host}): MPI failed while {what}: "
                           f"{exc.Get_error_string().strip()}") from None

    # ------------------------------------------------------------------ collectives
    def bcast_obj(self, obj, what: str, timeout_s: float | None = None):
        """Rank 0's picklable `obj` on every rank."""
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if self.is_root else b""
        n = np.array([len(data)], np.int64)
        self._wait(self.world.Ibcast(n, root=0), what, timeout_s)
        buf = np.frombuffer(data, np.uint8).copy() if self.is_root else np.empty(int(n[0]), np.uint8)
        self._wait(self.world.Ibcast(buf, root=0), what, timeout_s)
        return obj if self.is_root else pickle.loads(buf.tobytes())

    def allgather_obj(self, obj, what: str) -> list:
        """Every rank's picklable `obj`, in rank order."""
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        sizes = np.empty(self.size, np.int64)
        self._wait(self.world.Iallgather(np.array([len(data)], np.int64), sizes), what)
        out = np.empty(int(sizes.sum()), np.uint8)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        self._wait(self.world.Iallgatherv(data.copy(), [out, (sizes, offsets), self.MPI.BYTE]), what)
        return [pickle.loads(out[o:o + s].tobytes()) for o, s in zip(offsets, sizes)]

    def sum_rows(self, values, what: str) -> np.ndarray:
        """The element-wise sum of every rank's float64 vector, added in rank order (the same bits on
        every rank, whatever the MPI)."""
        mine = np.ascontiguousarray(values, np.float64).ravel()
        rows = np.empty((self.size, mine.size), np.float64)
        self._wait(self.world.Iallgather(mine, rows), what)
        return exchange.rank_order_sum(rows)

    def set_exchange(self, dtype: str = "fp32", hierarchical: bool = False) -> None:
        """How sum_grads exchanges (catchat/exchange.py): float32 or float16 on the wire, flat or by
        host (refused where the hosts hold different numbers of ranks). Takes effect at the next
        sum_grads, which every rank reaches (the by-host communicators are made there, collectively)."""
        if dtype not in exchange.CODECS:
            raise ValueError(f"exchange dtype {dtype!r}: one of {', '.join(exchange.CODECS)}")
        if hierarchical:
            exchange.check_hierarchical(exchange.host_names(self.hosts))
        self.exchange_dtype, self.hierarchical, self._exchange = dtype, bool(hierarchical), None

    def _made_exchange(self) -> exchange.GradExchange:
        if self._exchange is None:
            levels = [self.world]
            hosts = exchange.host_names(self.hosts) if self.hierarchical else [self.host]
            if len(set(hosts)) > 1:  # by host; on one host the flat exchange is the same, bit for bit
                host, local = (v[self.rank] for v in exchange.host_layout(hosts))
                # blocking, without the deadline (mpi4py has no non-blocking split): every rank is here
                levels = [self.world.Split(host, self.rank), self.world.Split(local, host)]
            self._exchange = exchange.GradExchange(exchange.CODECS[self.exchange_dtype](), levels, self._wait)
        return self._exchange

    def sum_grads(self, grads: np.ndarray, what: str = "summing gradients", out: np.ndarray | None = None
                  ) -> np.ndarray:
        """The sum over ranks of a float32 gradient vector (or a range of one), identical on every rank
        and independent of the MPI implementation (catchat/exchange.py: a reduce-scatter whose adding
        we do, in rank order, then an all-gather; bytes per rank: 2 (N-1)/N of the vector at fp32, as
        a ring all-reduce), into `out` where given (it may be `grads`; GradExchange.sum). A barrier
        first: the wait for the slowest rank, timed apart (`timing`)."""
        summing = self._made_exchange()
        arrived = time.perf_counter()
        self._wait(self.world.Ibarrier(), what)  # the wait for the slowest rank, not spinning
        started = time.perf_counter()
        out = summing.sum(grads, what, out)
        t = self.timing
        t.wait_s, t.exchange_s = t.wait_s + started - arrived, t.exchange_s + time.perf_counter() - started
        t.waits.append((arrived, started))
        return out

    def take_timing(self) -> Timing:
        """The sum_grads calls' timing since the last take (a step's), and a fresh start."""
        taken, self.timing = self.timing, Timing()
        return taken

    def gather_lanes(self, local: np.ndarray, shares: list[tuple[int, int]], what: str) -> np.ndarray | None:
        """Rank 0: every rank's [L, b_r, H] block (lanes shares[r]) joined into [L, B, H]; others: None."""
        local = np.ascontiguousarray(local, np.float32)
        L, H = local.shape[0], local.shape[2]
        counts = np.array([L * (hi - lo) * H for lo, hi in shares], np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        out = np.empty(int(counts.sum()), np.float32) if self.is_root else None
        recv = [out, (counts, offsets), self.MPI.FLOAT] if self.is_root else None
        self._wait(self.world.Igatherv(local.ravel(), recv, root=0), what)
        if not self.is_root:
            return None
        blocks = [out[o:o + c].reshape(L, hi - lo, H) for o, c, (lo, hi) in zip(offsets, counts, shares)]
        return np.concatenate(blocks, axis=1)

    def barrier(self, what: str) -> None:
        self._wait(self.world.Ibarrier(), what)

    def finish(self) -> None:
        """MPI_Finalize after a clean end (every rank got here)."""
        if not self.MPI.Is_finalized():
            self.MPI.Finalize()
