"""How heterogeneous the nodes' data are: per-node label histograms and their drawing.

A label histogram of a node is a statistic of its (private) training records.  The trainer
never releases one of a user's data: :func:`label_histograms` and
:func:`plot_label_distribution` are for the data owner to call on their own data, locally,
at their own discretion.  ``dpdl run`` writes them only for a library-made partition of a
shipped public benchmark (:func:`dpdl.data.registry.is_public_benchmark`), where the
histograms are a function of public data and the public seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpdl.data.nodes import local_arrays
from dpdl.errors import DPDLError
from dpdl.files import png_path, save_png

__all__ = ["label_histograms", "plot_label_distribution"]


def label_histograms(data: Sequence, classes: int) -> np.ndarray:
    """``(n_nodes, classes)`` integer counts: row i is ``numpy.bincount`` of node i's labels.

    ``data`` is one local data set per node, as :func:`dpdl.train` takes it (``(inputs,
    targets)`` pairs or ``torch.utils.data.Dataset``\\ s); labels must be class indices
    ``0 .. classes - 1``.
    """
    if isinstance(classes, bool) or not isinstance(classes, int | np.integer) or classes < 1:
        raise DPDLError(f"classes must be a positive integer, got {classes!r}")
    if not isinstance(data, Sequence) or isinstance(data, str | bytes) or not data:
        raise DPDLError("label_histograms needs a non-empty list of one data set per node")
    rows = []
    for i, node in enumerate(data):
        _, y = local_arrays(node, f"node {i}'s data")
        labels = y.reshape(-1)
        if not (np.issubdtype(labels.dtype, np.integer) or labels.dtype == np.bool_):
            if not np.all(labels == np.round(labels)):
                raise DPDLError(f"node {i}'s labels are real-valued: histograms need class "
                                "indices")  # fmt: skip
        labels = labels.astype(np.int64)
        bad = labels[(labels < 0) | (labels >= classes)]
        if bad.size:
            raise DPDLError(f"node {i} has labels outside 0..{classes - 1}, e.g. {int(bad[0])}")
        rows.append(np.bincount(labels, minlength=int(classes)))
    return np.stack(rows)


def plot_label_distribution(
    histograms,
    path,
    *,
    title: str | None = None,
    class_names: Sequence[str] | None = None,
    dpi: int = 110,
) -> Path:
    """A PNG of one horizontal bar per node, stacked by class (record counts), like
    flwr-datasets' ``plot_label_distributions``; drawn with the Agg canvas (no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = np.asarray(histograms, dtype=float)
    if counts.ndim != 2 or not counts.size or not np.all(np.isfinite(counts)) or counts.min() < 0:
        raise DPDLError("histograms must be a non-empty (nodes, classes) table of counts >= 0")
    path = png_path(path)
    n_nodes, n_classes = counts.shape
    names = list(class_names) if class_names is not None else [str(c) for c in range(n_classes)]
    if len(names) != n_classes:
        raise DPDLError(f"{len(names)} class names for {n_classes} classes")
    figure = Figure(figsize=(7.5, 1.2 + 0.28 * n_nodes))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot(1, 1, 1)
    left = np.zeros(n_nodes)
    cmap = _class_colours(n_classes)
    for c in range(n_classes):
        ax.barh(np.arange(n_nodes), counts[:, c], left=left, color=cmap[c], label=names[c])
        left += counts[:, c]
    ax.set(xlabel="records", ylabel="node", yticks=np.arange(n_nodes), ylim=(n_nodes - 0.5, -0.5))
    ax.tick_params(axis="y", labelsize=7 if n_nodes > 30 else 9)
    ax.legend(title="label", fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.set_title(title or "label distribution per node", fontsize=10)
    figure.tight_layout()
    return save_png(figure, path, dpi)


def _class_colours(n_classes: int) -> list:
    from matplotlib import colormaps

    name = "tab10" if n_classes <= 10 else "tab20" if n_classes <= 20 else "viridis"
    cmap = colormaps[name]
    if name == "viridis":
        return [cmap(c / max(n_classes - 1, 1)) for c in range(n_classes)]
    return [cmap(c) for c in range(n_classes)]
