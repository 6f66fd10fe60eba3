"""`dpdl run` never passes in silence where Dyn-D2P does not beat Const-D2P."""

from dpdl.commands.run import dyn_vs_const_notes


def _entry(algorithm, eps, acc, seeds=(0,)):
    return {"algorithm": algorithm, "epsilon_target": eps, "test_accuracy": acc,
            "seeds": list(seeds)}  # fmt: skip


def test_a_note_where_dyn_does_not_beat_const():
    summary = [_entry("sgp", None, 0.9), _entry("const-d2p", 1.0, 0.725),
               _entry("dyn-d2p", 1.0, 0.714), _entry("const-d2p", 0.3, 0.5),
               _entry("dyn-d2p", 0.3, 0.6)]  # fmt: skip
    (note,) = dyn_vs_const_notes(summary)
    assert "eps = 1" in note and "0.714" in note and "0.725" in note


def test_notes_pair_by_calibration():
    summary = [_entry("const-d2p@clt", 1.0, 0.7), _entry("dyn-d2p@pld", 1.0, 0.6),
               _entry("const-d2p@pld", 1.0, 0.5), _entry("dyn-d2p@clt", 1.0, 0.65, (0, 1))]
    (note,) = dyn_vs_const_notes(summary)
    assert "(clt)" in note and "2 seeds" in note
