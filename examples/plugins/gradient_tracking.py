"""Private decentralized gradient tracking (DSGT; Pu & Nedić 2021) as a dpdl plugin, with
fresh noise on both messages it sends each step.

Node i keeps a tracker y_i of the network's average gradient and its last tracker release
g_i.  Step k releases two subsampled Gaussians, each on its own Poisson sample with clip C_k:

* ``model``:   h_i^k = (S_i^k + σ_k ξ) / b, the built-in private local update's noisy gradient;
* ``tracker``: g_i^k = (S'_i^k + ρ σ_k ξ') / b, with ``tracker_noise`` ρ;

then  y_i^{k+1/2} = y_i^k + g_i^k − g_i^{k−1}  and
      x_i^{k+1/2} = x_i^k − γ_k (h_i^k + y_i^k − g_i^{k−1})
(the local gradient plus the tracker's estimate of the network average minus the node's own),
and both x and y gossip with the round's graph.  With h = g it is DSGT's x − γ y^{k+1/2}.
The ledger records the two releases of every step (multipliers z_k and ρ z_k) and composes
them; σ is calibrated so that both together meet the target ε.  Push-sum keeps x unbiased on
directed graphs; y mixes with the same column-stochastic matrices, so tracking is exact on
doubly stochastic graphs (ring, exponential) and approximate elsewhere.
"""

import torch
from pydantic import BaseModel, ConfigDict, Field

from dpdl import Algorithm, Release, View, register_algorithm


class TrackingSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    tracker_noise: float = Field(1.0, gt=0, le=100,
                                 description="the tracker's noise multiplier / the model's")


class GradientTracking(Algorithm):
    name = "dsgt"
    schedule = "const-d2p"
    description = "gradient tracking with noise on the model and the tracker (two releases)"
    Settings = TrackingSettings

    def releases(self, settings):
        return (Release("model"), Release("tracker", settings.tracker_noise))

    def view(self, settings):
        return View(rounds=1, exact=False)  # two coupled streams: local DP bounds the view

    def init_state(self, context):
        zeros = {name: torch.zeros_like(p) for name, p in context.model.items()}
        return {"tracker": zeros, "last_release": {k: v.clone() for k, v in zeros.items()}}

    def step(self, context):
        state = context.state
        y, g_last = state["tracker"], state["last_release"]
        g = context.noisy_gradient(1)  # the tracker's release, at the models x_i^k / w_i^k
        half = context.local_update()  # x^k - lr h^k, the model's release
        lr = context.arguments.lr
        for name, x in half.params.items():
            x.sub_(y[name] - g_last[name], alpha=lr)  # in x-space, as the update itself
            y[name] += g[name] - g_last[name]
            g_last[name] = g[name]
        if context.arguments.mix:
            state["tracker"] = context.mix(y, context.arguments.mixing_round)
            context.mix_model(half.params, context.arguments.mixing_round)
        else:
            context.keep_model(half.params)
        return half.batch_sizes


register_algorithm(GradientTracking())
