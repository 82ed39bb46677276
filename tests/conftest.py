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
