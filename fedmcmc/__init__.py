"""fedmcmc: Bayesian posterior sampling when the data is split across clients.

>>> import fedmcmc as fm
>>> result = fm.sample(model, fm.Federation(clients), algorithm=fm.FSGLD(...), init=params0,
...                    num_samples=1000)
"""

from . import cache  # noqa: F401 - first: switches on the persistent compilation cache
from . import datasets, diagnostics, models, partition, surrogates
from .api import sample
from .engines.engine import LocalEngine
from .engines.flower_engine import FlowerEngine
from .engines.ray_engine import RayEngine
from . import convergence, run_length
from .convergence import ConvergenceCheck, ConvergenceWarning
from .run_length import RunLengthWarning
from .baselines import FALD, QLSD, ConsensusMC
from .decentralised import DULA, GTDULA
from .federation import Federation
from .handoff_algorithm import HandoffAlgorithm
from .protocols import HandoffProtocol
from . import schedules
from .langevin import DSGLD, FSGLD, SGLD, FedSGHMC, RMSPropPreconditioner
from .model import Model
from .pdmp import FedBoomerang, FedBPS, FedZigZag
from .reference import reference_posterior
from .results import Result, SamplingDivergedError
from . import privacy
from .privacy import Privacy, PrivacyBudgetExceeded

__version__ = "0.1.0"

__all__ = [
    "Model",
    "Federation",
    "sample",
    "LocalEngine",
    "RayEngine",
    "FlowerEngine",
    "Result",
    "SamplingDivergedError",
    "Privacy",
    "PrivacyBudgetExceeded",
    "privacy",
    "ConvergenceWarning",
    "ConvergenceCheck",
    "RunLengthWarning",
    "convergence",
    "run_length",
    "SGLD",
    "DSGLD",
    "FSGLD",
    "FedSGHMC",
    "RMSPropPreconditioner",
    "FedZigZag",
    "FedBPS",
    "FedBoomerang",
    "DULA",
    "GTDULA",
    "FALD",
    "QLSD",
    "ConsensusMC",
    "HandoffAlgorithm",
    "HandoffProtocol",
    "schedules",
    "surrogates",
    "diagnostics",
    "reference_posterior",
    "models",
    "datasets",
    "partition",
    "cache",
]
