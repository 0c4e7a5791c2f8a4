"""The ``fedmcmc`` command line.

    fedmcmc run CONFIG.yaml --out DIR [--resume] [--quiet]
    fedmcmc reproduce --list
    fedmcmc reproduce NAME --out DIR [--quick]

Errors in the user's input (config, data file, model name) print one message
and exit with status 1, without a traceback; Ctrl-C exits with status 130
after saving the draws made so far.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional

__all__ = ["main", "build_parser"]

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedmcmc",
        description="Federated Bayesian posterior sampling: run configured experiments, "
        "reproduce the papers' results and benchmark every algorithm.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    run = commands.add_parser(
        "run",
        help="run one configured experiment (several algorithms on one federation)",
        description="Run every algorithm of CONFIG on the same federation; write draws (ArviZ "
        "NetCDF), run info, the resolved config, report.md/report.html and plots into DIR.",
        epilog="Config format: docs/guide/command-line.md and "
        "examples/linear_regression.yaml; every field is documented in fedmcmc/config.py. "
        "Exit status: 0 done, 1 invalid config or input, 130 interrupted (draws kept; "
        "continue with --resume).",
    )
    run.add_argument("config", metavar="CONFIG.yaml", help="experiment config (YAML)")
    run.add_argument("--out", required=True, metavar="DIR", help="output directory")
    run.add_argument("--resume", action="store_true",
                     help="continue an interrupted run in DIR from its checkpoints")
    run.add_argument("--quiet", action="store_true", help="no progress bars or messages")

    reproduce = commands.add_parser(
        "reproduce",
        help="list or run the paper reproductions",
        description="Reproduce a figure or table of the papers; writes DIR/README.md with our "
        "result beside the paper's.",
    )
    reproduce.add_argument("name", nargs="?", metavar="NAME", help="reproduction to run")
    reproduce.add_argument("--list", action="store_true", help="list reproductions, one per line")
    reproduce.add_argument("--out", metavar="DIR", help="output directory")
    reproduce.add_argument("--quick", action="store_true", help="the small, fast size")

    bench = commands.add_parser(
        "bench",
        help="list or run the benchmark: every algorithm on shared problems against references",
        description="Run every algorithm of the library on the benchmark problems (real "
        "federations of very unequal clients and a synthetic one with client drift) with the "
        "same budget and seed, against exact or NUTS references of the pooled rows; write "
        "DIR/leaderboard.csv (one row per problem and algorithm), DIR/README.md (tables and "
        "verdicts in words) and DIR/results.json.",
        epilog="The problems and the rules that set each algorithm's hyper-parameters: "
        "docs/reference/benchmark.md. Exit status: 0 done, 1 invalid arguments, 130 "
        "interrupted.",
    )
    bench.add_argument("--list", action="store_true",
                       help="list the benchmark problems, one per line, the name first")
    bench.add_argument("--out", metavar="DIR", help="output directory")
    bench.add_argument("--quick", action="store_true",
                       help="the quick size: fewer problems, chains and draws")
    # NAMES: "A,B" or "A B" (both are typed; docs/reference/benchmark.md shows the second)
    bench.add_argument("--problems", metavar="NAMES", nargs="+",
                       help="subset of the problems, comma- or space-separated (default: all "
                            "of the size)")
    bench.add_argument("--algorithms", metavar="NAMES", nargs="+",
                       help="subset of the algorithms, comma- or space-separated (default: all)")
    bench.add_argument("--seed", type=int, default=0, help="seed of every run (default 0)")
    bench.add_argument("--jobs", type=int, default=None, metavar="N",
                       help="runs at a time, each in its own process (default: 2 with --quick on "
                            "2 or more cores, else 1)")
    bench.add_argument("--quiet", action="store_true", help="no progress messages")
    return parser


def _error(message: str) -> int:
    print(f"fedmcmc: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def _enable_compilation_cache() -> None:
    """Persist XLA compilations under the user's cache dir, so repeated runs start fast.

    ``import fedmcmc`` already did this (:mod:`fedmcmc.cache`); calling it again applies the same
    rules: left alone when the user configured JAX's cache or set FEDMCMC_COMPILATION_CACHE=0.
    """
    from . import cache

    cache.configure_default()


def _run(args) -> int:
    from .config import ConfigError
    from .runner import run_experiment

    _enable_compilation_cache()

    try:
        outcome = run_experiment(args.config, args.out, resume=args.resume, quiet=args.quiet)
    except ConfigError as error:
        return _error(str(error))
    except KeyboardInterrupt:
        print("fedmcmc: interrupted before sampling finished; checkpoints written so far are kept "
              "(continue with --resume)", file=sys.stderr)
        return EXIT_INTERRUPTED
    if outcome.interrupted:
        print(f"fedmcmc: interrupted; draws so far and a partial report are in {outcome.out_dir}; "
              "continue with: fedmcmc run CONFIG --out DIR --resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def _reproduce(args, parser) -> int:
    from . import reproduce

    if args.list:
        entries = reproduce.available()
        for entry in entries:
            print(f"{entry.name}\t{entry.description}")
        for module, error in reproduce.import_errors().items():
            print(f"fedmcmc: warning: reproduction module {module!r} failed to import: {error}",
                  file=sys.stderr)
        if not entries:
            print("no reproductions are registered yet (they are added in fedmcmc/reproduce/)",
                  file=sys.stderr)
        return 0
    if not args.name:
        return _error("reproduce needs NAME (or --list to see the names)")
    if not args.out:
        return _error("reproduce needs --out DIR")
    try:
        reproduce.get(args.name)
    except KeyError as error:
        return _error(str(error.args[0]))
    try:
        readme = reproduce.run(args.name, Path(args.out), quick=args.quick)
    except KeyboardInterrupt:
        print("fedmcmc: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"wrote {readme}")
    return 0


def _bench(args) -> int:
    from . import bench

    if args.list:
        for problem in bench.PROBLEMS.values():
            print(f"{problem.name}\t{problem.description.replace('``', '')}")
        return 0
    if not args.out:
        return _error("bench needs --out DIR (or --list to see the problems)")
    _enable_compilation_cache()

    def split(words):
        """The names of ``--problems A,B`` or ``--problems A B`` (or both mixed); None: all."""
        if not words:
            return None
        return [name.strip() for word in words for name in word.split(",") if name.strip()]

    try:
        readme = bench.run(Path(args.out), quick=args.quick, problems=split(args.problems),
                           algorithms=split(args.algorithms), seed=args.seed, quiet=args.quiet,
                           jobs=args.jobs)
    except ValueError as error:
        return _error(str(error))
    except KeyboardInterrupt:
        print("fedmcmc: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"wrote {readme}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """The ``fedmcmc`` command. Output into a pipe its reader closed (``fedmcmc bench --list |
    head``) ends the command quietly with status 1 rather than with a traceback."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # what was left unwritten goes nowhere, so that the flush at exit does not fail again
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):  # stdout without a file descriptor
            pass
        return 1


def _main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from . import __version__

        print(f"fedmcmc {__version__}")
        return 0
    if args.command == "run":
        return _run(args)
    if args.command == "reproduce":
        return _reproduce(args, parser)
    if args.command == "bench":
        return _bench(args)
    parser.print_help()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
