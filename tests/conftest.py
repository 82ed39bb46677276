"""Shared fixtures: every core routine is tested on NumPy and on array_api_strict.

array_api_strict rejects anything outside the array API standard, so a routine that passes on it runs on
any conforming library (CuPy included). The "strict-device1" variant puts the data on one of
array_api_strict's non-default devices: every array the library creates must follow its input there.
"""

import array_api_compat.numpy as np_xp
import array_api_strict
import numpy as np
import pytest

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
