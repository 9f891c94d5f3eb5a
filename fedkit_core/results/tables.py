"""Tables of results as text: ``{runspec: {column: {mean, std}}}`` as markdown or LaTeX
cells of ``mean ± std``, and rows of equal keys as markdown (``fedkit compare``'s
``compare.md`` and ``compare.tex``, the figures' notes, plugins' own tables)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def rows_markdown(rows: Sequence[Mapping[str, str]]) -> str:
    """Rows of equal keys as a markdown table."""
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    lines += ["| " + " | ".join(r[h] for h in head) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def markdown_table(
    table: Mapping[str, Mapping[str, Mapping[str, Any]]],
    columns: Sequence[str],
    scale: float = 1.0,
    digits: int = 4,
    headers: Sequence[str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> str:
    """``{runspec: {column: {mean, std}}}`` as a markdown table of ``mean ± std`` cells
    (values times ``scale``: 100 for percent), headed by ``headers`` (default: the columns),
    runspecs named by ``labels`` (e.g. :func:`reference_labels`)."""
    head = headers or columns
    labels = labels or {}
    lines = ["| runspec | " + " | ".join(head) + " |", "|---" * (len(columns) + 1) + "|"]
    for spec, row in table.items():
        cells = [_cell(row.get(c), scale, digits, " ± ") for c in columns]
        lines.append(f"| {labels.get(spec, spec)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(entry: Mapping[str, Any] | None, scale: float, digits: int, pm: str) -> str:
    """``mean ± std`` (``-`` for a number the runspec does not have)."""
    if entry is None:
        return "-"
    return f"{scale * entry['mean']:.{digits}f}{pm}{scale * entry['std']:.{digits}f}"


_TEX = {c: "\\" + c for c in "&%$#_{}"} | {
    "~": r"\textasciitilde{}",
    "^": r"\^{}",
    "\\": r"\textbackslash{}",
}


def _tex(text: str) -> str:
    return "".join(_TEX.get(c, c) for c in text).replace("±", r"$\pm$")


def latex_table(
    table: Mapping[str, Mapping[str, Mapping[str, Any]]],
    columns: Sequence[str],
    headers: Sequence[str],
    caption: str,
    digits: int = 4,
    labels: Mapping[str, str] | None = None,
) -> str:
    """The :func:`markdown_table` as a booktabs ``table`` (``\\usepackage{booktabs}``)."""
    labels = labels or {}
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{_tex(caption)}}}",
        r"\begin{tabular}{l" + "r" * len(columns) + "}",
        r"\toprule",
        "runspec & " + " & ".join(map(_tex, headers)) + r" \\",
        r"\midrule",
    ]
    for spec, row in table.items():
        cells = [
            "--" if c not in row else "$" + _cell(row[c], 1.0, digits, r" \pm ") + "$"
            for c in columns
        ]
        lines.append(f"{_tex(labels.get(spec, spec))} & " + " & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"
