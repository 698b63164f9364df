"""The vector leg's pre-filter: every chunk's sign bits in memory, scanned by Hamming distance.

``chunks_vec`` (sqlite-vec) stays the store of record; this is a derived copy, rebuilt from it.
sqlite-vec's own KNN costs ~0.11 ms per unit of ``k`` at 100k rows, so it cannot hand the
exact re-rank a pool wide enough for recall (a pool of 100 gave recall@10 0.67 at 100k,
bench/README.md). A numpy XOR + popcount over one user's packed sign bits costs about the
same as that k = 100 KNN and returns the best few thousand by Hamming distance; the caller
re-ranks them by exact int8 cosine in SQL (``memory.search``).

**What is held** (one :class:`SignIndex` per open index, state of the service's
:class:`~memory.sqlite.live.LiveIndex`; one partition per user, loaded by :meth:`SignIndex.warm`
when the service starts, or else on the user's first vector search): per chunk its id (8 bytes),
sign bits (``dims / 8``, 48 at 384 dims), ``start_ms``/``end_ms`` (16) and a live flag (1): 73 bytes
a chunk at 384 dims, plus up to :data:`GROWTH` slack — 7.3 MB per 100k chunks. Session filters are
not held: they become chunk-id sets from ``chunks`` (its ``(user, session_key)`` index) at query
time.

**Loading** reads sqlite-vec's shadow tables directly (1,024 vectors a row, ~10 ms per 100k
chunks) when ``chunks_vec_info`` names a layout this module knows (:data:`KNOWN_LAYOUTS`)
and every blob has the size that layout implies; otherwise it falls back to the public
``SELECT … FROM chunks_vec`` scan (~100× slower, still correct).

**Freshness**: the writer (``memory.sqlite.index.vectors``) appends the chunk id of every vector it
stores or removes to ``vector_changes`` in the same transaction, and keeps
``meta.vector_generation`` (new whenever ``chunks_vec`` is created or dropped) and
``meta.vector_changes_floor`` (the highest change it trimmed). Each search reads those in its own
read transaction and brings the user's partition up to that snapshot before scanning: the changed
ids are dropped and re-read from ``chunks_vec`` through its public interface. A new generation, a
trimmed-away change or a large delta reloads the partition. A snapshot older than the partition
(another reader ran ahead) uses it as is: an extra candidate is then dropped by the re-rank's join,
a removed one is missed by a search that overlapped its removal. Nothing here outlives the process;
a restart reloads (``warm``, or lazily).

Every method blocks; call it from the search's worker thread. :meth:`SignIndex.prepare`
splits a search in two so that the scan (numpy, which releases the GIL) can run on another
thread while the search's keyword leg runs its SQL.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import apsw

if TYPE_CHECKING:
    import numpy.typing as npt

try:
    import numpy

    HAVE_NUMPY = hasattr(numpy, "bitwise_count")  # numpy >= 2.0
except ImportError:  # numpy is an optional dependency (the ``local`` extra)
    HAVE_NUMPY = False

__all__ = [
    "CHANGES_TABLE",
    "HAVE_NUMPY",
    "KNOWN_LAYOUTS",
    "Filters",
    "PreparedScan",
    "SignIndex",
    "detached_partition",
]

# Written by memory.sqlite.index.vectors, read here; its own table so that dropping chunks_vec (a
# vec0 virtual table and its shadow tables) never touches it.
CHANGES_TABLE = "vector_changes"

# sqlite-vec versions whose vec0 shadow-table layout _load_shadow reads: chunks of rows with a
# validity bitmap and an int64 rowid array, one vector blob per chunk, one 8-byte slot per row
# for integer metadata columns. Introduced with metadata columns in v0.1.6.
KNOWN_LAYOUTS = frozenset({"v0.1.6", "v0.1.7", "v0.1.8", "v0.1.9"})

# Partition arrays grow by this factor, so appending a batch costs amortised O(batch).
GROWTH = 1.25
# A delta touching more ids than this (or a quarter of the partition) reloads it instead.
MAX_DELTA = 4096

# Metadata columns of chunks_vec in declaration order
# (memory.sqlite.index.vectors.ensure_vector_table): session_key is 00, start_ms 01, end_ms 02.
_START_COLUMN, _END_COLUMN = 1, 2


@dataclass(frozen=True, slots=True)
class Filters:
    """What a search lets through, as the partition can test it."""

    after_ms: int | None = None
    before_ms: int | None = None
    only_ids: Sequence[int] | None = None     # session_key: that session's chunk ids
    except_ids: Sequence[int] | None = None   # exclude_session_key: that session's chunk ids


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """The writer's change-tracking state as one read transaction sees it."""

    generation: str | None
    floor: int
    head: int


def _snapshot(db: apsw.Connection) -> _Snapshot:
    meta = dict(db.execute(
        "SELECT key, value FROM meta WHERE key IN ('vector_generation', 'vector_changes_floor')"))
    has_log = db.execute("SELECT 1 FROM sqlite_schema WHERE name = ?", (CHANGES_TABLE,)).fetchone()
    if has_log is None or meta.get("vector_generation") is None:
        return _Snapshot(None, 0, 0)
    (head,) = db.execute(f"SELECT coalesce(max(seq), 0) FROM {CHANGES_TABLE}").fetchone() or (0,)
    return _Snapshot(str(meta["vector_generation"]), int(meta.get("vector_changes_floor") or 0),
                     int(head))


class _Partition:
    """One user's chunks: parallel arrays, the first ``size`` slots used, dead slots flagged."""

    def __init__(self, width: int, ids: npt.NDArray[Any], bits: npt.NDArray[Any],
                 start_ms: npt.NDArray[Any], end_ms: npt.NDArray[Any], snapshot: _Snapshot) -> None:
        self.width = width  # bytes of sign bits per chunk
        self.ids = ids
        # Column-major 64-bit words, (words, chunks): each XOR + popcount runs over one
        # contiguous row, ~6× faster than per-chunk rows at 384 dims.
        self.bits = _words(bits)
        self.start_ms = start_ms
        self.end_ms = end_ms
        self.live = numpy.ones(len(ids), dtype=bool)
        self.size = len(ids)
        self.dead = 0
        self.generation = snapshot.generation
        self.seq = snapshot.head

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.ids, self.bits, self.start_ms, self.end_ms, self.live))

    def remove(self, ids: npt.NDArray[Any]) -> None:
        if not len(ids) or not self.size:
            return
        hit = numpy.isin(self.ids[:self.size], ids) & self.live[:self.size]
        self.dead += int(hit.sum())
        self.live[:self.size] &= ~hit

    def append(self, ids: npt.NDArray[Any], bits: npt.NDArray[Any],
               start_ms: npt.NDArray[Any], end_ms: npt.NDArray[Any]) -> None:
        n = len(ids)
        if not n:
            return
        if self.size + n > len(self.ids):
            self._resize(max(int((self.size + n) * GROWTH), 1024))
        end = self.size + n
        self.ids[self.size:end] = ids
        self.bits[:, self.size:end] = _words(bits)
        self.start_ms[self.size:end] = start_ms
        self.end_ms[self.size:end] = end_ms
        self.live[self.size:end] = True
        self.size = end

    def compact(self) -> None:
        """Drop dead slots once they are a quarter of the partition (bounds the memory)."""
        if self.dead * 4 <= self.size:
            return
        keep = self.live[:self.size]
        self.ids, self.bits = (self.ids[:self.size][keep],
                               numpy.ascontiguousarray(self.bits[:, :self.size][:, keep]))
        self.start_ms, self.end_ms = self.start_ms[:self.size][keep], self.end_ms[:self.size][keep]
        self.size = len(self.ids)
        self.live = numpy.ones(self.size, dtype=bool)
        self.dead = 0

    def _resize(self, capacity: int) -> None:
        def grown(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
            out = numpy.empty((capacity, *a.shape[1:]), dtype=a.dtype)
            out[:self.size] = a[:self.size]
            return out

        bits = numpy.empty((self.bits.shape[0], capacity), dtype=numpy.uint64)
        bits[:, :self.size] = self.bits[:, :self.size]
        self.ids, self.bits = grown(self.ids), bits
        self.start_ms, self.end_ms, self.live = (grown(self.start_ms), grown(self.end_ms),
                                                 grown(self.live))

    def nearest(self, query: npt.NDArray[Any], scan: int, pool: int, filters: Filters,
                scan_share: float = 0.0) -> list[int]:
        """Up to ``pool`` chunk ids near ``query`` (int8), filtered, in no particular order.

        Two steps over the sign bits: the ``scan`` nearest by Hamming distance to the query's
        signs (XOR + popcount over every row), then the ``pool`` best of those by the dot
        product of the query itself with their ±1 signs — the query keeps its magnitudes, so
        this orders the scan far better than Hamming distance does, for ~1 ms per 1,000.
        The scan is at least ``scan_share`` of the rows the filters leave: a fixed count is a
        shrinking share of a growing partition, and Hamming distance alone is too coarse to
        put the true neighbours inside a thin share.
        """
        n = self.size
        mask = self.live[:n].copy()
        if filters.after_ms is not None:
            mask &= self.end_ms[:n] >= filters.after_ms
        if filters.before_ms is not None:
            mask &= self.start_ms[:n] < filters.before_ms
        ids = self.ids[:n]
        if filters.only_ids is not None:
            only = numpy.asarray(filters.only_ids, dtype=numpy.int64)
            mask &= numpy.isin(ids, only) if len(only) else False
        if filters.except_ids:
            mask &= ~numpy.isin(ids, numpy.asarray(filters.except_ids, dtype=numpy.int64))
        rows = numpy.flatnonzero(mask)
        scan = max(scan, pool, int(len(rows) * scan_share))
        if len(rows) <= pool:
            return [int(i) for i in ids[rows]]
        words = self.bits[:, :n] if len(rows) == n else self.bits[:, rows]
        if len(rows) > scan:
            query_words = _words(numpy.packbits(query > 0, bitorder="little").reshape(1, -1))[:, 0]
            distance = numpy.bitwise_count(words[0] ^ query_words[0]).astype(numpy.uint16)
            for w in range(1, len(query_words)):
                distance += numpy.bitwise_count(words[w] ^ query_words[w])
            # Distances are small integers: the cut-off from a histogram, far cheaper than
            # argpartition; ties at the cut-off are taken in slot order.
            counts = numpy.cumsum(numpy.bincount(distance))
            cutoff = int(numpy.searchsorted(counts, scan))
            best = numpy.flatnonzero(distance < cutoff)
            tied = numpy.flatnonzero(distance == cutoff)[:scan - len(best)]
            near = numpy.concatenate([best, tied])
            rows, words = rows[near], words[:, near]
        signs = numpy.unpackbits(numpy.ascontiguousarray(words.T).view(numpy.uint8), axis=1,
                                 bitorder="little")[:, :len(query)]
        # sum(q·s) over s = ±1 is 2·(bits · q) − sum(q): the same order as bits · q.
        score = signs @ query.astype(numpy.float32)
        top = numpy.argpartition(-score, pool - 1)[:pool]
        return [int(i) for i in ids[rows[top]]]


def detached_partition(ids: npt.NDArray[Any], bits: npt.NDArray[Any], start_ms: npt.NDArray[Any],
                       end_ms: npt.NDArray[Any]) -> _Partition:
    """A partition of sign bits that come from elsewhere than ``chunks_vec`` (no change log
    keeps it fresh): :mod:`memory.sqlite.interim` scans a previous embedder's vectors with it."""
    return _Partition(bits.shape[1], ids, bits, start_ms, end_ms, _Snapshot(None, 0, 0))


def _words(bits: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``(chunks, bytes)`` uint8 sign bits as ``(words, chunks)`` uint64, zero-padded (padding
    bits are equal in every vector and the query, so Hamming distances are unchanged)."""
    n, width = bits.shape
    if width % 8 == 0:  # 384 dims: 48 bytes, six words already; no padded copy
        return numpy.ascontiguousarray(numpy.ascontiguousarray(bits).view(numpy.uint64).T)
    padded = numpy.zeros((n, -(-width // 8) * 8), dtype=numpy.uint8)
    padded[:, :width] = bits
    return numpy.ascontiguousarray(padded.view(numpy.uint64).T)


def _empty(width: int, snapshot: _Snapshot) -> _Partition:
    return _Partition(width, numpy.empty(0, numpy.int64), numpy.empty((0, width), numpy.uint8),
                      numpy.empty(0, numpy.int64), numpy.empty(0, numpy.int64), snapshot)


def _layout(db: apsw.Connection) -> str | None:
    try:
        row = db.execute("SELECT value FROM chunks_vec_info "
                         "WHERE key = 'CREATE_VERSION'").fetchone()
    except apsw.SQLError:
        return None
    return str(row[0]) if row is not None else None


# (ids, sign bits as (chunks, bytes) uint8, start_ms, end_ms) of some chunks.
_Arrays = tuple["npt.NDArray[Any]", "npt.NDArray[Any]", "npt.NDArray[Any]", "npt.NDArray[Any]"]


def _load_shadow(db: apsw.Connection, user: str, width: int) -> _Arrays | None:
    """``(ids, bits, start_ms, end_ms)`` of ``user`` from vec0's shadow tables, or None when
    any blob is not the size the known layout implies."""
    if _layout(db) not in KNOWN_LAYOUTS:
        return None
    parts: list[_Arrays] = []
    rows = db.execute(
        f"""
        SELECT c.size, c.validity, c.rowids, v.vectors, s.data, e.data
        FROM chunks_vec_chunks AS c
        CROSS JOIN chunks_vec_vector_chunks00 AS v ON v.rowid = c.chunk_id
        CROSS JOIN chunks_vec_metadatachunks0{_START_COLUMN} AS s ON s.rowid = c.chunk_id
        CROSS JOIN chunks_vec_metadatachunks0{_END_COLUMN} AS e ON e.rowid = c.chunk_id
        WHERE c.partition00 = ?
        ORDER BY c.chunk_id
        """,
        (user,),
    )
    for size, validity, rowids, vectors, starts, ends in rows:
        size = int(size)
        if (size % 8 or len(validity) != size // 8 or len(rowids) != 8 * size
                or len(vectors) != width * size or len(starts) != 8 * size
                or len(ends) != 8 * size):
            return None
        arrays = (numpy.frombuffer(rowids, "<i8"),
                  numpy.frombuffer(vectors, numpy.uint8).reshape(size, width),
                  numpy.frombuffer(starts, "<i8"), numpy.frombuffer(ends, "<i8"))
        if validity.count(0xFF) == len(validity):  # a full chunk (most of them): no mask to apply
            parts.append(arrays)
            continue
        live = numpy.unpackbits(numpy.frombuffer(validity, numpy.uint8),
                                bitorder="little").astype(bool)
        parts.append((arrays[0][live], arrays[1][live], arrays[2][live], arrays[3][live]))
    if not parts:
        return (numpy.empty(0, numpy.int64), numpy.empty((0, width), numpy.uint8),
                numpy.empty(0, numpy.int64), numpy.empty(0, numpy.int64))
    return (numpy.concatenate([p[0] for p in parts]).astype(numpy.int64),
            numpy.concatenate([p[1] for p in parts]),
            numpy.concatenate([p[2] for p in parts]).astype(numpy.int64),
            numpy.concatenate([p[3] for p in parts]).astype(numpy.int64))


def _rows_public(rows: Iterable[tuple[Any, ...]], width: int) -> _Arrays:
    ids: list[int] = []
    blobs: list[bytes] = []
    starts: list[int] = []
    ends: list[int] = []
    for cid, blob, start, end in rows:
        ids.append(int(cid))
        blobs.append(bytes(blob))
        starts.append(int(start))
        ends.append(int(end))
    bits = numpy.frombuffer(b"".join(blobs), numpy.uint8).reshape(len(ids), width).copy()
    return (numpy.array(ids, numpy.int64), bits, numpy.array(starts, numpy.int64),
            numpy.array(ends, numpy.int64))


def _load_public(db: apsw.Connection, user: str, width: int) -> _Arrays:
    return _rows_public(db.execute(
        "SELECT chunk_id, embedding, start_ms, end_ms FROM chunks_vec WHERE user = ?",
        (user,)), width)


@dataclass(frozen=True, slots=True)
class PreparedScan:
    """One search's scan of a partition, ready to run (:meth:`SignIndex.prepare`)."""

    lock: threading.Lock
    part: _Partition
    query: npt.NDArray[Any]
    filters: Filters
    scan: int
    pool: int
    scan_share: float

    @property
    def rows(self) -> int:
        """Rows in the partition: what the scan's cost grows with."""
        return self.part.size

    def run(self) -> list[int]:
        # Under the index's lock: another search may bring the partition to a newer snapshot
        # in between, which this one tolerates as it always has (the re-rank reads rows from
        # its own snapshot, and a newer partition is what an older snapshot is served).
        with self.lock:
            return self.part.nearest(self.query, self.scan, self.pool, self.filters,
                                     self.scan_share)


class SignIndex:
    """The sign bits of one database's ``chunks_vec``, one partition per user (see module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[str, _Partition] = {}

    @property
    def nbytes(self) -> int:
        """Memory held by the arrays (what the module docstring's figure counts)."""
        with self._lock:
            return sum(p.nbytes for p in self._parts.values())

    def nearest(self, db: apsw.Connection, user: str, query_int8: bytes, filters: Filters, *,
                scan: int, pool: int, scan_share: float = 0.0) -> list[int]:
        """``user``'s ``pool`` chunk ids nearest ``query_int8`` (see :meth:`_Partition.nearest`)
        as ``db``'s open read transaction sees them (call inside it), filtered."""
        return self.prepare(db, user, query_int8, filters, scan=scan, pool=pool,
                            scan_share=scan_share).run()

    def prepare(self, db: apsw.Connection, user: str, query_int8: bytes, filters: Filters, *,
                scan: int, pool: int, scan_share: float = 0.0) -> PreparedScan:
        """:meth:`nearest` in two steps: the partition is brought up to ``db``'s snapshot now,
        on the caller's thread (which holds the read transaction), and the scan the returned
        object runs touches no connection — so it may run on another thread while the caller's
        keyword leg uses ``db`` (the search overlaps the two legs on a large partition)."""
        query = numpy.frombuffer(query_int8, dtype=numpy.int8)
        if len(query) % 8:
            raise ValueError(f"sign bits need a multiple of 8 dimensions, not {len(query)}")
        width = len(query) // 8
        snapshot = _snapshot(db)
        with self._lock:
            part = self._current(db, user, width, snapshot)
            if snapshot.generation is not None:
                self._parts[user] = part
        return PreparedScan(self._lock, part, query, filters, scan, pool, scan_share)

    def warm(self, db: apsw.Connection) -> tuple[int, int]:
        """Load every user's partition as ``db`` sees it now (its own read transaction);
        returns (users, chunks). The service runs this once at start, before its catch-up sync
        and integrity check, so the first search finds its partition loaded (or waits on the
        lock for a load that no other start work slows down) instead of loading it itself."""
        with db:
            if db.execute("SELECT 1 FROM sqlite_schema "
                          "WHERE name = 'chunks_vec'").fetchone() is None:
                return 0, 0
            meta = dict(db.execute("SELECT key, value FROM meta "
                                   "WHERE key IN ('vector_dims', 'vector_format')"))
            if meta.get("vector_format") != "bit" or not meta.get("vector_dims"):
                return 0, 0  # an int8 chunks_vec is searched by sqlite-vec's KNN, not from here
            width = int(meta["vector_dims"]) // 8
            snapshot = _snapshot(db)
            if snapshot.generation is None:
                return 0, 0
            users = distinct_users(db)
            chunks = 0
            for user in users:
                with self._lock:
                    part = self._parts[user] = self._current(db, user, width, snapshot)
                    chunks += part.size - part.dead
        return len(users), chunks

    def _current(self, db: apsw.Connection, user: str, width: int,
                 snapshot: _Snapshot) -> _Partition:
        part = self._parts.get(user)
        if (part is None or snapshot.generation is None or part.generation != snapshot.generation
                or part.width != width or part.seq < snapshot.floor):
            return self._load(db, user, width, snapshot)
        if snapshot.head <= part.seq:
            return part  # up to date, or this snapshot is older than the partition
        changed = [int(cid) for (cid,) in db.execute(
            f"SELECT DISTINCT chunk_id FROM {CHANGES_TABLE} WHERE seq > ? AND seq <= ?",
            (part.seq, snapshot.head))]
        if len(changed) > MAX_DELTA or 4 * len(changed) > part.size:
            return self._load(db, user, width, snapshot)
        part.remove(numpy.array(changed, dtype=numpy.int64))
        current = [row for cid in changed for row in db.execute(
            "SELECT chunk_id, embedding, start_ms, end_ms FROM chunks_vec WHERE chunk_id = ? "
            "AND user = ?",
            (cid, user))]
        part.append(*_rows_public(current, width))
        part.compact()
        part.seq = snapshot.head
        return part

    def _load(self, db: apsw.Connection, user: str, width: int, snapshot: _Snapshot) -> _Partition:
        if db.execute("SELECT 1 FROM sqlite_schema WHERE name = 'chunks_vec'").fetchone() is None:
            return _empty(width, snapshot)
        arrays = _load_shadow(db, user, width) or _load_public(db, user, width)
        return _Partition(width, *arrays, snapshot)


def distinct_users(db: apsw.Connection) -> list[str]:
    """The users who own chunks, by skipping along the (user, session_key) index: one lookup
    per user, not a scan of every chunk."""
    return [str(u) for (u,) in db.execute(
        "WITH RECURSIVE u(name) AS (SELECT min(user) FROM chunks UNION ALL "
        "SELECT (SELECT min(user) FROM chunks WHERE user > u.name) FROM u "
        "WHERE u.name IS NOT NULL) SELECT name FROM u WHERE name IS NOT NULL")]
