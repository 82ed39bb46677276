"""The GPU tests run everywhere: on CuPy where a CUDA device is present, and otherwise on array_api_strict's
non-default device as a stand-in (an array that strays to the host device, or any operation outside the
array API standard, fails there as it would on a GPU). Only the tests that need CUDA itself are skipped on
the stand-in (they carry the ``cuda`` marker)."""

import os
import pathlib
import sys

import numpy as np
import pytest

# tests/array_counting.py (the counting namespace) is shared with the CPU tests; pytest puts tests/ on the
# path only when it collects tests/ too
_TESTS = str(pathlib.Path(__file__).resolve().parents[1] / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)


def _cuda_available():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


CUDA = _cuda_available()


class Device:
    """Where the tests compute: ``xp`` (the namespace), ``put`` (a NumPy array onto the device), ``name``."""

    def __init__(self):
        if CUDA:
            import array_api_compat.cupy as xp

            self.xp, self.device, self.name = xp, None, "cupy"
        else:
            import array_api_strict as xp

            self.xp, self.device, self.name = xp, xp.Device("device1"), "array_api_strict device1 (stand-in)"

    def put(self, value):
        return self.xp.asarray(np.asarray(value), device=self.device)

    def counting(self, **options):
        """A ``CountingNamespace`` over this device's namespace (``options``: its ``m``, ``rows``, ...): every
        array operation, host conversion and data-dependent shape of what runs on it is recorded."""
        from array_counting import CountingNamespace

        return CountingNamespace(self.xp, **options)

    def put_counted(self, namespace, value):
        """A NumPy array onto this device as an array of the counting ``namespace``."""
        return namespace.asarray(np.asarray(value), device=self.device)

    def on_device(self, array):
        from array_counting import CountingArray

        from agpc.backend import array_device, array_namespace

        if isinstance(array, CountingArray):
            return self.device is None or array.device == self.device
        return array_namespace(array).__name__ == self.xp.__name__ and (
            self.device is None or array_device(array) == self.device)


@pytest.fixture
def gpu():
    return Device()


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs CuPy with a CUDA device (skipped on the stand-in)")
    if os.environ.get("AGPC_REQUIRE_CUDA") and not CUDA:  # (gpu_tests/run_on_gpu.sh: a GPU run must be one)
        raise pytest.UsageError("AGPC_REQUIRE_CUDA is set but CuPy finds no CUDA device: these tests would run on "
                                "the mock and the stand-in only")


def pytest_collection_modifyitems(config, items):
    if CUDA:
        return
    skip = pytest.mark.skip(reason="needs CuPy with a CUDA device; the other GPU tests ran on the stand-in")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
