"""GPU memory on the device (CuPy, or the stand-in device; conftest.py), with the free-memory query mocked
(``backend.device_free_bytes``): batch EP walks the row blocks that fit, rows kept on the host reach the device a
block at a time and give the model of rows on the device, and an allocation failure is one BlockMemoryError."""

import numpy as np
import pytest

from agpc import backend as B
from agpc import kernels
from agpc.datasets import make_banana
from agpc.inference import blocks, ep, training
from agpc.kernels import RBF

N_ROWS, N_INDUCING = 400, 10


class OutOfMemoryError(MemoryError):
    """Stands for ``cupy.cuda.memory.OutOfMemoryError`` (a MemoryError subclass)."""


def _problem(gpu):
    X, y = make_banana(N_ROWS, random_state=0)
    X = np.asarray(X, dtype=np.float64)
    y = np.where(np.asarray(y) > 0, 1.0, -1.0)
    Z = gpu.put(X[:N_INDUCING])
    return X, y, Z, RBF([1.0, 1.0], noise=1e-3).for_inputs(Z)


def _mock_free(monkeypatch, gpu, free):
    """The device reports ``free`` bytes, and every pass asks (these passes are below ``blocks.SMALL_PASS_BYTES``)."""
    monkeypatch.setattr(B, "device_free_bytes", lambda namespace, device=None: free if namespace is gpu.xp else None)
    monkeypatch.setattr(blocks, "SMALL_PASS_BYTES", 0)


def _train(X, y, kernel, Z):
    return training.fit(X, y, kernel, Z, method="ep", batch_size=None, max_iter=3, n_warmup=1)


def test_batch_ep_streams_host_rows_in_the_blocks_that_fit(gpu, monkeypatch):
    X, y, Z, kernel = _problem(gpu)
    per_row = blocks.block_bytes_per_row(N_INDUCING, 2, 8)
    _mock_free(monkeypatch, gpu, 2 * 70 * per_row + 5)
    rows = blocks.default_block_rows(Z)
    assert rows == int(B.DEVICE_MEMORY_FRACTION * (2 * 70 * per_row + 5)) // per_row  # 70 rows
    seen = []
    original = ep.batch_block_pass  # (the blocks of a batch EP pass)

    def watching(kernel, X_block, *args, **kwargs):
        seen.append((X_block.shape[0], gpu.on_device(X_block)))
        return original(kernel, X_block, *args, **kwargs)

    monkeypatch.setattr(ep, "batch_block_pass", watching)
    on_device = _train(gpu.put(X), gpu.put(y), kernel, Z)
    device_blocks, seen[:] = list(seen), []
    streamed = _train(B.HostRows(X), y, kernel, Z)
    assert seen == device_blocks and {size for size, _ in seen} == {rows, N_ROWS % rows}
    assert all(on for _, on in seen)  # every block computed on the device
    np.testing.assert_allclose(streamed.log_z, on_device.log_z, rtol=1e-12)
    np.testing.assert_allclose(B.to_numpy(streamed.Z), B.to_numpy(on_device.Z), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(B.to_numpy(streamed.site_precision), B.to_numpy(on_device.site_precision),
                               rtol=1e-12, atol=1e-14)


def test_running_out_of_device_memory_names_the_block_rows(gpu, monkeypatch):
    X, y, Z, kernel = _problem(gpu)
    per_row = blocks.block_bytes_per_row(N_INDUCING, 2, 8)
    _mock_free(monkeypatch, gpu, 2 * 150 * per_row)
    rows = blocks.default_block_rows(Z)
    original = kernels.Stationary.K

    def K(self, A, B_=None, **options):
        if B_ is not None and max(A.shape[0], B_.shape[0]) > rows // 2:  # (batch passes ask for K(Z, X))
            raise OutOfMemoryError("out of memory to allocate (mocked)")
        return original(self, A, B_, **options)

    monkeypatch.setattr(kernels.Stationary, "K", K)
    with pytest.raises(B.BlockMemoryError, match=f"ep training step ran out of memory with row blocks of {rows} rows"
                       rf".*block_rows={rows // 4}"):
        _train(B.HostRows(X), y, kernel, Z)
