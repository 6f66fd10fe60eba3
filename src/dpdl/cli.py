"""The ``dpdl`` command line: a thin dispatcher.

Each sub-command lives in ``dpdl.commands.<name>`` (an extension's in
``dpdl.extensions.<name>.command``) and exposes

* ``HELP``: a one-line description,
* ``add_arguments(parser)``: declares its flags,
* ``run(args) -> int``: does the work and returns the exit status.

Modules are imported lazily so that ``dpdl account`` never imports torch.
User errors (``DPDLError``) print one line on stderr and exit with status 2, never a trace.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from dpdl.errors import DPDLError

COMMANDS: dict[str, str] = {
    "account": "Privacy accounting of a Dyn-D2P family schedule (CLT, PLD, RDP).",
    "graph": "Inspect a topology: period, connectivity, mixing metrics; draw it.",
    "run": "Train with the simulator (or the distributed runtime) from a config or preset.",
    "sweep": "Run a grid of configurations in parallel, resumably.",
    "tune": "Tune every algorithm on validation data with the same budget, then test.",
    "report": "Build Markdown/HTML reports from a sweep directory.",
    "netdp": "Network DP: local vs network DP for token algorithms.",
    "fdp": "f-DP accounting: PN-f-DP pairwise matrices, DECOR's Sec-f-LDP.",
    "audit": "Audit a private algorithm empirically: canaries, hypothesis tests, a lower ε bound.",
    "gossip": "Privacy of gossip against non-neighbours: exact view accounting, pairwise.",
    "ledger": "A site's privacy across runs: every run on its records composed, per data set.",
    "consortium": "A consortium's PKI: `dpdl consortium init FILE OUTDIR` (CA, party keys).",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors: one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


# Extensions own their command; the core names them only as strings (no import arrow back up).
EXTENSION_COMMANDS = {
    "netdp": "dpdl.extensions.netdp.command",
    "fdp": "dpdl.extensions.fdp.command",
}


def _load(name: str):
    return importlib.import_module(EXTENSION_COMMANDS.get(name, f"dpdl.commands.{name}"))


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="dpdl", description="Differentially private decentralized learning.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    # Only import the module of the command being run (keeps `dpdl account` torch-free).
    wanted = next((a for a in argv or [] if not a.startswith("-")), None)
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:
            _load(name).add_arguments(p)
    return parser


def _one_line_warnings(command: str, shown):
    """dpdl's own warnings as one line each, like its errors (others as Python shows them)."""

    def show(message, category, filename, lineno, file=None, line=None):
        if category.__module__.startswith("dpdl."):
            print(f"dpdl {command}: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    return show


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        with warnings.catch_warnings():  # restores the display after the command
            warnings.showwarning = _one_line_warnings(args.command, warnings.showwarning)
            return int(_load(args.command).run(args) or 0)
    except DPDLError as err:
        print(f"dpdl {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dpdl {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `dpdl ... | head`: the reader left; say nothing more
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
