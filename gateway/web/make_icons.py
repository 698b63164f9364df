"""Draw the web app's PNG icons (a speech bubble on the accent colour) with no image library.

Run at development time, ``python -m gateway.web.make_icons``; the outputs are committed in
``static/icons/`` beside ``icon.svg``, which draws the same shapes. Shapes are sampled 4×4 per
pixel for smooth edges and written as an RGBA PNG with zlib.
"""

from __future__ import annotations

import struct
import sys
import zlib
from pathlib import Path

__all__ = ["draw_icon", "png_bytes"]

ACCENT = (47, 93, 138)
WHITE = (255, 255, 255)
_SAMPLES = 4


def _in_rounded_square(x: float, y: float, radius: float = 0.18) -> bool:
    dx = max(radius - x, 0.0, x - (1 - radius))
    dy = max(radius - y, 0.0, y - (1 - radius))
    return dx * dx + dy * dy <= radius * radius


def _in_bubble(x: float, y: float) -> bool:
    ex, ey = (x - 0.5) / 0.30, (y - 0.46) / 0.23
    if ex * ex + ey * ey <= 1.0:
        return True
    # The tail: a triangle below the bubble's lower left.
    ax, ay, bx, by, cx, cy = 0.32, 0.58, 0.46, 0.66, 0.27, 0.80
    d1 = (x - bx) * (ay - by) - (ax - bx) * (y - by)
    d2 = (x - cx) * (by - cy) - (bx - cx) * (y - cy)
    d3 = (x - ax) * (cy - ay) - (cx - ax) * (y - ay)
    return (d1 < 0 and d2 < 0 and d3 < 0) or (d1 > 0 and d2 > 0 and d3 > 0)


def _in_dot(x: float, y: float) -> bool:
    return any((x - cx) ** 2 + (y - 0.46) ** 2 <= 0.04**2 for cx in (0.38, 0.5, 0.62))


def _colour(x: float, y: float) -> tuple[int, int, int, int]:
    if not _in_rounded_square(x, y):
        return (0, 0, 0, 0)
    if _in_bubble(x, y) and not _in_dot(x, y):
        return (*WHITE, 255)
    return (*ACCENT, 255)


def draw_icon(size: int) -> list[bytes]:
    """Rows of RGBA pixels of the icon at ``size``×``size``."""
    rows: list[bytes] = []
    n = _SAMPLES * _SAMPLES
    for py in range(size):
        row = bytearray()
        for px in range(size):
            acc = [0, 0, 0, 0]
            for sy in range(_SAMPLES):
                for sx in range(_SAMPLES):
                    c = _colour((px + (sx + 0.5) / _SAMPLES) / size,
                                (py + (sy + 0.5) / _SAMPLES) / size)
                    for i in range(4):
                        acc[i] += c[i] * (c[3] if i < 3 else 255)
            alpha = acc[3] // 255
            row += bytes((acc[0] // alpha if alpha else 0, acc[1] // alpha if alpha else 0,
                          acc[2] // alpha if alpha else 0, alpha // n))
        rows.append(bytes(row))
    return rows


def png_bytes(rows: list[bytes]) -> bytes:
    height, width = len(rows), len(rows[0]) // 4

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    raw = b"".join(b"\x00" + row for row in rows)  # filter type 0 on every row
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b""))


def main() -> int:
    out = Path(__file__).parent / "static" / "icons"
    out.mkdir(parents=True, exist_ok=True)
    for size in (192, 512):
        path = out / f"icon-{size}.png"
        path.write_bytes(png_bytes(draw_icon(size)))
        print(path, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
