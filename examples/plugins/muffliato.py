"""Muffliato-style private gossip (Cyffers, Even, Bellet & Ballu, NeurIPS 2022) as a dpdl
plugin: each step one private local update (the exact Gaussian release of the node's clipped
gradient sum), then ``rounds`` push-sum gossip rounds, only the first carrying fresh noise.

Use it by name once this file is loaded: ``DPDL_PLUGINS=examples/plugins/muffliato.py dpdl run
--set 'experiment.algorithms=["muffliato(rounds=4)"]'`` (or install a package whose entry
point group ``dpdl.algorithms`` names this module).  More rounds average the noise away
faster, at R times the messages per step; the record-level ε is the same (the extra rounds
are post-processing of the one release), what an observer sees changes
(``dpdl gossip account --algorithm "muffliato(rounds=4)"``).
"""

from pydantic import BaseModel, ConfigDict, Field

from dpdl import Algorithm, View, register_algorithm


class MuffliatoSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    rounds: int = Field(1, ge=1, le=64, description="gossip rounds per step")


class Muffliato(Algorithm):
    name = "muffliato"
    schedule = "const-d2p"  # calibrated like Const-D2P: one release per step
    description = "one private local step, then R gossip rounds (Cyffers et al. 2022)"
    Settings = MuffliatoSettings

    def rounds(self, settings):
        return settings.rounds

    def view(self, settings):
        return View(rounds=settings.rounds, fresh_noise_every_round=False)

    def step(self, context):
        half = context.local_update()
        if not context.arguments.mix:
            context.keep_model(half.params)
            return half.batch_sizes
        rounds = context.settings.rounds
        first = context.arguments.mixing_round * rounds  # the graphs walk on, round by round
        context.mix_model(half.params, first)
        for r in range(1, rounds):
            context.mix_model(None, first + r)
        return half.batch_sizes


register_algorithm(Muffliato())
