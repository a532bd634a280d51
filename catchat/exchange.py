"""How the ranks add up a gradient (`Comm.sum_grads`, catchat/distributed.py; docs/distributed.md).

The sum is a reduce-scatter (an Alltoall hands rank i block i of every rank's vector; rank i adds
them in rank order, in float32) followed by an all-gather of the summed blocks. catchat does the
additions, not the MPI implementation, so every rank holds the same bits, on any MPI.

What travels (`distributed.exchange_dtype`):
- "fp32": the float32 values as they are.
- "fp16": each block as float16 times a power of two 2^k chosen from the block's largest magnitude,
  which lands in [2^14, 2^15) (float16's largest finite value is 65504): no finite gradient
  overflows, at any size or loss scale; values below 2^-39 of the block's largest become zero. k
  travels in the block's first two 16-bit words. An inf or NaN travels as such (the scale comes
  from the block's finite values), so the optimizer's skip guard sees it. The additions stay float32;
  a block is rounded where it leaves its rank (a rank's share going to its adder, a sum going back),
  and every rank, the adder included, takes the decoded bits.

By host (`distributed.hierarchical`): the ranks of a host first reduce-scatter among themselves
(rank i of a host adds block i of its host's ranks), then the ranks holding block i on each host
reduce-scatter it across the hosts (in host order), and the summed pieces come back the same way:
a host sends 2 (hosts-1)/hosts of the gradient across the network instead of ranks-per-host times
that. The additions then run host by host: (g0 + g1) + (g2 + g3) for two hosts of two ranks, where
the flat exchange adds ((g0 + g1) + g2) + g3. Every host needs the same number of ranks. On one host
it is the flat exchange, bit for bit. CATCHAT_MPI_FAKE_HOSTS=N (tests) deals the ranks out to N
pretend hosts in blocks of consecutive ranks.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from catchat.errors import UsageError

EXCHANGE_DTYPES = ("fp32", "fp16")
ENV_FAKE_HOSTS = "CATCHAT_MPI_FAKE_HOSTS"
ENV_CODEC_THREADS = "CATCHAT_EXCHANGE_THREADS"
MAX_CODEC_THREADS = 8
CODEC_SPAN = 1 << 20  # values per thread's share of a block: below 2 spans one thread does it all


def codec_threads(environ=os.environ) -> int:
    """Threads for the float16 exchange's casts (numpy's casts release the GIL, and run at ~3-4 ns a
    value on one core: docs/distributed.md): CATCHAT_EXCHANGE_THREADS, else the CPUs this process may
    run on, at most MAX_CODEC_THREADS."""
    raw = environ.get(ENV_CODEC_THREADS, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise UsageError(f"{ENV_CODEC_THREADS}={raw!r} is not a number of threads",
                             f"unset it, or set e.g. {ENV_CODEC_THREADS}=4")
        return int(raw)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_CODEC_THREADS, cpus))


# ----------------------------------------------------------------------------- what travels
class Float32Blocks:
    """Blocks travel as float32, unchanged."""

    def encode(self, blocks: np.ndarray) -> np.ndarray:
        """float32 [n, m] -> what is sent [n, m]."""
        return np.ascontiguousarray(blocks, np.float32)

    def decode(self, sent: np.ndarray) -> np.ndarray:
        return sent


class Float16Blocks:
    """Blocks travel as float16 scaled by 2^k per block (the module's docstring): uint16 [n, 2 + m],
    k (int32) in words 0-1, the scaled values in the rest. The passes over the values (the peaks, the
    scaled casts) run on `threads` threads (`codec_threads`), each over a span of every block's
    columns: element by element the same operations, so the same bits as one thread."""

    HEADER = 2  # uint16 words of k
    TOP_EXPONENT = 15  # the block's largest magnitude is scaled into [2^14, 2^15)

    def __init__(self, threads: int | None = None):
        self.threads = codec_threads() if threads is None else max(1, int(threads))
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="fp16-exchange") if self.threads > 1 else None

    def _spans(self, m: int, work) -> list:
        """[work(lo, hi) for column spans [lo, hi) covering [0, m)], on the pool where m is long enough."""
        parts = min(self.threads, max(1, m // CODEC_SPAN))
        spans = [(m * i // parts, m * (i + 1) // parts) for i in range(parts)]
        if parts == 1 or self._pool is None:
            return [work(lo, hi) for lo, hi in spans]
        return list(self._pool.map(lambda span: work(*span), spans))

    def encode(self, blocks: np.ndarray) -> np.ndarray:
        blocks = np.asarray(blocks, np.float32)
        n, m = blocks.shape
        if m:  # the largest value and the smallest of each block, span by span (max and min are exact)
            ends = self._spans(m, lambda lo, hi: (blocks[:, lo:hi].max(axis=1), blocks[:, lo:hi].min(axis=1)))
            peak = np.maximum(np.max([a for a, _ in ends], axis=0), -np.min([b for _, b in ends], axis=0))
        else:
            peak = np.zeros(n, np.float32)
        for i in np.flatnonzero(~np.isfinite(peak)):  # scaled by its finite values: inf and NaN stay as they are
            finite = np.abs(blocks[i][np.isfinite(blocks[i])])
            peak[i] = finite.max() if finite.size else 0.0
        scalable = peak > 0
        _, e = np.frexp(np.where(scalable, peak, 1.0))  # peak < 2^e
        k = np.where(scalable, self.TOP_EXPONENT - e, 0).astype(np.int32)
        out = np.empty((n, self.HEADER + m), np.uint16)
        out[:, :self.HEADER] = k.view(np.uint16).reshape(n, self.HEADER)
        # exact products (2^k in float64: k may pass float32's range), rounded once to float16, one pass
        scale, values = np.ldexp(1.0, k)[:, None], out[:, self.HEADER:].view(np.float16)
        self._spans(m, lambda lo, hi: np.multiply(blocks[:, lo:hi], scale, out=values[:, lo:hi], casting="unsafe"))
        return out

    def decode(self, sent: np.ndarray) -> np.ndarray:
        n, m = sent.shape[0], sent.shape[1] - self.HEADER
        k = np.ascontiguousarray(sent[:, :self.HEADER]).view(np.int32).reshape(n)
        out = np.empty((n, m), np.float32)
        scale, values = np.ldexp(1.0, -k)[:, None], sent[:, self.HEADER:].view(np.float16)
        self._spans(m, lambda lo, hi: np.multiply(values[:, lo:hi], scale, out=out[:, lo:hi], casting="unsafe"))
        return out


CODECS = {"fp32": Float32Blocks, "fp16": Float16Blocks}


# ----------------------------------------------------------------------------- hosts
def host_names(names: list[str], environ=os.environ) -> list[str]:
    """Each rank's host for the exchange: its processor name, or with CATCHAT_MPI_FAKE_HOSTS=N one of
    N pretend hosts, dealt out in blocks of consecutive ranks (a test of the by-host exchange on one
    machine)."""
    raw = environ.get(ENV_FAKE_HOSTS, "").strip()
    if not raw:
        return list(names)
    size = len(names)
    if not raw.isdigit() or not 1 <= int(raw) <= size:
        raise UsageError(f"{ENV_FAKE_HOSTS}={raw!r} is not a number of pretend hosts in [1, {size}]",
                         f"unset it, or set e.g. {ENV_FAKE_HOSTS}=2")
    hosts = int(raw)
    return [f"fake-host-{r * hosts // size}" for r in range(size)]


def host_layout(hosts: list[str]) -> tuple[list[int], list[int]]:
    """(host index, index on its host) of every rank: hosts numbered in order of their first rank,
    a host's ranks in rank order."""
    order = list(dict.fromkeys(hosts))
    index = [order.index(h) for h in hosts]
    local = [hosts[:r].count(h) for r, h in enumerate(hosts)]
    return index, local


def check_hierarchical(hosts: list[str]) -> None:
    """The by-host exchange pairs block i of every host: each host needs the same number of ranks."""
    counts = {h: hosts.count(h) for h in dict.fromkeys(hosts)}
    if len(set(counts.values())) > 1:
        shown = ", ".join(f"{h}: {n}" for h, n in counts.items())
        raise UsageError(f"distributed.hierarchical needs the same number of ranks on every host, got {shown}",
                         "start as many ranks on each host, or set distributed.hierarchical = false")


# ----------------------------------------------------------------------------- the sum
def rank_order_sum(rows, out: np.ndarray | None = None) -> np.ndarray:
    """rows[0] + rows[1] + ... added in that order, in rows' dtype: (((r0 + r1) + r2) + ...), the same
    bits on every rank whatever the MPI implementation. Into `out` (which must not overlap a row past
    the first two) or a new array; no copy of rows[0] first."""
    if len(rows) == 1:
        if out is None:
            return rows[0].copy()
        out[...] = rows[0]
        return out
    total = np.add(rows[0], rows[1], out=out)
    for r in range(2, len(rows)):
        np.add(total, rows[r], out=total)
    return total


class GradExchange:
    """The sum over ranks of float32 vectors, as the module's docstring describes: over `levels`, a
    list of one communicator (flat: the world) or two (the ranks of this host, then this block's
    ranks across the hosts). `wait(request, what)` waits for a non-blocking MPI request with the
    run's deadline (Comm._wait)."""

    def __init__(self, codec, levels: list, wait):
        self.codec, self.levels, self.wait = codec, levels, wait

    def sum(self, values: np.ndarray, what: str, out: np.ndarray | None = None) -> np.ndarray:
        """The sum over every rank of `values` (float32 [n]), the same bits on every rank: written into
        `out` (float32 [n]; it may be `values` itself: they are read before it is written) and
        returned, or without `out` a new array. The common case (one level of ranks, float32, no
        padding, `out` contiguous or none) takes `_flat_sum_into`: at v5 on 2 ranks, three copies of
        half the gradient fewer."""
        g = np.ascontiguousarray(values, np.float32).ravel()
        n = g.size
        if self._flat_fp32(n) and (out is None or out.flags.c_contiguous):
            return self._flat_sum_into(g, np.empty(n, np.float32) if out is None else out, what)
        chunks, part = [], g
        for comm in self.levels:  # reduce-scatter level by level: this rank's block of the level's sum
            chunk = -(-part.size // comm.Get_size())
            part = self._reduce_scatter(part, comm, chunk, what)
            chunks.append(chunk)
        sent = self.codec.encode(part[None])  # the total's block, encoded once by its adder
        for comm in reversed(self.levels):  # gather back: the encoded blocks travel unchanged
            sent = self._all_gather(sent, comm, what)
        blocks = self.codec.decode(sent.reshape(-1, sent.shape[-1]))  # [ranks, last level's chunk]
        sizes = [comm.Get_size() for comm in self.levels]
        for level in range(len(self.levels) - 1, 0, -1):  # drop each level's padding, innermost first
            blocks = blocks.reshape(-1, sizes[level] * chunks[level])[:, :chunks[level - 1]]
        total = np.ascontiguousarray(blocks).ravel()[:n]
        if out is None:
            return total
        out[...] = total
        return out

    def _flat_fp32(self, n: int) -> bool:
        """Whether a sum of n floats takes the flat float32 path: one level of several ranks, float32,
        blocks that need no padding."""
        if len(self.levels) != 1 or not isinstance(self.codec, Float32Blocks):
            return False
        size = self.levels[0].Get_size()
        return size > 1 and n % size == 0

    def _flat_sum_into(self, g: np.ndarray, out: np.ndarray, what: str) -> np.ndarray:
        """The flat float32 sum (`_flat_fp32`) with no copy the sum does not need: the reduce-scatter
        moves only the other ranks' blocks (an Alltoallv with nothing to and from itself: this rank's
        own block is added where it lies), the sum of this rank's block is written into its place in
        `out`, and the all-gather fills the rest of `out` around it (in place). The additions and their
        order are the general path's: the same bits. `out` may be `g` (read before it is written)."""
        from mpi4py import MPI  # only where ranks exchange, as in catchat/distributed.py

        comm = self.levels[0]
        size, me = comm.Get_size(), comm.Get_rank()
        chunk = g.size // size
        send, blocks = g.reshape(size, chunk), out.reshape(size, chunk)
        recv = np.empty((size, chunk), np.float32)  # this rank's row stays untouched (never paged in)
        counts, displs = [chunk] * size, [r * chunk for r in range(size)]
        counts[me] = 0
        self.wait(comm.Ialltoallv([send, (counts, displs), MPI.FLOAT], [recv, (counts, displs), MPI.FLOAT]),
                  what, spin=True)
        rows = [send[r] if r == me else recv[r] for r in range(size)]
        if np.may_share_memory(out, g) and me >= 2:  # the sum would overwrite its own row before adding it
            blocks[me] = rank_order_sum(rows)
        else:  # np.add reads each element before writing it: out may be row 0 or 1 itself
            rank_order_sum(rows, out=blocks[me])
        self.wait(comm.Iallgather(MPI.IN_PLACE, [blocks, MPI.FLOAT]), what, spin=True)
        return out

    def _reduce_scatter(self, part: np.ndarray, comm, chunk: int, what: str) -> np.ndarray:
        """This rank's block (float32 [chunk]) of the sum over `comm` of every rank's `part`, split in
        comm.size blocks of `chunk` (the last padded with zeros); added in the comm's rank order."""
        size = comm.Get_size()
        padded = part if part.size == size * chunk else np.concatenate(
            (part, np.zeros(size * chunk - part.size, np.float32)))  # a copy only where the blocks need padding
        if size == 1:  # nothing travels: the part is the sum
            return padded
        send = self.codec.encode(padded.reshape(size, chunk))
        recv = np.empty_like(send)
        self.wait(comm.Ialltoall(send, recv), what, spin=True)
        return rank_order_sum(self.codec.decode(recv))  # float32, in the comm's rank order

    def _all_gather(self, mine: np.ndarray, comm, what: str) -> np.ndarray:
        """Every rank's `mine` (the same shape on each), stacked in the comm's rank order."""
        if comm.Get_size() == 1:
            return mine[None]
        out = np.empty((comm.Get_size(), *mine.shape), mine.dtype)
        self.wait(comm.Iallgather(np.ascontiguousarray(mine), out), what, spin=True)
        return out
