"""Shared fixtures: every core routine is tested on NumPy and on array_api_strict.

array_api_strict rejects anything outside the array API standard, so a routine that passes on it runs on
any conforming library (CuPy included). The "strict-device1" variant puts the data on one of
array_api_strict's non-default devices: every array the library creates must follow its input there.
"""

import os

import array_api_compat.numpy as np_xp
import array_api_strict
import numpy as np
import pytest
from numpy.lib import format as npy_format

NAMESPACES = {
    "numpy": (np_xp, None),
    "strict": (array_api_strict, None),
    "strict-device1": (array_api_strict, array_api_strict.Device("device1")),
}


@pytest.fixture(params=list(NAMESPACES))
def xp_device(request):
    return NAMESPACES[request.param]


def to_xp(value, xp, device=None):
    return xp.asarray(np.asarray(value, dtype=np.float64), device=device)


def to_np(value):
    from agpc.backend import to_numpy

    return np.asarray(to_numpy(value))


def central_differences(f, base, h=1e-6):
    """Central finite differences of the scalar f at every entry of the NumPy array ``base``."""
    base = np.asarray(base, dtype=np.float64)
    numeric = np.zeros(base.shape)
    for idx in np.ndindex(base.shape):
        plus, minus = base.copy(), base.copy()
        plus[idx] += h
        minus[idx] -= h
        numeric[idx] = (f(plus) - f(minus)) / (2 * h)
    return numeric


def check_parameter_gradients(kernel, grads, Z, objective, xp, device, rtol, atol):
    """Compare analytic gradients for every kernel parameter and every entry of Z with finite
    differences of ``objective(kernel, Z)``."""
    for name, value in kernel.params.items():
        numeric = central_differences(
            lambda p: objective(kernel.with_params({**kernel.params, name: to_xp(p, xp, device)}), Z), to_np(value)
        )
        np.testing.assert_allclose(to_np(grads[name]), numeric, rtol=rtol, atol=atol, err_msg=name)
    numeric = central_differences(lambda z: objective(kernel, to_xp(z, xp, device)), to_np(Z))
    np.testing.assert_allclose(to_np(grads["Z"]), numeric, rtol=rtol, atol=atol, err_msg="Z")


@pytest.fixture
def members_read(monkeypatch):
    """The names of the zip members whose data NumPy reads (inflates): a reader that refuses a file from what it
    declares leaves this empty."""
    read, real = [], npy_format.read_array

    def recording(fh, *args, **kwargs):
        read.append(os.path.basename(getattr(fh, "name", "?")))
        return real(fh, *args, **kwargs)

    monkeypatch.setattr(npy_format, "read_array", recording)
    return read


@pytest.fixture
def no_training(monkeypatch):
    """Training steps that fail the test: what is checked at the start of fit must be checked before them."""
    from agpc.inference import training

    def step(self, *args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(training.Trainer, "step", step)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A small binary model saved by this agpc, and its header and arrays as written (the model file tests
    rewrite them into crafted files)."""
    import json

    from agpc import GPClassifier, checkpoints
    from agpc.datasets import make_banana

    X, y = make_banana(120, random_state=3)
    path = tmp_path_factory.mktemp("model") / "banana.agpc"
    GPClassifier(n_inducing=5, max_iter=3, random_state=0).fit(X, y).save(path)
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    header = json.loads(str(arrays.pop(checkpoints.HEADER_KEY)))
    return path, header, arrays
