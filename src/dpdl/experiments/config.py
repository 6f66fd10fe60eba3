"""Configuration of a ``decentralized`` experiment (the Dyn-D2P family, MATH.md §2-4).

A config is a TOML document (or the same dict) with these tables; every table forbids
unknown keys, and every error names the dotted key::

    kind = "decentralized"
    [experiment]  name, algorithms, seed (int or list), entropy, common_noise, runtime,
                  device, vector_figures
    [data]        dataset, data_dir, download, partition, alpha, max_train_records,
                  validation_records
    [model]       name
    [topology]    name, nodes, seed, params
    [training]    steps | epochs, batch_size (expected b), sampling, sample_rate, lr,
                  lr_decay, momentum, weight_decay, local_steps, eval_every, eval_* sizes,
                  node_eval_share (per-node evaluation on held-out records)
    [privacy]     epsilon (float or list), delta, neighboring, calibrate, clip, clip0, rho_c,
                  rho_mu, certified_accountant, eval_blocks, final_mode, final_blocks

``privacy.neighboring``: the relation every epsilon is stated and calibrated for,
``"replace-one"`` (default; node sizes are public and released) or ``"add-remove"`` (node
sizes secret: needs ``training.steps`` and ``training.sample_rate`` q, refuses epochs and
per-node sampling, and releases no node size).

``training.sampling``: ``"uniform"`` (default) samples every node at p = b / J_min, so b is
the smallest node's expected batch and an epoch is J_min / b steps; ``"per-node"`` samples
node i at q_i = b / J_i (b at every node) and an epoch is mean(J_i) / b steps. The schedule is
calibrated at b / J_min either way: the reported epsilon is the smallest node's, every other
node's (``epsilon_per_node`` in results.json) is at most that.

An algorithm is a name of :data:`dpdl.accounting.schedules.ALGORITHMS`, optionally with the
calibrating accountant after an ``@`` (``"dyn-d2p@clt"`` is the paper's CLT calibration,
``"dyn-d2p"`` uses ``privacy.calibrate``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from dpdl.training.settings import (
    AlgorithmSpec,
    ConfigSection,
    PrivacySection,
    TrainingSection,
    check_neighboring,
    validate_config,
)

_Section = ConfigSection

__all__ = ["RunConfig", "parse_config"]


class ExperimentSection(_Section):
    name: str = "experiment"
    # Private algorithms only by default: a non-private baseline ("sgp") releases a noise-free
    # function of the training data and runs only when a config names it.
    algorithms: list[str] = Field(default_factory=lambda: ["const-d2p", "dyn-d2p"])
    seed: int | list[int] = 0
    # Where the secret randomness (sampling, noise) comes from: "os" (secret, default) or
    # "seed" (reproducible noise: an explicit research choice, recorded in every result).
    entropy: Literal["os", "seed"] = "os"
    # research mode with entropy = "seed": every algorithm and setting of a seed draws the same
    # sampling and noise streams (common random numbers for paired comparisons)
    common_noise: bool = False
    runtime: str = "simulator"  # a name of dpdl.engine.runtime.RUNTIMES (register_runtime)
    device: str = "cpu"
    # curves.png's PDF and SVG beside it (a paper's figure); the PNG alone by default, since
    # every run (and every sweep cell) writes it
    vector_figures: bool = False

    @field_validator("algorithms")
    @classmethod
    def _algorithms(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one algorithm is needed")
        labels = [AlgorithmSpec.parse(v).label for v in value]
        if len(set(labels)) != len(labels):
            raise ValueError(f"duplicate algorithms in {value}")
        return labels

    @field_validator("seed")
    @classmethod
    def _seed(cls, value: int | list[int]) -> int | list[int]:
        seeds = value if isinstance(value, list) else [value]
        if not seeds or any(s < 0 for s in seeds):
            raise ValueError(f"seeds must be non-negative integers, got {value}")
        return value

    @field_validator("runtime")
    @classmethod
    def _runtime(cls, value: str) -> str:
        from dpdl.algorithms.registry import load_plugins
        from dpdl.engine.runtime import RUNTIMES

        load_plugins()  # a plugin may register its runtime
        if value not in RUNTIMES:
            raise ValueError(f"unknown runtime {value!r}; registered: {', '.join(RUNTIMES)}")
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not (value in ("cpu", "cuda", "auto") or value.startswith("cuda:")):
            raise ValueError(f"unknown device {value!r}; use cpu, cuda, cuda:N or auto")
        return value

    @model_validator(mode="after")
    def _common_noise(self):
        if self.common_noise and self.entropy != "seed":
            raise ValueError("experiment.common_noise = true shares seeded noise between the "
                             f"arms: it needs entropy = \"seed\", got {self.entropy!r}")
        return self

    @property
    def seeds(self) -> list[int]:
        return self.seed if isinstance(self.seed, list) else [self.seed]

    @property
    def specs(self) -> list[AlgorithmSpec]:
        return [AlgorithmSpec.parse(a) for a in self.algorithms]


class DataSection(_Section):
    dataset: str = "digits"
    data_dir: str | None = None
    download: bool = False
    partition: Literal["iid", "dirichlet", "shards"] = "iid"
    alpha: float = Field(0.5, gt=0)
    # dirichlet with Flower's semantics (no reserved records; redraw until every node has this
    # many); without it, min(10, N/n) uniformly drawn records are reserved for every node.
    min_partition_size: int | None = Field(None, ge=0)
    shards_per_node: int = Field(2, ge=1)  # partition = "shards": McMahan et al.'s split
    max_train_records: int | None = Field(None, ge=1)
    # Records held out of the training set as validation data (choose parameters on it),
    # declared public: the same records for every seed (a keyed hash of each record,
    # dpdl.data.validation_split), counted in max_train_records.
    validation_records: int | None = Field(None, ge=1)
    # Each party's own files instead of a split data set: a path pattern with {i} (the node)
    # and optionally {rank} (the process) and $VARIABLES, e.g. "parties/node-{i}.npz" (.npz
    # with x and y, or .csv with the target last).  Every process reads only the files of the
    # nodes it hosts; the evaluation records (public) come from eval_file, else from the test
    # split of `dataset`.
    per_node: str | None = None
    eval_file: str | None = None
    # With per_node: each party's own evaluation records of each node it hosts (a pattern with
    # {i}), declared public by the party; read only by the process hosting node i and kept
    # there: node i's model is scored on them (node_local_* metrics), only the scores leave.
    node_eval_file: str | None = None
    # With per_node: public validation records (every party the same file), on which a
    # tuning chooses (val_* metrics), in place of validation_records held out of a split.
    validation_file: str | None = None

    @model_validator(mode="after")
    def _per_node(self) -> DataSection:
        if self.validation_file is not None and self.per_node is None:
            raise ValueError("data.validation_file goes with data.per_node (a split data set "
                             "holds out data.validation_records)")  # fmt: skip
        if self.node_eval_file is not None:
            if self.per_node is None:
                raise ValueError("data.node_eval_file goes with data.per_node")
            if "{i}" not in self.node_eval_file:
                raise ValueError(f"data.node_eval_file needs {{i}} (the node) in "
                                 f"{self.node_eval_file!r}")  # fmt: skip
        if self.per_node is not None:
            if "{i}" not in self.per_node:
                raise ValueError(f"data.per_node needs {{i}} (the node) in {self.per_node!r}")
            for key in ("validation_records", "max_train_records"):
                if getattr(self, key) is not None:
                    raise ValueError(f"data.{key} splits a data set: not with data.per_node")
        elif self.eval_file is not None:
            raise ValueError("data.eval_file goes with data.per_node")
        return self


class ModelSection(_Section):
    # A shipped model, one registered with dpdl.models.register_model, or a factory by its
    # import path "package.module:function" (input_shape, num_outputs, **options) -> Module.
    name: str = "logreg"
    options: dict[str, Any] = Field(default_factory=dict)


class TopologySection(_Section):
    name: str = "exp"
    nodes: int = Field(20, ge=1)  # 1: only the "central" topology (one node, every record)
    seed: int = 0
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: int, info) -> int:
        central = info.data.get("name") == "central"
        if central and value != 1:
            raise ValueError(f"topology 'central' is one node holding every record, got {value}")
        if not central and value < 2:
            raise ValueError(f"decentralized training needs at least 2 nodes, got {value} "
                             "(one node holding every record: topology 'central')")
        return value


class RunConfig(_Section):
    kind: Literal["decentralized"] = "decentralized"
    experiment: ExperimentSection = Field(default_factory=ExperimentSection)
    data: DataSection = Field(default_factory=DataSection)
    model: ModelSection = Field(default_factory=ModelSection)
    topology: TopologySection = Field(default_factory=TopologySection)
    training: TrainingSection = Field(default_factory=lambda: TrainingSection(steps=200))
    privacy: PrivacySection = Field(default_factory=PrivacySection)


def parse_config(config: dict[str, Any] | RunConfig) -> RunConfig:
    """Validate a ``decentralized`` config; raises DPDLError naming every offending key (and
    the setting privacy.neighboring refuses: :func:`check_neighboring`)."""
    parsed = validate_config(RunConfig, config)
    check_neighboring(parsed.privacy, parsed.training)
    return parsed
