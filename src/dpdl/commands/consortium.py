"""``dpdl consortium init FILE OUTDIR``: the consortium's CA and every party's key and
certificate; and ``dpdl run CONFIG --consortium FILE --party NAME``: one party's run."""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

from dpdl.errors import DPDLError, require

HELP = "A consortium's PKI: `dpdl consortium init FILE OUTDIR` (CA, party keys)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    init = sub.add_parser("init", help="provision the consortium CA and each party's key and "
                                       "certificate (keys 0600)")  # fmt: skip
    init.add_argument("file", help="the consortium file (TOML)")
    init.add_argument("outdir", help="an empty folder for ca.pem, ca.key, <party>.pem/.key")


def run(args) -> int:
    from dpdl.engine.consortium.pki import provision
    from dpdl.engine.consortium.settings import load_consortium

    consortium = load_consortium(args.file)
    written = provision(consortium, args.outdir)
    print(f"consortium {consortium.name}: CA and {len(consortium.parties)} parties' keys and "
          f"certificates in {args.outdir}")  # fmt: skip
    for party in consortium.parties:
        print(f"  {party.name}: give it {Path(args.outdir) / (party.name + '.pem')}, its .key "
              "and ca.pem (its key only to it)")  # fmt: skip
    print(f"  keep {written[1]} (the CA key) offline: whoever holds it can add a party")
    return 0


def _refuse_private_shares(config: dict) -> None:
    """A correlation whose shares travel point to point (zero-sum) is refused before this party
    listens or talks to anyone: its transport carries broadcast rows only."""
    from dpdl.algorithms.correlated import make_correlation
    from dpdl.engine.consortium.runtime import ConsortiumRuntime
    from dpdl.engine.runtime import require_share_carrier

    privacy = config.get("privacy", {})
    require_share_carrier(make_correlation(privacy.get("correlation", "independent"),
                                           privacy.get("correlation_factor")),
                          ConsortiumRuntime)  # fmt: skip


def run_party(args, load, overrides: dict, print_summary) -> int:
    """Train as party ``args.party``: its identity, nodes, address and neighbours from the
    consortium file and the config's topology, whatever order the parties start in."""
    from dpdl.commands.run import apply_command_overrides, warn_if_reproducible
    from dpdl.engine.consortium.runtime import ConsortiumRuntime
    from dpdl.engine.consortium.sent_ledger import check_no_unfinished_run
    from dpdl.engine.consortium.settings import load_consortium
    from dpdl.engine.runtime import register_runtime
    from dpdl.experiments.registry import experiment_module, kind_of

    require(bool(args.consortium and args.party), "--consortium FILE and --party NAME go "
                                                  "together")  # fmt: skip
    for flag in ("resume", "procs"):
        require(getattr(args, flag) is None, f"--{flag} does not apply to a consortium party (a "
                "restarted party re-runs its command; its sent ledger checks every message)")
    require(args.runtime in (None, "consortium"),
            f"--consortium runs the consortium runtime, not --runtime {args.runtime}")
    consortium = load_consortium(args.consortium)
    consortium.party(args.party)
    config = apply_command_overrides(load(args), {**overrides, "runtime": "consortium"})
    require(kind_of(config).distributed, f"a consortium runs the decentralized kind, not "
                                         f"{config.get('kind')!r}")  # fmt: skip
    warn_if_reproducible(config)
    _refuse_private_shares(config)
    links, digest = _links_and_digest(config, consortium)
    ledger = Path(args.output) / "consortium" / f"{args.party}-{digest}.sent.jsonl"
    check_no_unfinished_run(ledger.parent, args.party, ledger)
    runtime = ConsortiumRuntime(consortium, args.party, links, ledger)
    register_runtime("consortium", lambda: runtime)  # the runner's runtime is this party
    runtime.start()
    try:
        results = experiment_module(config.get("kind")).run_experiment(
            config, Path(args.output), progress=not args.no_progress)
        runtime.close()
        runtime.ledger.finish()
        # secrets at rest no longer needed: a finished run is never re-sent
        shutil.rmtree(ledger.with_suffix(".keys"), ignore_errors=True)
    except BaseException as err:
        runtime.abort(f"party {args.party} stopped: {err}" if isinstance(err, DPDLError)
                      and not str(err).startswith("party ") else str(err) or repr(err))
        raise
    print_summary(results)
    print(f"party {args.party}: {len(runtime.ledger.entries)} messages over "
          f"{runtime.ledger.steps_sent} steps sent ({runtime.ledger.replayed} re-sent "
          f"identically after a restart); sent ledger {ledger}")  # fmt: skip
    failed = [c for c in results.get("cells", []) if c.get("status", "ok") != "ok"]
    return 1 if failed else 0


def _links_and_digest(config: dict, consortium) -> tuple[dict, str]:
    """The parties' neighbour links over every round of the run's graph, and a digest of the
    run (config and consortium) that names its sent ledger."""
    from dpdl.engine.consortium.runtime import party_links
    from dpdl.experiments.config import parse_config
    from dpdl.topology import make_topology

    cfg = parse_config(config)
    topology = make_topology(cfg.topology.name, cfg.topology.nodes, seed=cfg.topology.seed,
                             **cfg.topology.params)  # fmt: skip
    period = getattr(topology, "period", None)
    if isinstance(period, int) and period > 0:
        rounds = range(period)
    else:
        if not cfg.training.steps:
            raise DPDLError(f"topology {cfg.topology.name!r} has no period: a consortium run "
                            "needs training.steps to know every round's neighbours")
        rounds = range(cfg.training.steps)
    run = json.dumps([cfg.model_dump(mode="json"), consortium.model_dump(mode="json")],
                     sort_keys=True, default=str)  # fmt: skip
    return party_links(consortium, topology, rounds), hashlib.sha256(run.encode()).hexdigest()[:16]
