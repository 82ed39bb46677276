"""Row blocks sized to the device's free memory, host data streamed to the device, and running out of memory
as one clear error (issue 17 item 5). No GPU here: the free-memory query and the allocation failure are mocked
(``backend.device_free_bytes``; a MemoryError subclass standing for CuPy's OutOfMemoryError)."""

import sys
import tracemalloc
import types

import array_api_compat.numpy as xp
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import agpc.backend as B
from agpc import GPClassifier, inputs, kernels, size_rule
from agpc.inference import blocks, ep, gfitc, multiclass_ep, multiclass_vi, variational
from agpc.kernels import RBF, ClassKernels
from helpers import plan_of


class OutOfMemoryError(MemoryError):
    """Stands for ``cupy.cuda.memory.OutOfMemoryError`` (a MemoryError subclass in CuPy)."""


def _free_bytes(monkeypatch, free):
    """Make every namespace report ``free`` bytes of free device memory, and every pass ask for it (however few
    its rows: the passes of these tests are small)."""
    monkeypatch.setattr(B, "device_free_bytes", lambda namespace, device=None: free)
    monkeypatch.setattr(blocks, "SMALL_PASS_BYTES", 0)


def _data(n, d, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    return X, np.where(X[:, 0] * X[:, -1] > 0, 1.0, -1.0)


@pytest.mark.parametrize("m, d, classes", [(20, 3, 1), (50, 10, 1), (30, 4, 3)])
def test_default_block_rows_is_what_fits_in_half_the_free_memory(monkeypatch, m, d, classes):
    rng = np.random.default_rng(1)
    Z = xp.asarray(rng.normal(size=(classes, m, d)) if classes > 1 else rng.normal(size=(m, d)))
    today = blocks.default_block_rows(Z)  # NumPy: no limit from the device, the 16 MB rule
    assert today == max(1024 if classes == 1 else 256, blocks.BLOCK_ELEMENTS // (m * classes))
    per_row = 8 * (classes * blocks.BLOCK_MATRICES * m + blocks.BLOCK_FEATURE_COPIES * d + blocks.BLOCK_VECTORS)
    assert blocks.block_bytes_per_row(m, d, 8, classes) == per_row
    for free in (10 * per_row, 300 * per_row + 7, 10**12):
        _free_bytes(monkeypatch, free)
        expected = min(today, int(B.DEVICE_MEMORY_FRACTION * free) // per_row)
        assert blocks.default_block_rows(Z) == expected
    _free_bytes(monkeypatch, 0)
    assert blocks.default_block_rows(Z) == 1  # never an empty block


def test_float32_rows_take_half_the_bytes(monkeypatch):
    Z = xp.asarray(np.random.default_rng(2).normal(size=(40, 5)))
    per_row = blocks.block_bytes_per_row(40, 5, 8)
    _free_bytes(monkeypatch, 1000 * per_row)
    assert blocks.default_block_rows(xp.astype(Z, xp.float32)) == 2 * blocks.default_block_rows(Z)


def test_a_small_pass_does_not_ask_the_device(monkeypatch):
    """A minibatch step's pass (its temporaries below ``SMALL_PASS_BYTES``) is one block with no query of the
    device: no driver call a step."""
    def refuse(namespace, device=None):
        raise AssertionError("the device was asked for its free memory")

    monkeypatch.setattr(B, "device_free_bytes", refuse)
    Z = xp.asarray(np.random.default_rng(7).normal(size=(200, 8)))
    rows = blocks.SMALL_PASS_BYTES // blocks.block_bytes_per_row(200, 8, 8)
    assert (blocks.default_block_rows(Z, rows) == blocks.default_block_rows(Z, 200)
            == max(1024, blocks.BLOCK_ELEMENTS // 200))
    with pytest.raises(AssertionError, match="asked for its free memory"):
        blocks.default_block_rows(Z, rows + 1)


def test_passes_walk_the_blocks_that_fit(monkeypatch):
    """A mocked free memory reaches the pass: its blocks are the rows that fit, and the result is the one-block one."""
    X, y = _data(600, 2)
    Z = xp.asarray(X[:15])
    k = RBF([1.0, 1.0]).for_inputs(Z)
    nu = xp.asarray(np.full(600, 0.2))
    mu = xp.asarray(np.random.default_rng(3).normal(size=600) * 0.1)
    whole = ep.evaluate(k, Z, xp.asarray(X), xp.asarray(y), nu, mu, jitter=1e-6)
    per_row = blocks.block_bytes_per_row(15, 2, 8)
    _free_bytes(monkeypatch, 2 * 97 * per_row)
    seen = []
    original = ep.batch_block_pass

    def counting(kernel, X_block, *args, **kwargs):
        seen.append(X_block.shape[0])
        return original(kernel, X_block, *args, **kwargs)

    monkeypatch.setattr(ep, "batch_block_pass", counting)
    with threadpool_limits(1):  # (blocks on several threads share the rows that fit: blocks.pass_layout)
        blocked = ep.evaluate(k, Z, xp.asarray(X), xp.asarray(y), nu, mu, jitter=1e-6)
    assert seen[0] == 97 and sum(seen) == 600
    np.testing.assert_allclose(float(blocked["log_z"]), float(whole["log_z"]), rtol=1e-12)
    for name in whole["grads"]:
        np.testing.assert_allclose(np.asarray(blocked["grads"][name]), np.asarray(whole["grads"][name]), rtol=1e-9,
                                   atol=1e-12)


def _peak_per_row(run, rows_small, rows_large):
    """tracemalloc's peak growth per added row of a block (NumPy's allocations are traced): the difference of
    two block sizes, so that the m x m algebra, the same for both, drops out."""
    peaks = []
    for rows in (rows_small, rows_large):
        run(rows)  # warm caches (Gauss-Hermite nodes, ...)
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        run(rows)
        peaks.append(tracemalloc.get_traced_memory()[1] - base)
        tracemalloc.stop()
    return (peaks[1] - peaks[0]) / (rows_large - rows_small)


@pytest.mark.parametrize("m, d", [(30, 2), (60, 40)])
def test_bytes_per_row_bound_the_measured_peak_of_every_pass(monkeypatch, m, d):
    """The count of ``blocks.BLOCK_MATRICES`` & co. is an upper bound of what the passes really hold per row."""
    monkeypatch.setattr(blocks, "CACHE_ELEMENTS", 0)  # the sweep's cache of projections is O(n), not per block
    n = 1800
    rng = np.random.default_rng(4)
    X, y = _data(n, d)
    X, y = xp.asarray(X), xp.asarray(y)
    Z = X[:m]
    k = RBF([float(np.sqrt(d))] * d).for_inputs(Z)
    nu = xp.asarray(rng.uniform(0.0, 0.5, size=n))
    mu = xp.asarray(rng.normal(size=n) * 0.1)
    C = 3
    labels = xp.asarray(rng.integers(0, C, size=n).astype(float))
    Zc, kc = xp.stack([Z] * C), ClassKernels([k] * C)
    sites_c = multiclass_ep.zero_sites(n, Zc) + 0.05
    xi = variational.initial_xi(k, Z, X, "jj")
    passes = {
        "ep": (1, lambda b: ep.evaluate(k, Z, X, y, nu, mu, jitter=1e-6, block_rows=b, want_sites=False)),
        "sep": (1, lambda b: ep.evaluate_factor(k, Z, X, y, ep.uniform_factor(Z), cavity="sep", n_total=n,
                                               jitter=1e-6, block_rows=b)),
        "gfitc": (1, lambda b: gfitc.evaluate(k, Z, X, y, nu, mu, jitter=1e-6, block_rows=b)),
        "svi": (1, lambda b: variational.svi_elbo(k, Z, X, y, xp.zeros(m), 0.5 * xp.eye(m), block_rows=b)),
        "vi-jj": (1, lambda b: variational.quadratic_bound(k, Z, X, y, xi, kind="jj", block_rows=b)),
        "multiclass ep": (C, lambda b: multiclass_ep.evaluate(kc, Zc, X, labels, sites_c, sites_c, jitter=1e-6,
                                                               block_rows=b, want_sites=False)),
        "multiclass svi": (C, lambda b: _multiclass_svi(kc, Zc, X, labels, block_rows=b)),
    }
    for name, (classes, run) in passes.items():
        measured = _peak_per_row(run, 300, 900)
        assert 0 < measured <= blocks.block_bytes_per_row(m, d, 8, classes), name


def _multiclass_svi(kernels, Z, X, labels, block_rows=None):
    C, m = Z.shape[0], Z.shape[1]
    chol = xp.stack([0.5 * xp.eye(m, dtype=Z.dtype)] * C)
    return multiclass_vi.svi_elbo_multiclass(kernels, Z, X, labels, xp.zeros((C, m), dtype=Z.dtype), chol,
                                             block_rows=block_rows)


def test_multiclass_svi_blocks_are_sized_for_all_its_classes(monkeypatch):
    """A multiclass SVI pass holds (b, C) marginals and (b, T, C) quadrature arrays: its default blocks are the rows
    whose temporaries for all C classes fit. Sized for one class (2026-12-03), 8,000 rows of 800 classes were one
    block and a fit's step peaked at 10 GB (584 MB with the blocks of all classes), and under a mocked free memory
    the blocks held C times the rows that fit."""
    X, _ = _data(700, 2)
    C, m = 4, 12
    rng = np.random.default_rng(8)
    labels = xp.asarray(rng.integers(0, C, size=700).astype(float))
    X = xp.asarray(X)
    Zc = xp.stack([X[c * m:(c + 1) * m] for c in range(C)])
    kc = ClassKernels([RBF([1.0, 1.0]).for_inputs(Zc[c]) for c in range(C)])
    whole = _multiclass_svi(kc, Zc, X, labels, block_rows=700)
    _free_bytes(monkeypatch, 2 * 61 * blocks.block_bytes_per_row(m, 2, 8, C))
    seen = []
    original = blocks.data_blocks

    def counting(*args, **kwargs):
        for block in original(*args, **kwargs):
            seen.append(block[1] - block[0])
            yield block

    monkeypatch.setattr(blocks, "data_blocks", counting)
    # (on one thread: a block then holds the rows that fit; on k, each of the k blocks in flight a k-th of them)
    monkeypatch.setattr(blocks, "block_workers", lambda like, count: 1)
    blocked = _multiclass_svi(kc, Zc, X, labels)
    assert seen[0] == 61 and sum(seen) == 700
    np.testing.assert_allclose(float(blocked[0]), float(whole[0]), rtol=1e-12)
    for name in whole[1]:
        np.testing.assert_allclose(np.asarray(blocked[1][name]), np.asarray(whole[1][name]), rtol=1e-9, atol=1e-12)


def test_device_free_bytes_of_cupy_is_device_free_plus_pool_free(monkeypatch):
    """The CuPy branch's arithmetic, on a stand-in ``cupy`` module (no GPU here)."""
    class Pool:
        limit = 0

        def free_bytes(self):
            return 300

        def used_bytes(self):
            return 5000

        def get_limit(self):
            return self.limit

    class Device:
        def __init__(self, device_id=None):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    pool = Pool()
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(Device=Device, runtime=types.SimpleNamespace(memGetInfo=lambda: (7000, 16000)))
    cupy.get_default_memory_pool = lambda: pool
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    cupy_namespace = types.ModuleType("array_api_compat.cupy")  # what array-api-compat's is_cupy_namespace checks
    assert B.device_free_bytes(cupy_namespace) == 7000 + 300
    pool.limit = 6000  # a pool limit leaves limit - used
    assert B.device_free_bytes(cupy_namespace) == 6000 - 5000
    assert B.device_free_bytes(xp) is None
    assert B.rows_within_memory(10, xp) is None


def test_host_data_too_large_for_the_device_stream_and_fit_the_same_model(monkeypatch):
    import array_api_strict as strict

    X, y = _data(1500, 2, seed=5)
    options = dict(n_inducing=15, max_iter=4, random_state=0, backend=strict, block_rows=400)
    in_memory = GPClassifier(**options).fit(X, y)
    # X is 1500 x 2 float64 = 24,000 bytes: fits in half of 10^6 bytes, not in half of 40,000
    monkeypatch.setattr(B, "device_free_bytes", lambda namespace, device=None: 40_000 if namespace is strict else None)
    model = GPClassifier(**options)
    assert isinstance(inputs.training_inputs(plan_of(model), X, y, target_xp=B.resolve_backend(strict)).X,
                      B.HostRows)
    moved = []
    original = B.asarray_like

    def watching(x, namespace, device=None, dtype=None):
        if isinstance(x, np.ndarray) and namespace is strict and x.ndim == 2 and x.shape[1] == 2:
            moved.append(x.shape[0])
        return original(x, namespace, device=device, dtype=dtype)

    monkeypatch.setattr(B, "asarray_like", watching)
    model.fit(X, y)
    # the initialisation's sample of rows first (every row of data this small, as in memory), then a block at a time
    assert moved[0] == 1500 and 1 < len(moved) and max(moved[1:]) <= 400
    np.testing.assert_allclose(model.log_marginal_likelihood_, in_memory.log_marginal_likelihood_, rtol=1e-12)
    np.testing.assert_allclose(model.predict_proba(X), in_memory.predict_proba(X), rtol=1e-10, atol=1e-12)


def _failing_above(monkeypatch, rows):
    """K(X, Z) of more than ``rows`` rows fails as a device allocation would."""
    original = kernels.Stationary.K

    def K(self, X, Z=None, **options):
        if Z is not None and max(X.shape[0], Z.shape[0]) > rows:  # (batch passes ask for K(Z, X))
            raise OutOfMemoryError(f"out of memory to allocate {X.shape[0] * Z.shape[0] * 8} bytes")
        return original(self, X, Z, **options)

    monkeypatch.setattr(kernels.Stationary, "K", K)


@pytest.mark.parametrize("method", ["ep", "gfitc", "vi-jj"])
def test_running_out_of_memory_is_one_error_naming_the_block_rows(monkeypatch, method):
    X, y = _data(1200, 2, seed=6)
    options = dict(method=method, n_inducing=10, max_iter=2, random_state=0)
    _failing_above(monkeypatch, 500)
    with pytest.raises(B.BlockMemoryError) as caught:
        GPClassifier(**options).fit(X, y)
    message = str(caught.value)
    assert isinstance(caught.value, MemoryError) and isinstance(caught.value.__cause__, OutOfMemoryError)
    assert method in message and "row blocks of 1200 rows" in message and f"block_rows={1200 // 4}" in message
    model = GPClassifier(block_rows=1200 // 4, **options).fit(X, y)  # the advice works
    assert np.isfinite(model.log_marginal_likelihood_)
    model.set_params(block_rows=None)
    with pytest.raises(B.BlockMemoryError, match="prediction ran out of memory with row blocks of 1200 rows"):
        model.predict_proba(X)


def _many_classes(n=1200, classes=60, d=3, seed=9):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), np.arange(n) % classes


def _floor_of(model, X, classes, on_device=False):
    plan = model._plan()
    steps = plan.steps(X.shape[0])
    size = size_rule.fit_model_size(plan, steps, X.shape[0], classes)
    return size_rule.fit_memory_floor(plan, steps, size, X.shape[1], classes, 8, on_device=on_device)


@pytest.mark.parametrize("method, classes, block_rows", [("ep", 60, None), ("sep", 60, 64), ("svi", 60, None),
                                                          ("svi", 60, 64), ("ep", 2, None)])
def test_the_memory_floor_of_a_fit_is_below_what_it_takes(method, classes, block_rows):
    """``size_rule.fit_memory_floor`` counts what a fit cannot do without: tracemalloc's peak of a real fit (NumPy's
    allocations) is above it, so that a fit is refused only where it could not run."""
    X, y = _many_classes(classes=classes)
    model = GPClassifier(method=method, n_inducing=20, max_iter=1, random_state=0, block_rows=block_rows)
    floor = _floor_of(model, X, classes if classes > 2 else 1)
    assert floor["block"] > 0 and floor["model"] > 0 and (floor["sites"] > 0) == (method == "ep")
    tracemalloc.start()
    try:
        model.fit(X, y)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sum(floor.values()) <= peak


@pytest.mark.parametrize("on_device", [False, True])
def test_a_fit_that_cannot_fit_in_memory_is_refused_before_its_model_is_built(monkeypatch, on_device):
    """Many classes times many inducing points: one MemoryError naming the rows, classes and inducing points, the
    bytes it needs and has, before k-means starts the model (the audit's 10,000 classes ran two minutes into the
    first pass before the allocator refused it)."""
    X, y = _many_classes()
    model = GPClassifier(n_inducing=20, max_iter=1, random_state=0)
    need = sum(_floor_of(model, X, 60, on_device).values())
    host, device = (10**12, need - 1) if on_device else (need - 1, None)
    monkeypatch.setattr(size_rule, "available_memory", lambda: host)
    monkeypatch.setattr(size_rule, "device_free_bytes", lambda namespace, device_=None: device)

    def unreached(*args, **kwargs):
        raise AssertionError("the model was started")

    monkeypatch.setattr(GPClassifier, "_initial_model", unreached)
    with pytest.raises(MemoryError) as caught:
        model.fit(X, y)
    message = str(caught.value)
    assert "1,200 rows of 60 classes with 20 inducing points" in message and "n_inducing" in message
    assert ("free on the device" in message) == on_device
    monkeypatch.setattr(size_rule, "device_free_bytes", lambda namespace, device_=None: None if device is None
                        else need)
    monkeypatch.setattr(size_rule, "available_memory", lambda: need if device is None else 10**12)
    with pytest.raises(AssertionError, match="the model was started"):  # (with the bytes it needs, it goes on)
        model.fit(X, y)


def test_kmeans_holds_a_blocks_distances_not_every_rows(monkeypatch):
    """k-means's search for each row's nearest centre holds one block's row-to-centre distances at a time
    (``inducing.KMEANS_BLOCK_ELEMENTS``): the same centres as the search of all the rows at once, and a peak that does
    not grow with the rows. Whole (before 2026-12-04), 20,000 rows and 200 centres held two 32 MB temporaries, and
    each iteration took 18 ms where a block's distances, in the cache, take 5."""
    from agpc import inducing

    X, _ = _data(6000, 4, seed=3)
    monkeypatch.setattr(inducing, "KMEANS_BLOCK_ELEMENTS", 40 * 50)  # (blocks of 40 rows for 50 centres)
    peaks, centres = [], []
    for n in (3000, 6000):
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        centres.append(inducing.kmeans(X[:n], 50, random_state=0, n_iter=3))
        peaks.append(tracemalloc.get_traced_memory()[1] - base)
        tracemalloc.stop()
    monkeypatch.setattr(inducing, "KMEANS_BLOCK_ELEMENTS", 10 ** 9)  # (one block: every row at once)
    np.testing.assert_array_equal(centres[1], inducing.kmeans(X, 50, random_state=0, n_iter=3))
    distances_of_the_rows = 8 * 3000 * 50  # (what 3,000 more rows' distances would add to the peak)
    assert peaks[1] - peaks[0] < distances_of_the_rows / 2
