"""The minibatch ``batch_size="auto"`` picks on a GPU (docs/gpu.md): device properties mocked (tests/cupy_mock.py),
the step's launches, flops and bytes counted (tests/step_cost.py)."""

import math

import numpy as np
import pytest
from array_counting import CountingNamespace
from cupy_mock import A100_PROPERTIES, H100_PROPERTIES, RTX4090_PROPERTIES, MockCupy
from step_cost import StepCost, step_cost

from agpc import GPClassifier
from agpc import backend as B
from agpc.inference import engines, tied_steps, training
from agpc.kernels import RBF
from agpc.methods import gpu_step_model

# NVIDIA's data sheets: vector FP32 and FP64 Tflop/s, memory TB/s
DATA_SHEETS = {"H100": (H100_PROPERTIES, 67.0, 34.0, 3.35), "A100": (A100_PROPERTIES, 19.5, 9.7, 2.04),
               "RTX 4090": (RTX4090_PROPERTIES, 82.6, 1.29, 1.01)}


@pytest.mark.parametrize("device", list(DATA_SHEETS))
def test_device_throughput_from_properties_matches_the_data_sheets(monkeypatch, device):
    properties, fp32, fp64, bandwidth = DATA_SHEETS[device]
    mock = MockCupy(monkeypatch, properties=properties)
    single, double = B.device_throughput(mock.xp, "float32"), B.device_throughput(mock.xp, np.float64)
    assert single.flops / 1e12 == pytest.approx(fp32, rel=0.02)
    assert double.flops / 1e12 == pytest.approx(fp64, rel=0.02)
    assert double.bytes / 1e12 == pytest.approx(bandwidth, rel=0.03)
    assert B.device_throughput(B.resolve_backend("numpy"), "float64") is None


def _counted_step(namespace, m, rows, method, put, block_rows=None):
    """What one minibatch step of ``method`` asks of the mocked device, after one warm-up step; for SEP / ADF, which
    move Z (and carry their factor) once every ``tied_steps.TIED_INDUCING_EVERY`` steps, the mean step of that many."""
    steps = tied_steps.TIED_INDUCING_EVERY if method in ("sep", "adf") else 1
    rng = np.random.default_rng(0)
    X_host = rng.normal(size=(2 * rows, 4))
    y_host = np.sign(X_host[:, 0] + 0.3 * rng.normal(size=2 * rows))
    X, y = put(X_host), put(y_host)
    kernel = RBF(lengthscales=[1.0] * 4, amplitude=1.0, noise=0.01).for_inputs(X)
    trainer = training.Trainer(engines.make_engine(method, kernel, put(rng.normal(size=(m, 4))), n_total=2 * rows,
                                                   minibatch=True, jitter=1e-6, block_rows=block_rows))
    trainer.step(X, y, 0, rows, stepping=True)
    Z = trainer.state["Z"]
    with namespace.counting() as tally:
        for k in range(1, steps + 1):
            trainer.step(X, y, k % 2 * rows, k % 2 * rows + rows, stepping=True)
    assert trainer.state["Z"] is not Z  # (the steps counted moved Z: for SEP / ADF once, with one carry)
    cost = step_cost(tally.folded(("_log_ndtr_generic", "_inverse_mills_generic")), 8)
    return StepCost(cost.launches / steps, cost.flops / steps, cost.bytes / steps)


@pytest.mark.parametrize("method", ["sep", "ep", "adf", "svi"])
def test_the_step_model_holds_for_a_counted_step(monkeypatch, method):
    """The method's GPU step model (``Method.gpu_step``) against a step counted on the mocked CuPy (its CuPy
    paths): launches of one row block at most the model's and within 20% of it (25% per further block); flops and
    elements per row (the difference of two batch sizes) within 15% of the model's m^2 and m terms at m = 200 and
    400."""
    model = gpu_step_model(method)
    mock = MockCupy(monkeypatch)
    one = _counted_step(mock.xp, 40, 160, method, mock.put)
    assert 0.8 * model["launches"] <= one.launches <= model["launches"], one
    two_blocks = _counted_step(mock.xp, 40, 160, method, mock.put, block_rows=80)
    assert 0.75 * model["block_launches"] <= two_blocks.launches - one.launches <= model["block_launches"], \
        (one, two_blocks)
    for m in (200, 400):
        rows = 2 * m
        small, large = (_counted_step(mock.xp, m, r, method, mock.put) for r in (rows, 2 * rows))
        flops_per_row = (large.flops - small.flops) / rows
        elements_per_row = (large.bytes - small.bytes) / 8 / rows
        assert flops_per_row / m**2 == pytest.approx(model["flops_per_row_m2"], rel=0.15), (m, flops_per_row)
        assert elements_per_row / m == pytest.approx(model["elements_per_row_m"], rel=0.15), (m, elements_per_row)


def _gpu_rows(mock, n, m, dtype="float64"):
    Z = mock.put(np.random.default_rng(0).normal(size=(m, 4)), dtype=dtype)
    return GPClassifier(n_inducing=m, dtype=dtype)._batch_size_for(n, mock.xp, Z)


def _model_seconds(throughput, rows, m, itemsize, model=gpu_step_model("ep")):
    per_row = (model["flops_per_row_m2"] * m * m / throughput.flops
               + model["elements_per_row_m"] * m * itemsize / throughput.bytes)
    return rows * per_row, model["launches"] * throughput.launch_seconds


@pytest.mark.parametrize("m", [200, 1000])
def test_the_gpu_minibatch_is_the_fewest_rows_whose_arithmetic_outweighs_the_launches(monkeypatch, m):
    mock = MockCupy(monkeypatch)
    throughput = B.device_throughput(mock.xp, "float64")
    rows = _gpu_rows(mock, 10**9, m)  # (n / 512 is then above the launch-bound rows: they decide)
    device, launches = _model_seconds(throughput, rows, m, 8)
    assert device >= 2 * launches  # arithmetic sets the step's time
    device_half, _ = _model_seconds(throughput, rows // 2, m, 8)
    assert device_half < 2 * launches  # and half the rows would not
    assert rows > 200  # an H100 in float64 is launch-bound at the CPU's 200 rows for every m here


def test_the_gpu_minibatch_follows_the_device_and_its_limits(monkeypatch):
    h100 = _gpu_rows(MockCupy(monkeypatch), 10**9, 200)
    consumer = _gpu_rows(MockCupy(monkeypatch, properties=RTX4090_PROPERTIES), 10**9, 200)
    assert consumer < h100  # float64 arithmetic 26 times slower: fewer rows cover the same launches
    assert _gpu_rows(MockCupy(monkeypatch), 10**9, 200, "float32") >= h100 // 2  # faster arithmetic, less traffic
    # at least 512 steps an epoch (GPU_STEPS_PER_EPOCH: the quality study), rounded down to 200 times a power of two
    assert _gpu_rows(MockCupy(monkeypatch), 1_850_000, 200) == 3_200  # (n / 512 = 3,613)
    assert _gpu_rows(MockCupy(monkeypatch), 400_000, 200) == 400  # (781)
    assert _gpu_rows(MockCupy(monkeypatch), 100_000, 200) == 200  # (195: never fewer than the CPU's 200)
    small_memory = MockCupy(monkeypatch, free_bytes=200 * 2**20)  # 200 MB free: half of it for one block
    rows = _gpu_rows(small_memory, 10**9, 200)
    assert rows * B.rows_within_memory(1, small_memory.xp) // rows <= 100 * 2**20 and rows < h100
    cpu = GPClassifier(n_inducing=200)._batch_size_for(10**8, B.resolve_backend("numpy"),
                                                       np.zeros((200, 4)))
    assert cpu == 200
    assert GPClassifier()._batch_size_for(20_000, MockCupy(monkeypatch).xp, np.zeros((200, 4))) is None


def test_a_gpu_fit_with_auto_batches_takes_the_chosen_minibatch_in_one_block(monkeypatch):
    mock = MockCupy(monkeypatch)
    n = 20_800
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 2))
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, 1, 0)
    seen = []
    original = training.train

    def recording(X, y, engine, settings, hooks, **options):
        seen.append((settings.batch_size, engine.block_rows))
        return original(X, y, engine, settings, hooks, **options)

    monkeypatch.setattr(training, "train", recording)
    model = GPClassifier(method="sep", n_inducing=5, max_iter=1, random_state=0).fit(mock.put(X), mock.put(y))
    ((batch_size, block_rows),) = seen
    assert batch_size == block_rows == 200  # n / 512 is below the CPU's 200 rows: those, in one block
    assert model.history_["n_steps"][-1] == math.ceil(n / batch_size)
