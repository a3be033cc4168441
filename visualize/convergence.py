"""How Jacobi iterations converge: the marks CLLMs name, and per-block figures (no torch).

Marks, per cell of an iteration (a row of ``iterations.Row``), against the final output:

* ``ff`` **fast-forwarded**: newly right in this iteration (it was not right in the block's previous
  iteration, or this is the block's first), together with a neighbour that is newly right too:
  several consecutive tokens came right in one iteration;
* ``stay`` **stationary**: right, and right in the block's previous iteration too (kept), while an
  earlier position of this iteration is still wrong.

Both only look at the drawn cells, their neighbours and the row's prefix up to them, so a view pays
for what it draws. ``block_figures`` counts the iterations and committed tokens of every block.
"""

from __future__ import annotations

from typing import Any, Optional

MARKS = {   # mark: (legend text, CSS for the cell)
    "ff": ("fast-forwarded: several consecutive tokens newly right in one iteration",
           "font-weight:bold;border-bottom:3px solid #1a56db"),
    "stay": ("stationary: right and kept while an earlier position is still wrong",
             "border-bottom:3px dotted #7a3fb0"),
}


def _right(row: Any, pos: int, final: list) -> bool:
    i = pos - row.start
    return 0 <= i < len(row.tokens) and pos < len(final) and row.tokens[i] == final[pos]


def _newly(row: Any, pos: int, final: list) -> bool:
    prev = row.prev
    return _right(row, pos, final) and not (prev is not None and _right(prev, pos, final))


def first_wrong(row: Any, final: list, upto: int) -> Optional[int]:
    """The first output position of ``row`` before ``upto`` whose guess is not the final token."""
    for pos in range(row.start, min(row.end, upto, len(final))):
        if row.tokens[pos - row.start] != final[pos]:
            return pos
    return None


def mark(row: Any, pos: int, final: list, wrong_before: Optional[int]) -> str:
    """``ff``, ``stay`` or '' for the cell of ``row`` at output position ``pos``.

    ``wrong_before``: ``first_wrong(row, final, pos)`` or any earlier answer of it for this row.
    """
    if not _right(row, pos, final):
        return ""
    if _newly(row, pos, final):
        return "ff" if _newly(row, pos - 1, final) or _newly(row, pos + 1, final) else ""
    return "stay" if wrong_before is not None and wrong_before < pos else ""


def block_figures(rows: list, limit: int = 64) -> list[tuple[str, int, int]]:
    """``(block, iterations, tokens committed)`` for the first ``limit`` blocks, in order."""
    out: dict[int, list] = {}
    for row in rows:
        if row.block not in out:
            if len(out) >= limit:
                continue
            out[row.block] = [row.block, 0, 0]
        out[row.block][1] += 1
        out[row.block][2] += max(0, row.committed)
    return [tuple(v) for v in out.values()]


def figures_line(rows: list, limit: int = 16) -> str:
    """One line (not escaped): iterations and tokens per forward of each block, the first ``limit``."""
    figures = block_figures(rows, limit + 1)
    if not figures:
        return ""
    parts = [f"{its} it → {tok / its:.1f} tok/fwd" for _, its, tok in figures[:limit]]
    more = " …" if len(figures) > limit else ""
    total_its = sum(f[1] for f in figures[:limit])
    total_tok = sum(f[2] for f in figures[:limit])
    return (f"Per block (iterations → tokens per forward): {' · '.join(parts)}{more}; "
            f"mean {total_its / len(figures[:limit]):.1f} iterations, {total_tok / max(total_its, 1):.2f} tokens "
            f"per forward")
