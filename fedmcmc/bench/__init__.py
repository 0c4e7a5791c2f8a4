"""``fedmcmc bench``: every algorithm of the library on shared problems, against references.

>>> from fedmcmc import bench
>>> bench.problem_names()                       # what ``fedmcmc bench --list`` prints
>>> bench.run("bench-out", quick=True)          # leaderboard.csv, README.md, results.json

:mod:`fedmcmc.bench.problems` defines the problems, :mod:`fedmcmc.bench.algorithms`
the algorithms and the one rule per algorithm that sets their hyper-parameters,
:mod:`fedmcmc.bench.metrics` the figures and the verdict, :mod:`fedmcmc.bench.runner`
the run and the files it writes.
"""

from .algorithms import ALGORITHMS, Budget
from .metrics import accuracy, verdict
from .problems import PROBLEMS, QUICK, laplace
from .problems import names as problem_names
from .runner import COLUMNS, SIZES, run

__all__ = [
    "ALGORITHMS",
    "Budget",
    "COLUMNS",
    "PROBLEMS",
    "QUICK",
    "SIZES",
    "accuracy",
    "laplace",
    "problem_names",
    "run",
    "verdict",
]
