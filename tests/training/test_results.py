"""One std convention for every "± std" / ``*_std`` that dpdl writes: the sample standard
deviation over seeds (ddof = 1), undefined (NaN in memory, null in JSON) for one seed.

Expected values come from the standard library's ``statistics.stdev``, not from numpy.
"""

import math
import statistics

import pytest

from dpdl.extensions.fdp import experiment as fdp
from dpdl.extensions.linreg import experiment as linreg
from dpdl.extensions.netdp import experiment as netdp
from dpdl.training.results import sample_std, std_or_none, summarize

VALUES = [0.61, 0.64, 0.70]


def test_sample_std_is_the_ddof_1_std_and_undefined_for_one_value():
    assert sample_std(VALUES) == pytest.approx(statistics.stdev(VALUES))
    assert sample_std([0.5, 0.5]) == 0.0
    assert math.isnan(sample_std([0.5])) and math.isnan(sample_std([]))
    assert std_or_none(VALUES) == pytest.approx(statistics.stdev(VALUES))
    assert std_or_none([0.5]) is None


def _cell(seed: int, accuracy: float, status: str = "ok") -> dict:
    return {"algorithm": "dyn-d2p@pld", "epsilon_target": 1.0, "seed": seed, "status": status,
            "final": {"test_accuracy": accuracy, "epsilon_certified": 1.0}}  # fmt: skip


def test_results_json_summary_uses_the_sample_std():
    (entry,) = summarize([_cell(s, v) for s, v in enumerate(VALUES)] + [_cell(9, 0.1, "diverged")])
    assert entry["test_accuracy_std"] == pytest.approx(statistics.stdev(VALUES))
    assert entry["epsilon_certified_std"] == 0.0
    (single,) = summarize([_cell(0, 0.6)])
    assert single["test_accuracy_std"] is None  # dpdl run prints no "±" for it


def test_linreg_netdp_and_fdp_tables_use_the_sample_std():
    cells = [{"topology": "ring", "epsilon_target": 1.0, "epsilon": 1.0,
              "epsilon_closed_form": 1.0, "c_v": 1.0, "noise_scale_final": 0.5,
              "final_test_mse_mean": v, "final_test_mse_worst": 2 * v} for v in VALUES]  # fmt: skip
    (row,) = linreg._summary(cells)
    assert row["final_test_mse_mean_std"] == pytest.approx(statistics.stdev(VALUES))
    assert row["final_test_mse_worst_std"] == pytest.approx(2 * statistics.stdev(VALUES))
    assert linreg._summary(cells[:1])[0]["final_test_mse_mean_std"] is None

    results = [{"approach": "network", "epsilon": 1.0, "sigma": 2.0, "test_accuracy": v,
                "test_loss": 0.3} for v in VALUES]  # fmt: skip
    (summary,) = netdp._summary(results)
    assert summary["test_accuracy_std"] == pytest.approx(statistics.stdev(VALUES))
    assert netdp._summary(results[:1])[0]["test_accuracy_std"] is None

    finals = [{"accuracy": v, "loss": 0.3} for v in VALUES]
    def fdp_std(finals):
        return fdp._table_row("random-walk", "pn-fdp", 1.0, 2.0, finals, "seed")["accuracy_std"]

    assert fdp_std(finals) == pytest.approx(statistics.stdev(VALUES))
    assert fdp_std(finals[:1]) is None
