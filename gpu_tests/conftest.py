"""CuPy tests: the same checks as tests/ on a CUDA device. Skipped cleanly where CuPy or CUDA is absent."""

import pytest


def _cuda_available():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="CuPy with a CUDA device is not available on this machine")
    for item in items:
        item.add_marker(skip)
