"""Experiment configs for ``fedmcmc run CONFIG.yaml``: schema, validation and resolution.

A config declares one federation and the algorithms to compare on it::

    name: linreg-demo
    model:
      name: linear_regression        # model-zoo name, or "package.module:function"
      params: {dim: 3}
    data:
      generate: {num_examples: 600, seed: 0}   # or  path: data.npz  (.npz, .npy or .csv)
    partition:
      method: iid                    # any function of fedmcmc.partition (iid, dirichlet, ...)
      num_clients: 4
    algorithms:
      - name: FSGLD                  # a class on the fedmcmc namespace
        params: {step_size: 1.0e-3, batch_size: 10, local_steps: 20}
      - name: DSGLD
        params: {step_size: 1.0e-3, batch_size: 10, local_steps: 20}
    num_samples: 1000
    burn_in: 200
    thin: 2
    chains: 2
    seed: 0
    engine: local

:func:`load_config` validates the YAML (unknown or mistyped fields are errors
naming the field, e.g. ``algorithms.1.params.step_size``) and
:func:`build_experiment` resolves it: the model, the data, the federation, the
initial parameters and the algorithm instances. Every failure is a
:class:`ConfigError` whose message names the field.

Models are resolved, in order, as

1. an import path ``"package.module:function"``: ``function(**params)``
   (receiving ``data=`` too when ``data.path`` is given and it takes a
   ``data`` argument) returns a :class:`~fedmcmc.Model`, ``(model, data)`` or
   ``(model, data, init)``, where data is a pytree or a ``Federation``;
2. a name in the model zoo :mod:`fedmcmc.models` (``fedmcmc.models.names()``:
   ``gaussian_mean``, ``linear_regression``, ``logistic_regression``, ...; a model
   of one's own joins it with ``fedmcmc.models.register``), called the same way.

Data come from ``data.path`` (relative to the config file), from the model
factory, or are generated (``data.generate``: keyword arguments of the zoo's
``fedmcmc.models.data_generator(name)``).
Algorithms are looked up by name on the ``fedmcmc`` namespace at run time, so
new algorithm classes work without editing this module; ``algorithms[].name`` may also be
the import path ``"package.module:Class"`` of an algorithm defined outside the package
(an :class:`~fedmcmc.algorithm.Algorithm` subclass, or a hand-off protocol, a
:class:`~fedmcmc.protocols.HandoffProtocol` subclass, run as ``fm.HandoffAlgorithm(Class(**params))``),
labelled ``Class`` in reports unless ``label`` says otherwise.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Union

import numpy as np
from pydantic import (BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError,
                      field_validator, model_validator)

from .model import Model
from .algorithm import Algorithm
from .protocols import HandoffProtocol
from .federation import Federation
from .api import ENGINES

__all__ = [
    "ConfigError",
    "ExperimentConfig",
    "Experiment",
    "load_config",
    "parse_config",
    "build_experiment",
    "resolve_algorithm_class",
]


class ConfigError(ValueError):
    """An invalid config or one that cannot be resolved; the message names the field."""


# ------------------------------------------------------------------- schema


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSection(_Strict):
    name: str = Field(min_length=1, description="model-zoo name or 'package.module:function'")
    params: Dict[str, Any] = Field(default_factory=dict)


class DataSection(_Strict):
    path: Optional[str] = Field(default=None, description=".npz, .npy or .csv file")
    columns: Optional[Dict[str, Union[str, List[str]]]] = Field(
        default=None, description="CSV only: leaf name -> column name or list of column names"
    )
    generate: Dict[str, Any] = Field(
        default_factory=dict, description="arguments of the model zoo's data generator"
    )
    dtype: Literal["float32", "float64"] = "float32"

    @model_validator(mode="after")
    def _one_source(self):
        if self.path is not None and self.generate:
            raise ValueError("give either path or generate, not both")
        if self.columns is not None and self.path is None:
            raise ValueError("columns needs path (a .csv file)")
        return self


class PartitionSection(_Strict):
    method: str = Field(default="iid", min_length=1,
                        description="a function of fedmcmc.partition: iid, by_label, dirichlet, ...")
    num_clients: Optional[int] = Field(default=4, ge=1)
    seed: int = 0
    weights: Optional[Union[Literal["uniform"], List[float]]] = None
    options: Dict[str, Any] = Field(default_factory=dict,
                                     description="extra keyword arguments of the partition function")


class AlgorithmSection(_Strict):
    name: str = Field(min_length=1, description="class name on the fedmcmc namespace, e.g. "
                      "FSGLD, or the import path 'package.module:Class' of one's own algorithm")
    label: Optional[str] = Field(default=None, description="unique label in reports (default: "
                                 "name, or the class name of an import path)")
    params: Dict[str, Any] = Field(default_factory=dict)
    thin: Optional[Union[PositiveInt, Literal["auto"]]] = Field(
        default=None, description="overrides the top-level thin (an integer or 'auto')")
    options: Dict[str, Any] = Field(default_factory=dict,
                                    description="extra run options passed to fm.sample")

    @field_validator("label")
    @classmethod
    def _label_chars(cls, value):
        if value is not None and not all(c.isalnum() or c in "-_." for c in value):
            raise ValueError("label may contain letters, digits, '-', '_' and '.' only")
        return value

    @property
    def key(self) -> str:
        """The label in reports and output names: ``label``, else ``name`` (the class name of
        an import path ``"package.module:Class"``)."""
        return self.label or self.name.rpartition(":")[2]


class ReferenceSection(_Strict):
    method: Literal["auto", "exact", "nuts", "none"] = "auto"
    num_samples: int = Field(default=2000, ge=1)
    num_warmup: int = Field(default=1000, ge=1)
    chains: int = Field(default=2, ge=1)
    seed: int = 0
    cache: bool = True


class CheckpointSection(_Strict):
    every_chunks: int = Field(default=5, ge=0, description="chunks between checkpoints (0: never)")
    chunk_size: Optional[int] = Field(default=None, ge=1, description="draws per compiled chunk")


class ReportSection(_Strict):
    max_points: int = Field(default=1000, ge=10, description="subsample size for joint W1 and MMD")
    curve_points: int = Field(default=12, ge=2, description="points on the error curves")
    trace_coordinates: int = Field(default=4, ge=1)


class ExperimentConfig(_Strict):
    name: str = "experiment"
    model: ModelSection
    data: DataSection = Field(default_factory=DataSection)
    partition: PartitionSection = Field(default_factory=PartitionSection)
    init: Optional[Any] = Field(default=None, description="initial parameters (default: the model's)")
    algorithms: List[AlgorithmSection] = Field(min_length=1)
    num_samples: int = Field(ge=1)
    burn_in: Union[NonNegativeInt, Literal["auto"]] = Field(
        default=0, description="draws discarded, or 'auto' (from the predicted relaxation time)")
    thin: Union[PositiveInt, Literal["auto"]] = Field(
        default=1, description="iterations per draw, or 'auto' (one predicted relaxation time)")
    max_iterations: Optional[PositiveInt] = Field(
        default=None, description="iterations per chain an 'auto' setting may plan")
    chains: int = Field(default=1, ge=1)
    seed: int = 0
    engine: str = "local"
    reference: ReferenceSection = Field(default_factory=ReferenceSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    report: ReportSection = Field(default_factory=ReportSection)

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, value):
        if value not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {value!r}")
        return value

    @model_validator(mode="after")
    def _unique_labels(self):
        seen = {}
        for index, algorithm in enumerate(self.algorithms):
            label = algorithm.key
            if label in seen:
                raise ValueError(
                    f"algorithms.{index}.label: {label!r} is used by algorithms.{seen[label]} "
                    "too; give each run a unique label"
                )
            seen[label] = index
        return self

    def labels(self) -> List[str]:
        return [a.key for a in self.algorithms]


def _format_validation_error(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        elif item["type"] == "missing":
            message = "required field is missing"
        lines.append(f"  {field}: {message}")
    return "invalid config:\n" + "\n".join(lines)


def parse_config(raw: Any, base_dir: Optional[Path] = None) -> ExperimentConfig:
    """Validate a config mapping; ``ConfigError`` names every bad field."""
    if not isinstance(raw, dict):
        raise ConfigError(
            f"invalid config: expected a mapping of fields at the top level, got {type(raw).__name__}"
        )
    try:
        config = ExperimentConfig.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(_format_validation_error(error)) from None
    config._base_dir = Path(base_dir) if base_dir is not None else Path.cwd()  # type: ignore[attr-defined]
    return config


def load_config(path: Union[str, Path]) -> ExperimentConfig:
    """Read and validate a YAML config file."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    return parse_config(raw, base_dir=path.resolve().parent)


# ---------------------------------------------------------------- resolution


class Experiment:
    """A resolved config: model, federation, init and algorithm instances."""

    def __init__(self, config, model, federation, init, algorithms, model_source, data_source):
        self.config = config
        self.model = model
        self.federation = federation
        self.init = init
        self.algorithms = algorithms  # list of (label, AlgorithmSection, instance)
        self.model_source = model_source
        self.data_source = data_source

    def resolved(self) -> dict:
        """The config with every default filled in, plus what the names resolved to (JSON)."""
        out = self.config.model_dump(mode="json")
        out["resolved"] = {
            "model_source": self.model_source,
            "data_source": self.data_source,
            "num_clients": int(self.federation.num_clients),
            "client_sizes": [int(s) for s in self.federation.sizes],
            "client_weights": [float(w) for w in self.federation.weights],
            "dim": int(np.asarray(_ravel(self.init)).shape[0]),
            "algorithms": {label: repr(instance) for label, _, instance in self.algorithms},
        }
        return out

    def run_hash(self, label: str) -> str:
        """Hash of everything that determines the draws of the run ``label``."""
        config = self.config
        section = next(a for a in config.algorithms if a.key == label)
        payload = {
            "model": config.model.model_dump(mode="json"),
            "data": config.data.model_dump(mode="json"),
            "partition": config.partition.model_dump(mode="json"),
            "init": config.init,
            "algorithm": section.model_dump(mode="json"),
            "sampling": [config.num_samples, config.burn_in, config.thin, config.chains,
                         config.seed, config.engine, config.checkpoint.chunk_size]
            + ([config.max_iterations] if config.max_iterations is not None else []),
            "data_digest": _data_digest(self.federation),
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _ravel(tree):
    from jax.flatten_util import ravel_pytree

    return ravel_pytree(tree)[0]


def _data_digest(federation) -> str:
    import jax

    digest = hashlib.sha256()
    for client in federation.clients:
        for leaf in jax.tree_util.tree_leaves(client):
            digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return digest.hexdigest()[:16]


def _handoff_algorithm_of(protocol_class):
    """``params -> fm.HandoffAlgorithm(protocol_class(**params))``: a protocol class named in a
    config, built as an algorithm would be."""
    from .handoff_algorithm import HandoffAlgorithm

    def build(**params):
        return HandoffAlgorithm(protocol_class(**params))

    build.__name__ = protocol_class.__name__
    return build


def resolve_algorithm_class(name: str, field: str = "algorithms.name"):
    """The algorithm class ``name``: a class on the ``fedmcmc`` namespace, or the import path
    ``"package.module:Class"`` of an :class:`~fedmcmc.algorithm.Algorithm` subclass defined
    outside the package, or of a :class:`~fedmcmc.protocols.HandoffProtocol` subclass (then a
    function building ``fm.HandoffAlgorithm(Class(**params))``); ``ConfigError`` names
    ``field`` and lists what exists."""
    import fedmcmc as fm

    if ":" in name:
        module_name, _, class_name = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # noqa: BLE001 - ImportError, or an error inside the module
            raise ConfigError(f"{field}: cannot import {module_name!r} "
                              f"({type(error).__name__}: {error})") from None
        cls = getattr(module, class_name, None)
        if inspect.isclass(cls) and issubclass(cls, HandoffProtocol):
            # a hand-off protocol of one's own: params are its constructor's
            return _handoff_algorithm_of(cls)
        if not (inspect.isclass(cls) and issubclass(cls, Algorithm)):
            raise ConfigError(f"{field}: {module_name!r} has no fedmcmc.algorithm.Algorithm "
                              f"or fedmcmc.protocols.HandoffProtocol subclass {class_name!r}")
        return cls
    available = sorted(
        n for n in dir(fm)
        if inspect.isclass(getattr(fm, n)) and issubclass(getattr(fm, n), Algorithm)
        and getattr(fm, n) is not Algorithm
    )
    cls = getattr(fm, name, None)
    if not (inspect.isclass(cls) and issubclass(cls, Algorithm)):
        raise ConfigError(
            f"{field}: unknown algorithm {name!r}; available: {', '.join(available)} "
            "(or an import path 'package.module:Class')"
        )
    return cls


def _zoo_lookup(name: str):
    """(builder, known names) from the model zoo :mod:`fedmcmc.models`; builder None if
    ``name`` is not one of its names."""
    from . import models as zoo

    try:
        return zoo.builder(name), zoo.names()
    except ValueError:
        return None, zoo.names()


def _zoo_generator(name: str):
    """The zoo's synthetic data generator for ``name`` (:func:`fedmcmc.models.data_generator`),
    or None: ``generate(model_params, num_examples=, seed=, **options)``."""
    from . import models as zoo

    return zoo.data_generator(name)


def _call_factory(factory, params: dict, data, field: str):
    kwargs = dict(params)
    if data is not None:
        try:
            accepts_data = "data" in inspect.signature(factory).parameters
        except (TypeError, ValueError):
            accepts_data = False
        if accepts_data:
            kwargs["data"] = data
    try:
        return factory(**kwargs)
    except TypeError as error:
        raise ConfigError(f"{field}: {error}") from None
    except ValueError as error:
        raise ConfigError(f"{field}: {error}") from None


def _split_factory_output(value, field: str):
    if isinstance(value, Model):
        return value, None, None
    if isinstance(value, tuple) and 2 <= len(value) <= 3 and isinstance(value[0], Model):
        return value[0], value[1], (value[2] if len(value) == 3 else None)
    raise ConfigError(
        f"{field}: the model factory must return a fedmcmc.Model, (model, data) or "
        f"(model, data, init); got {type(value).__name__}"
    )


def _load_data_file(section: DataSection, base_dir: Path):
    path = Path(section.path).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    if not path.is_file():
        raise ConfigError(f"data.path: data file not found: {path}")
    suffix = path.suffix.lower()
    try:
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as archive:
                arrays = {k: archive[k] for k in archive.files}
            if not arrays:
                raise ConfigError(f"data.path: {path} holds no arrays")
            return (next(iter(arrays.values())) if len(arrays) == 1 else arrays), str(path)
        if suffix == ".npy":
            return np.load(path, allow_pickle=False), str(path)
        if suffix == ".csv":
            return _load_csv(path, section.columns), str(path)
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - unreadable file: name it
        raise ConfigError(f"data.path: cannot read {path}: {error}") from None
    raise ConfigError(f"data.path: unsupported file type {suffix!r} (use .npz, .npy or .csv)")


def _load_csv(path: Path, columns):
    table = np.genfromtxt(path, delimiter=",", names=True, dtype=np.float64, encoding="utf-8")
    header = list(table.dtype.names or [])
    if table.ndim == 0:
        table = table.reshape(1)
    if columns is None:
        return np.stack([table[c] for c in header], axis=1)
    out = {}
    for leaf, wanted in columns.items():
        names = [wanted] if isinstance(wanted, str) else list(wanted)
        for column in names:
            if column not in header:
                raise ConfigError(
                    f"data.columns.{leaf}: column {column!r} is not in {path.name} "
                    f"(columns: {', '.join(header)})"
                )
        out[leaf] = table[names[0]] if isinstance(wanted, str) else np.stack(
            [table[c] for c in names], axis=1
        )
    return out


def _cast(tree, dtype):
    import jax

    def cast(leaf):
        leaf = np.asarray(leaf)
        return leaf.astype(dtype) if np.issubdtype(leaf.dtype, np.floating) else leaf

    return jax.tree_util.tree_map(cast, tree)


#: names in fedmcmc.partition.__all__ that are not splits of one data set
_NOT_PARTITIONS = {"from_indices", "delayed_communication_data"}


def _partition(data, section: PartitionSection):
    try:
        module = importlib.import_module("fedmcmc.partition")
    except ImportError:
        module = None
    weights = section.weights
    allowed = [n for n in getattr(module, "__all__", []) if n not in _NOT_PARTITIONS] if module else []
    function = getattr(module, section.method, None) if section.method in allowed else None
    if function is None or not callable(function):
        if section.method != "iid":
            available = sorted(allowed) if module is not None else ["iid"]
            raise ConfigError(
                f"partition.method: unknown partition {section.method!r}; available: "
                f"{', '.join(available)}"
            )
        # Minimal fallback: a seeded random split into near-equal clients.
        if section.num_clients is None:
            raise ConfigError("partition.num_clients: required by the iid partition")
        n = int(np.asarray(__import__("jax").tree_util.tree_leaves(data)[0]).shape[0])
        if section.num_clients > n:
            raise ConfigError(f"partition.num_clients={section.num_clients} exceeds the {n} examples")
        order = np.random.default_rng(section.seed).permutation(n)
        parts = np.array_split(order, section.num_clients)
        import jax

        clients = [jax.tree_util.tree_map(lambda leaf, p=p: np.asarray(leaf)[p], data) for p in parts]
        if weights == "uniform":
            weights = [1.0 / len(clients)] * len(clients)
        return Federation(clients, weights=weights)
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        parameters = {}
    kwargs = dict(section.options)
    if "seed" in parameters:
        kwargs.setdefault("seed", section.seed)
    if weights is not None:
        kwargs["weights"] = weights
    if "num_clients" in parameters:
        if section.num_clients is not None:
            kwargs["num_clients"] = section.num_clients
    elif "num_clients" in section.model_fields_set and section.num_clients is not None:
        raise ConfigError(
            f"partition.num_clients: partition method {section.method!r} does not take "
            "num_clients (the number of clients follows from its options)"
        )
    try:
        return function(data, **kwargs)
    except TypeError as error:
        raise ConfigError(f"partition ({section.method}): {error}") from None
    except ValueError as error:
        raise ConfigError(f"partition ({section.method}): {error}") from None


def _init_from(value):
    """Initial parameters from a config value or a model's ``init`` (a pytree or ``key -> params``).

    Lists of numbers are arrays (``[0.0, 1.0]`` is one leaf of shape (2,)); dicts map names
    to leaves; floating-point leaves become float32 like the rest of the library.
    """
    import jax
    import jax.numpy as jnp

    if callable(value):
        value = value(jax.random.key(0))

    def convert(node):
        if isinstance(node, dict):
            return {k: convert(v) for k, v in node.items()}
        if isinstance(node, (list, tuple)) and not all(
            isinstance(x, (int, float, list, tuple)) and not isinstance(x, bool) for x in node
        ):
            return type(node)(convert(v) for v in node)
        array = jnp.asarray(node)
        if jnp.issubdtype(array.dtype, jnp.integer) or jnp.issubdtype(array.dtype, jnp.floating):
            array = array.astype(jnp.float32)
        return array

    if isinstance(value, (dict, list, tuple, int, float)) and not isinstance(value, bool):
        return convert(value)
    return jax.tree_util.tree_map(
        lambda leaf: jnp.asarray(leaf, dtype=jnp.float32)
        if jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.floating) else leaf,
        value,
    )


def build_experiment(config: ExperimentConfig) -> Experiment:
    """Resolve a validated config into model, federation, init and algorithm instances."""
    base_dir = getattr(config, "_base_dir", Path.cwd())
    name = config.model.name
    params = dict(config.model.params)

    # Algorithms first: a typo there should not wait for data loading.
    algorithms = []
    for index, section in enumerate(config.algorithms):
        cls = resolve_algorithm_class(section.name, field=f"algorithms.{index}.name")
        try:
            instance = cls(**section.params)
        except TypeError as error:
            raise ConfigError(f"algorithms.{index}.params ({section.name}): {error}") from None
        except ValueError as error:
            raise ConfigError(f"algorithms.{index}.params ({section.name}): {error}") from None
        algorithms.append((section.key, section, instance))

    file_data = None
    data_source = None
    if config.data.path is not None:
        file_data, data_source = _load_data_file(config.data, base_dir)

    generator = None
    if ":" in name:
        module_name, _, function_name = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # noqa: BLE001 - ImportError, or an error inside the module
            raise ConfigError(
                f"model.name: cannot import {module_name!r} ({type(error).__name__}: {error})"
            ) from None
        factory = getattr(module, function_name, None)
        if not callable(factory):
            raise ConfigError(f"model.name: {module_name!r} has no function {function_name!r}")
        model_source = f"import:{name}"
    else:
        factory, zoo_names = _zoo_lookup(name)
        if factory is None:
            raise ConfigError(
                f"model.name: unknown model {name!r}; available: {', '.join(zoo_names)} "
                "(or an import path 'package.module:function')"
            )
        model_source = f"fedmcmc.models:{name}"
        generator = _zoo_generator(name)

    model, data, init = _split_factory_output(
        _call_factory(factory, params, file_data, "model.params"), "model.name"
    )
    if file_data is not None and data is None:
        data = file_data
    if data is None:
        if config.data.generate or generator is not None:
            if generator is None:
                raise ConfigError(
                    f"data.generate: model {name!r} has no data generator in the zoo; give data.path"
                )
            try:
                data = generator(params, **config.data.generate)
            except TypeError as error:
                raise ConfigError(f"data.generate: {error}") from None
            data_source = f"generated:{name}"
        else:
            raise ConfigError(
                f"data.path: model {name!r} does not generate data; give data.path (.npz, .npy or .csv)"
            )
    elif data_source is None:
        data_source = f"model:{name}"

    if isinstance(data, Federation):
        federation = data
    else:
        data = _cast(data, np.float32 if config.data.dtype == "float32" else np.float64)
        federation = _partition(data, config.partition)

    if config.init is not None:
        init = config.init
        if isinstance(init, (int, float)) and model.attributes.get("init") is not None:
            template = _init_from(model.attributes["init"])
            import jax

            init = jax.tree_util.tree_map(lambda leaf: np.full(np.shape(leaf), float(config.init)), template)
    if init is None:
        init = model.attributes.get("init")
    if init is None:
        raise ConfigError(
            f"init: model {name!r} carries no initial parameters; set init in the config"
        )
    init = _init_from(init)
    try:
        model.check_params(init, federation.example(), argument="init")
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return Experiment(config, model, federation, init, algorithms, model_source, data_source)
