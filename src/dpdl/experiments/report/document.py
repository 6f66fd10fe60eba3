"""What a sweep's report says, in order: the one list of sections written as Markdown and
HTML (render.py), and ``write_report``, which writes both."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from dpdl.accounting.certified import ACCOUNTANTS
from dpdl.experiments.report.claims import check_claims
from dpdl.experiments.report.collect import CellRun, FailedCell, collect_failures, collect_runs
from dpdl.experiments.report.figures import make_figures
from dpdl.experiments.report.grouping import (
    algorithms_of,
    calibration_rank,
    display_label,
    epsilon_text,
    gain_pairs,
    setting_label,
    settings_of,
)
from dpdl.experiments.report.render import (
    Figure,
    Paragraph,
    Section,
    Table,
    to_html,
    to_markdown,
)
from dpdl.experiments.report.tables import (
    Tables,
    build_tables,
    overspend_sentence,
    understatement_sentence,
)
from dpdl.experiments.sweep.driver import declared_pairs
from dpdl.plotting import FORMATS
from dpdl.training.provenance import PROVENANCE_KEY, provenance_lines
from dpdl.training.results import sample_std
from dpdl.training.settings import REPRODUCIBLE_NOISE_NOTE


def write_report(sweep_dir: Path, out_dir: Path | None = None) -> dict[str, Path]:
    """``report.md`` with its PNG figures beside it and a self-contained ``report.html`` in
    ``out_dir`` (default SWEEP_DIR/report)."""
    sweep_dir = Path(sweep_dir)
    out_dir = Path(out_dir or sweep_dir / "report")
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = collect_runs(sweep_dir)
    declared = declared_pairs(sweep_dir)  # the sweep's [report] pairs; None: the registry's
    sections = report_sections(runs, build_tables(runs, declared), make_figures(runs, out_dir),
                               collect_failures(sweep_dir), declared)  # fmt: skip
    title = f"dpdl report — {sweep_dir.name}"
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    md_path.write_text(to_markdown(title, sections))
    html_path.write_text(to_html(title, sections))
    return {"markdown": md_path, "html": html_path}


def write_figures(sweep_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Only the figures of a finished (or partly finished) sweep, again: every PNG with its
    PDF and SVG in ``out_dir`` (default SWEEP_DIR/report); the report's text is left as it
    is.  ``dpdl report --figures-only``."""
    sweep_dir = Path(sweep_dir)
    out_dir = Path(out_dir or sweep_dir / "report")
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = make_figures(collect_runs(sweep_dir), out_dir)
    return [f.path.with_suffix(f".{fmt}") for f in figures for fmt in FORMATS]


def report_sections(
    runs: list[CellRun], tables: Tables, figures: list[Figure], failures: list[FailedCell] = (),
    declared: list[tuple[str, str]] | None = None,
) -> list[Section]:
    """``declared``: the sweep's comparison pairs (None: the registry's), for the claims and
    the introduction's gain sentence (``tables`` were built with the same)."""
    claims = check_claims(runs, declared)
    reproducible = reproducible_noise_note(runs)
    return [
        Section(
            None,
            [
                Paragraph(_introduction(runs, declared)),
                *([Paragraph(reproducible, lead="Note:")] if reproducible else []),
                Table(tables.accuracy_header, tables.accuracy_rows),
            ],
        ),
        *([failed_cells_section(failures)] if failures else []),
        Section(
            "Privacy: what the CLT calibration really spends",
            [
                Paragraph(overspend_sentence(tables)),
                Table(tables.calibration_header, tables.calibration_rows),
            ],
        ),
        Section(
            "Claims that apply to what ran (MATH.md §4)",
            [Table(["claim", "verdict"], [[c, v] for c, v in claims])]
            if claims
            else [Paragraph("No claim applies.")],
        ),
        Section("Figures", list(figures)),
        Section(
            "Every run: ε of the CLT approximation beside the certified ε",
            [
                Paragraph(understatement_sentence(tables)),
                Table(tables.privacy_header, tables.privacy_rows),
            ],
        ),
        *([node_accuracy_section(runs)] if _per_node(runs) else []),
        *([communication_section(runs)] if _counted(runs) else []),
        provenance_section(runs),
    ]


def _per_node(runs: list[CellRun]) -> bool:
    return any(math.isfinite(r.extra.get("node_accuracy_worst", math.nan)) for r in runs)


def node_accuracy_section(runs: list[CellRun]) -> Section:
    """Each node's own model beside the network average: a decentralized run is only as
    good as its worst node (final test accuracy, mean ± std over seeds, %)."""
    groups: dict[tuple, list[CellRun]] = {}
    for run in runs:
        if math.isfinite(run.extra.get("node_accuracy_worst", math.nan)):
            groups.setdefault((setting_label(run.setting), run.algorithm,
                               run.epsilon_target), []).append(run)  # fmt: skip
    rows = []
    for (setting, algorithm, eps), members in sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1], _eps_key(kv[0][2]))):
        cells = [_mean_std([r.final_accuracy for r in members])]
        cells += [_mean_std([r.extra[key] for r in members])
                  for key in ("node_accuracy_mean", "node_accuracy_worst")]
        rows.append([setting, algorithm, epsilon_text(eps), *cells])
    return Section("Per-node accuracy: every node's own model", [
        Paragraph("Final test accuracy of the network-average model, of the nodes' own "
                  "de-biased models on average and of the worst node, mean ± std over seeds "
                  "(%)."),
        Table(["setting", "algorithm", "ε", "average model", "node mean", "worst node"], rows),
    ])  # fmt: skip


def _eps_key(eps: float) -> float:
    return -1.0 if math.isnan(eps) else eps


def _mean_std(values: list[float]) -> str:
    mean, std = 100 * float(np.mean(values)), 100 * sample_std(values)
    return f"{mean:.2f}" if math.isnan(std) else f"{mean:.2f} ± {std:.2f}"


def _counted(runs: list[CellRun]) -> bool:
    return any(math.isfinite(r.extra.get("bytes_per_node", math.nan)) for r in runs)


def communication_section(runs: list[CellRun]) -> Section:
    """What each algorithm sent per node in a run, by setting (the mixer's counts): a variant
    that gossips R times per step sends R times the bytes at equal steps."""
    groups: dict[tuple, list[CellRun]] = {}
    for run in runs:
        if math.isfinite(run.extra.get("bytes_per_node", math.nan)):
            groups.setdefault((setting_label(run.setting), run.algorithm), []).append(run)
    rows = []
    for (setting, algorithm), members in sorted(groups.items()):
        steps = sorted({int(r.iterations[-1]) for r in members})
        messages = float(np.mean([r.extra["messages_per_node"] for r in members]))
        sent = float(np.mean([r.extra["bytes_per_node"] for r in members]))
        rows.append([setting, algorithm, "/".join(map(str, steps)), f"{messages:g}",
                     _bytes_text(sent)])  # fmt: skip
    return Section("Communication: what each node sent in a run", [
        Paragraph("Messages a node sent to other nodes in the whole run and their size (its "
                  "model and push-sum weight per out-neighbour and gossip round), mean over "
                  "nodes and runs, as the runtime's mixer counted them."),
        Table(["setting", "algorithm", "steps", "messages per node", "bytes per node"], rows),
    ])  # fmt: skip


def _bytes_text(value: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def provenance_section(runs: list[CellRun]) -> Section:
    """Where the runs came from: one block per distinct provenance (commit, versions,
    machine), with how many runs share it.  The command line differs per cell and is left
    out of the grouping; a seeded run reproduces bit for bit only within one block."""
    groups: dict[str, tuple[dict | None, int]] = {}
    for run in runs:
        block = run.extra.get(PROVENANCE_KEY)
        key = json.dumps({k: v for k, v in (block or {}).items() if k != "command"},
                         sort_keys=True)  # fmt: skip
        groups[key] = (block, groups.get(key, (block, 0))[1] + 1)
    items = []
    for block, count in groups.values():
        lines = [line for line in provenance_lines(block) if not line.startswith("command:")]
        items.append(Paragraph("; ".join(lines), lead=f"{count} run(s):"))
    return Section("Provenance", items)


def failed_cells_section(failures: list[FailedCell]) -> Section:
    """The cells that failed: in no table or figure of the report, so named here."""
    return Section(
        f"Failed cells: {len(failures)}",
        [
            Paragraph("These cells of the sweep failed: no table or figure counts them. "
                      "Running the sweep again retries them."),
            Table(["cell", "settings", "error"],
                  [[f.cell, f.settings_text, f.error] for f in failures]),
        ],
    )


def _introduction(runs: list[CellRun], declared: list[tuple[str, str]] | None = None) -> str:
    steps = sorted({int(r.iterations[-1]) for r in runs})
    budget = f"{steps[0]} iterations" if len(steps) == 1 else f"{steps[0]}–{steps[-1]} iterations"
    intro = (
        f"{len(settings_of(runs))} setting(s), {len(runs)} runs, {budget} per run. Final test "
        "accuracy of the network-average model, mean ± std over seeds (%)."
        + _calibration_sentence(runs) + _gain_sentence(runs, declared)
    )
    stopped = [f"{r.cell}: {r.algorithm} seed {r.seed} ε {epsilon_text(r.epsilon_target)}"
               for r in runs if r.status != "ok"]  # fmt: skip
    if stopped:
        intro += (
            f" {len(stopped)} run(s) diverged and count with their last evaluated accuracy: "
            + "; ".join(stopped)
            + "."
        )
    return intro


def _calibration_sentence(runs: list[CellRun]) -> str:
    """What the @suffixes of the labels that ran mean, from the accountants' registry."""
    said = []
    for calibration in sorted({r.calibration for r in runs if r.calibration},
                              key=calibration_rank):  # fmt: skip
        accountant = ACCOUNTANTS.get(calibration)
        if accountant is None:
            continue
        kind = "the approximation" if not accountant.certified else "the certified accountant"
        said.append(f"@{calibration} by {kind} {accountant.display}")
    return f" Calibration (a label's suffix): {'; '.join(said)}." if said else ""


def _gain_sentence(runs: list[CellRun], declared: list[tuple[str, str]] | None = None) -> str:
    """The gains the accuracy table states: of each pair the sweep declared, else of each
    family that ran over the baseline the registry names for it (ScheduleFamily.baseline),
    both run under one calibration."""
    if declared is not None:
        text = "; ".join(f"{display_label(a)} over {display_label(b)}"
                         for _, a, b in gain_pairs(algorithms_of(runs), declared))  # fmt: skip
        return f" Gain (the pairs the sweep declared): relative accuracy of {text}." if text else ""
    pairs = sorted({(dyn.partition("@")[0], const.partition("@")[0])
                    for _, dyn, const in gain_pairs(algorithms_of(runs))})  # fmt: skip
    if not pairs:
        return ""
    text = "; ".join(f"{display_label(dyn)} over {display_label(const)}" for dyn, const in pairs)
    return f" Gain: relative accuracy of {text}, under the same calibration."


def reproducible_noise_note(runs: list[CellRun]) -> str | None:
    """The sentence that marks runs whose noise was derived from their seed (None: no such run)."""
    seeded = [r for r in runs if r.noise_entropy == "seed"]
    if not seeded:
        return None
    cells = ", ".join(sorted({r.cell for r in seeded}))
    note = f"{len(seeded)} of {len(runs)} runs (cells: {cells}) used {REPRODUCIBLE_NOISE_NOTE}."
    common = sum(bool(r.extra.get("common_noise")) for r in seeded)
    if common:  # experiment.common_noise: the arms share their streams on purpose
        note += (f" {common} of them shared their sampling and noise streams with every run of "
                 "the same seed (common_noise: common random numbers across the arms).")
    return note
