"""The one plotting layer: a paper style and how every figure of dpdl is saved.

A figure a paper can take: vector output (PDF and SVG) beside a PNG of at least 200 dpi,
compared settings on shared axes, spread over seeds as bands that never cross a physical
bound (an accuracy stays in [0, 1], a loss above 0), log scales where the values span
orders of magnitude, the legend outside the data.  Figure code draws inside
:func:`paper_style` and saves with :func:`save_figure`; the labels it writes come from the
registries (the callers'; this module knows no algorithm).

matplotlib only (no torch): every layer may draw.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from dpdl.errors import DPDLError

__all__ = ["FORMATS", "PNG_DPI", "band", "legend_outside", "paper_style", "pyplot",
           "save_figure", "spans_decades", "styled"]  # fmt: skip

PNG_DPI = 200
FORMATS = ("png", "pdf", "svg")
# Okabe-Ito: distinguishable with the common colour-vision deficiencies and in greyscale
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
           "#F0E442")  # fmt: skip
STYLE = {
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
    "grid.linewidth": 0.6,
    "lines.linewidth": 1.6,
    "lines.markersize": 4,
    "legend.frameon": False,
    "figure.dpi": 100,
    "savefig.dpi": PNG_DPI,
    "pdf.fonttype": 42,  # TrueType in the PDF: text stays text (editable, searchable)
    "svg.fonttype": "none",
    "svg.hashsalt": "dpdl",  # the same figure, the same SVG ids
}


def pyplot():
    """matplotlib.pyplot on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextlib.contextmanager
def paper_style() -> Iterator[None]:
    """The style in force while a figure is drawn (only there: a user's own plots are left
    as they were)."""
    from cycler import cycler

    plt = pyplot()
    style = dict(STYLE, **{"axes.prop_cycle": cycler(color=PALETTE)})
    with plt.rc_context(style):
        yield


def styled(draw: Callable) -> Callable:
    """``draw`` run inside :func:`paper_style`."""

    @functools.wraps(draw)
    def wrapper(*args, **kwargs):
        with paper_style():
            return draw(*args, **kwargs)

    return wrapper


def save_figure(fig, png: str | Path, *, vector: bool = True) -> Path:
    """``png`` at :data:`PNG_DPI` and, with ``vector`` (the default), the same figure as PDF
    and SVG beside it (same stem); the figure is closed.  Returns the PNG's path; a one-line
    error if a file cannot be written.  ``vector=False`` is for figures written on every run
    (a run's curves.png), where the PDF and SVG cost more than the run's other files."""
    png = Path(png)
    if png.suffix.lower() != ".png":
        raise DPDLError(f"a figure is named by its PNG file; got {str(png)!r}")
    plt = pyplot()
    try:
        png.parent.mkdir(parents=True, exist_ok=True)
        for fmt in FORMATS if vector else [f for f in FORMATS if f == "png"]:
            # no creation date: the same figure gives the same PDF and SVG
            metadata = {"CreationDate": None} if fmt == "pdf" else {"Date": None}
            if fmt == "png":
                metadata = {"Software": "dpdl (matplotlib)"}
            fig.savefig(png.with_suffix(f".{fmt}"), dpi=PNG_DPI, metadata=metadata)
    except OSError as err:
        raise DPDLError(f"cannot write {str(png)!r}: {err.strerror or err}") from None
    finally:
        plt.close(fig)
    return png


def band(ax, x, low, high, *, color, floor: float | None = None,
         ceiling: float | None = None, alpha: float = 0.18) -> None:  # fmt: skip
    """The spread over seeds as a band from ``low`` to ``high``, cut at the quantity's
    physical bounds (``floor``, ``ceiling``): a mean ± std can cross them, the quantity
    cannot."""
    low = np.asarray(low, dtype=float)
    high = np.asarray(high, dtype=float)
    if floor is not None:
        low = np.maximum(low, floor)
    if ceiling is not None:
        high = np.minimum(high, ceiling)
    ax.fill_between(x, low, high, color=color, alpha=alpha, linewidth=0)


def legend_outside(fig, axes: Sequence, *, title: str | None = None) -> None:
    """One legend for the whole figure, right of the panels (never over the data), each
    label once."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside right upper", title=title)


def spans_decades(values, decades: float = 1.5) -> bool:
    """Whether positive ``values`` span more than ``decades`` orders of magnitude (a log
    axis shows them; a linear one lets the largest flatten the rest)."""
    finite = [v for v in np.ravel(np.asarray(values, dtype=float)) if math.isfinite(v)]
    positive = [v for v in finite if v > 0]
    if not positive or len(positive) < len(finite):
        return False
    return math.log10(max(positive) / min(positive)) > decades
