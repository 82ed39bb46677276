"""One fit's plan: the estimator's parameters, checked, and what they resolve to for the data, as one frozen value.

``GPClassifier.fit`` and ``partial_fit`` make a :class:`FitPlan` from ``get_params()`` once the parameter table has
accepted them (``FitPlan.of``), and every helper of the fit's front half (the input checks, the placement of the
rows, the size and batch rules, ordinal labels, the stream) reads the plan, never the estimator: the estimator alone
writes its fitted ``*_`` attributes, from what the helpers return. What the rows decide of the training is resolved
once, where they are first counted (``FitPlan.steps``: the rows a step takes and whether the fit steps on
minibatches), and handed to the helpers that need it as a :class:`Steps`, instead of made again from raw parameters
by each of them; the plan itself holds nothing of the data.

The module sits below the input checks (``agpc.inputs``) and reads only the method registry, the parameter types
and the batch rule (pyproject.toml, the layers).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Any, NamedTuple

from . import validation as V
from .batch_size import binary_on_host, rows_per_step
from .likelihoods import likelihood_by_name
from .methods import ORDINAL, Method, asks_shared_lengthscales, get_method

__all__ = ["DTYPES", "dtype_name", "FitPlan", "Steps"]

DTYPES = ("float64", "float32")  # the floating types a model computes in (``dtype``)


def dtype_name(dtype):
    """``dtype`` spelled as one of ``DTYPES`` (checked by the parameter table; NumPy spellings such as
    np.float32 or "f4" are accepted)."""
    name = V.FloatingType.name_of(dtype)
    if name not in DTYPES:
        raise ValueError(f"dtype must be 'float64' or 'float32', got {dtype!r}")
    return name


class Steps(NamedTuple):
    """What a fit's rows decide of its steps (``FitPlan.steps``), resolved once for every helper that asks."""

    n_rows: int  # the training rows, as given (those of weight 0 too)
    step_rows: int | None  # rows a step on the host's rule (None: the full batch; a GPU's: ``placement``)

    @property
    def minibatch(self):
        """Whether the fit steps on minibatches (fewer rows a step than it has)."""
        return self.step_rows is not None and self.step_rows < self.n_rows


@dataclass(frozen=True, eq=False)
class FitPlan:
    """What one fit (or one ``partial_fit`` call) is asked to do: the estimator's parameters that its helpers read
    (their meanings: ``GPClassifier``'s docstring), ``dtype`` spelled as one of ``DTYPES``, the estimator's name for
    messages and the feature count a fitted model expects (``n_features``; None for a fit from scratch)."""

    estimator_name: str
    method: str
    likelihood: str | None
    dtype: str
    kernel: Any = None
    n_inducing: Any = "auto"
    inducing: Any = "auto"
    ard: Any = "auto"
    kernel_prior: Any = "auto"
    classes: Any = None
    class_weight: Any = None
    random_state: Any = None
    batch_size: Any = "auto"
    block_rows: Any = None
    n_jobs: Any = None
    blas_threads: Any = None
    local_steps: Any = None
    client: Any = None
    site_directory: Any = None
    checkpoint_path: Any = None
    checkpoint_every: Any = None
    shuffle: bool = True
    damping: Any = None
    optimizer: Any = None
    learning_rate: Any = None
    n_quadrature: int = 20
    early_stopping: Any = False
    validation_fraction: float = 0.1
    n_features: int | None = None  # a fitted model's feature count (partial_fit continuing it)
    categorical_features: Any = "from_dtype"
    # the fit's rows are in memory on the host and hold two classes (``for_rows``): what ``batch_size="auto"`` may
    # take in full batch steps depends on it (``batch_size.full_batch_max_rows``)
    binary_on_host: bool = False

    @classmethod
    def of(cls, estimator_name, params, n_features=None):
        """The plan of an estimator named ``estimator_name`` with the parameters ``params`` (``get_params()``,
        accepted by its parameter table); ``n_features``: the feature count of the model it continues."""
        names = {f.name for f in fields(cls)} - {"estimator_name", "n_features", "binary_on_host"}
        given = {name: params[name] for name in names if name in params}
        given["dtype"] = dtype_name(params.get("dtype", "float64"))
        given.setdefault("likelihood", None)
        return cls(estimator_name=estimator_name, n_features=n_features, **given)

    def steps(self, n_rows):
        """The :class:`Steps` of this plan's fit of ``n_rows`` rows: the rows its steps take
        (``batch_size.rows_per_step`` on the host's rule; None, the full batch), resolved here once."""
        return Steps(int(n_rows), rows_per_step(self, int(n_rows)))

    def for_rows(self, X, y, n_rows, target_xp=None):
        """This plan for a fit of the rows (X, y), ``n_rows`` of them, on ``target_xp`` (None: the rows'
        namespace): whether they are ``binary_on_host`` (``batch_size.binary_on_host``), which every helper that
        asks for the plan's ``steps`` then reads."""
        return replace(self, binary_on_host=binary_on_host(self, X, y, n_rows, target_xp))

    def with_features(self, n_features):
        """This plan for rows of a fitted model of ``n_features`` features (``partial_fit`` continuing it)."""
        return replace(self, n_features=int(n_features))

    @cached_property
    def spec(self) -> Method:
        """The method's registry record (``agpc.methods``)."""
        return get_method(self.method)

    @property
    def ordinal(self):
        """Whether the model's classes are ordered (one latent GP and cut points)."""
        return self.likelihood == ORDINAL

    @property
    def shared_lengthscales(self):
        """Whether ``ard`` asks for one shared lengthscale scale."""
        return asks_shared_lengthscales(self.ard)

    def likelihood_name(self, n_classes):
        """The name of the likelihood of the plan's model of ``n_classes`` classes (``likelihood_`` of the fit)."""
        return self.spec.likelihood_for(self.likelihood, n_classes)

    def engine_likelihood(self, n_classes):
        """The likelihood its engine takes (``EngineOptions.likelihood``): the one latent GP's of a binary or ordinal
        model (a ``likelihoods.Likelihood``, carried as the object so that worker processes need not have it
        registered), None for a model with a latent GP a class (its engine's own)."""
        if n_classes > 2 and not self.ordinal:
            return None
        return likelihood_by_name(self.likelihood_name(n_classes), multiclass=False)

    def latents(self, n_classes):
        """The latent functions of a model of ``n_classes`` classes, counted as the batch rules count them: two for
        a binary or an ordinal model (one latent GP), one a class above."""
        return 2 if self.ordinal else n_classes
