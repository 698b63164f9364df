"""How vectors are stored: float32 blobs for sqlite-vec, int8 with a per-vector scale for the cache.

Pure functions of their arguments, with no database: the migrations (``m002`` converts old
cache rows) and the vector store (:mod:`memory.sqlite.index.vectors`) both use them, and neither
depends on the other for it.
"""

from __future__ import annotations

import array
import sys
from collections.abc import Sequence

try:
    import numpy

    _HAVE_NUMPY = True
except ImportError:  # numpy is an optional dependency (the ``local`` extra)
    _HAVE_NUMPY = False

__all__ = ["cached_vector_to_int8", "quantize_int8", "vector_from_blob", "vector_to_blob"]


def vector_to_blob(vector: Sequence[float]) -> bytes:
    """float32 little-endian, the layout sqlite-vec reads."""
    arr = array.array("f", vector)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def quantize_int8(vector: Sequence[float]) -> bytes:
    """int8 with a per-vector scale (largest magnitude → 127): what the cache stores.

    Cosine distance ignores a vector's scale, so ``vec_distance_cosine(vec_int8(a),
    vec_int8(b))`` is the float cosine up to rounding (≤ ~0.4% of an element), and the signs —
    all ``bit`` storage keeps — are unchanged. 1 byte per dimension instead of 4.
    """
    if _HAVE_NUMPY:
        # The same float64 arithmetic and round-half-to-even as below, ~30× faster: at index
        # time this ran once per chunk and was a sixth of the vector phase (bench/README.md).
        arr = numpy.asarray(vector, dtype=numpy.float64)
        peak_np = float(numpy.abs(arr).max()) if arr.size else 0.0
        if not numpy.isfinite(peak_np):
            raise ValueError("cannot quantize a vector holding NaN or infinity")  # as round() does
        scale_np = 127.0 / peak_np if peak_np > 0 else 0.0
        return bytes(numpy.rint(arr * scale_np).astype(numpy.int8).tobytes())
    peak = max((abs(x) for x in vector), default=0.0)
    scale = 127.0 / peak if peak > 0 else 0.0
    return array.array("b", [round(x * scale) for x in vector]).tobytes()


def cached_vector_to_int8(blob: bytes, dims: int) -> bytes:
    """A cache blob as int8: rows written before ``m002`` hold float32 (4 bytes a dimension)."""
    if len(blob) == 4 * dims and dims > 0:
        return quantize_int8(vector_from_blob(blob))
    return blob


def vector_from_blob(blob: bytes) -> list[float]:
    arr = array.array("f")
    arr.frombytes(blob)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tolist()
