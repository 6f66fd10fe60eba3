"""Reports of a sweep: Markdown and self-contained HTML with tables and figures (issue 5).

Reads every finished cell of a sweep directory (``cell.json`` for the grid point, and the
cell's ``metrics.csv``) and writes ``report.md`` with PNG figures beside it, and
``report.html`` with the same figures embedded (base64), so it can be mailed as one file:

* accuracy table: final test accuracy of the average model, mean ± std over seeds, per
  (setting, ε) and algorithm label, and the relative gain of each compared pair: those the
  sweep's ``[report] pairs`` declare (:mod:`dpdl.experiments.comparisons`), else Dyn-D2P
  over Const-D2P (the registry's ``baseline``);
* privacy: what the CLT-calibrated runs really spend by the certified accountant, and for
  every run the ε of the CLT approximation beside the certified ε;
* the claims of MATH.md §4 checked against the measured means (of the same pairs);
* runs whose noise was derived from their seed (``noise_entropy = "seed"`` in results.json,
  the reproducible research mode) are named in a note under the introduction, and the
  per-run table has a noise column;
* cells that failed (the sweep driver's ``cells/<cell-id>.failed.json``) are listed with
  their settings and the error's first line under "Failed cells: N";
* figures: accuracy against iteration per ε, final accuracy against ε, the ρ_c × ρ_μ
  heat-map of Dyn-D2P, accuracy by topology and by number of nodes; each as PNG (200 dpi),
  PDF and SVG in the paper style of :mod:`dpdl.plotting` (``write_figures`` redraws them
  alone: ``dpdl report --figures-only``);
* a Communication section (what each node sent, as the mixer counted it) and a Provenance
  section (where the runs came from).

The modules, in the order the data flows: ``collect`` (run folders -> ``CellRun``),
``grouping`` (ordering, selecting and averaging runs), ``tables``, ``claims``, ``figures``,
``document`` (the list of sections; ``write_report``) and ``render`` (Markdown, HTML).
"""

from dpdl.experiments.report.claims import check_claims
from dpdl.experiments.report.collect import CellRun, collect_runs, read_metrics
from dpdl.experiments.report.document import (
    reproducible_noise_note,
    write_figures,
    write_report,
)
from dpdl.experiments.report.figures import make_figures
from dpdl.experiments.report.grouping import mean_final_accuracy, relative_gain
from dpdl.experiments.report.tables import Tables, build_tables
from dpdl.experiments.sweep.driver import declared_pairs

__all__ = [
    "CellRun",
    "Tables",
    "build_tables",
    "check_claims",
    "collect_runs",
    "declared_pairs",
    "make_figures",
    "mean_final_accuracy",
    "read_metrics",
    "relative_gain",
    "reproducible_noise_note",
    "write_figures",
    "write_report",
]
