"""CUDA-graph replay of a training step is gone: CuPy 14 refuses every cuBLAS and cuSOLVER call during stream capture
(``cublas.setStream`` / ``cusolver.setStream`` raise NotImplementedError while a stream is capturing), and every step
multiplies and factorises, so a captured step could never run. ``step_replay`` is deprecated: it warns and changes
nothing. (gpu_tests/run_on_gpu.sh re-checks the refusal on a real GPU.)"""

import importlib.util
import inspect

import numpy as np
import pytest

from agpc import GPClassifier
from agpc.datasets import make_banana
from agpc.inference import engines, training


def test_step_replay_warns_that_it_is_deprecated_and_changes_nothing():
    X, y = make_banana(120, random_state=0)
    options = dict(method="sep", batch_size=40, n_inducing=8, max_iter=2, random_state=0)
    with pytest.warns(FutureWarning, match="step_replay is deprecated"):
        replayed = GPClassifier(step_replay=True, **options).fit(X, y)
    plain = GPClassifier(**options).fit(X, y)
    np.testing.assert_array_equal(replayed.inducing_points_, plain.inducing_points_)
    assert replayed.history_["log_marginal_likelihood"] == plain.history_["log_marginal_likelihood"]


def test_the_replay_module_and_its_training_option_are_gone():
    assert importlib.util.find_spec("agpc.inference.replay") is None
    assert "step_replay" not in inspect.signature(training.train).parameters
    assert not hasattr(training.Trainer(engines.make_engine("sep", *_tiny_model(), n_total=10,
                                                            minibatch=True)), "replayed")


def _tiny_model():
    from agpc.kernels import RBF

    X = np.random.default_rng(0).normal(size=(10, 2))
    return RBF(lengthscales=[1.0, 1.0]).for_inputs(X), X[:3]
