"""Sample and class weights on every path (docs/weights.md): dask arrays (batch passes, minibatches on the driver,
data-parallel rounds), ``n_jobs`` worker processes and ``partial_fit``, with checkpoints; and the registry's support
table against what every method does with weights on every path."""

import logging

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
pytest.importorskip("distributed")

from agpc import RBF, GPClassifier  # noqa: E402
from agpc import methods as M  # noqa: E402
from agpc.inference import data_parallel, engines, ep, training  # noqa: E402
from helpers import binary_toy, interrupted_then_resumed, local_client, three_classes  # noqa: E402

N = 40


@pytest.fixture(scope="module")
def client():
    with local_client(2) as c:
        yield c


def _dask(*arrays, chunks=10):
    return [da.from_array(a, chunks=chunks) for a in arrays]


def _fixed_start(X, **settings):
    """Settings whose start does not read the rows (``inducing=``, ``kernel=``, no kernel prior): a weight-0 row then
    enters nothing, its values included."""
    return dict(n_inducing=6, inducing=X[:6].copy(), kernel=RBF(lengthscales=[1.0, 1.0]), kernel_prior=None,
                max_iter=2, random_state=0) | settings


def _with_row_changed(X, y, row):
    X_other, y_other = X.copy(), y.copy()
    X_other[row], y_other[row] = [4.0, -4.0], -y[row]
    return X_other, y_other


# -- each path: (settings, the capabilities it needs besides "sample_weight", how it fits) ------------------------------

def _fit_in_memory(model, X, y, w, client, tmp_path):
    return model.fit(X, y, sample_weight=w)


def _fit_on_disk(model, X, y, w, client, tmp_path):
    path = tmp_path / f"X-{abs(hash(X.tobytes()))}.npy"
    np.save(path, X)
    return model.fit(np.load(path, mmap_mode="r"), y, sample_weight=w)


def _fit_dask(model, X, y, w, client, tmp_path):
    # two chunks of rows (a batch pass's tasks, one a chunk, cost most of these fits' time) and weights chunked
    # otherwise (rechunked to the rows')
    model.set_params(client=client)
    return model.fit(*_dask(X, y, chunks=N // 2), sample_weight=None if w is None else da.from_array(w, chunks=15))


def _fit_stream(model, X, y, w, client, tmp_path):
    for lo in range(0, N, 10):
        model.partial_fit(X[lo:lo + 10], y[lo:lo + 10], classes=np.unique(y),
                          sample_weight=None if w is None else w[lo:lo + 10])
    return model


PATHS = {
    "in memory": (dict(), (), _fit_in_memory),
    "in memory, minibatches": (dict(batch_size=10), ("minibatch",), _fit_in_memory),
    "on disk": (dict(shuffle=False), ("out_of_core",), _fit_on_disk),
    "dask batch": (dict(batch_size=None, max_iter=1), ("dask", "dask_batch"), _fit_dask),
    "dask minibatches": (dict(batch_size=10, local_steps=0), ("dask", "minibatch"), _fit_dask),
    "dask data-parallel": (dict(batch_size=10, local_steps=1), ("dask", "minibatch", "n_jobs"), _fit_dask),
    "n_jobs": (dict(batch_size=10, local_steps=1, n_jobs=2), ("n_jobs",), _fit_in_memory),
    "partial_fit": (dict(), ("partial_fit",), _fit_stream),
}


def _predictions(fit, settings, X, y, w, client, tmp_path, X_test):
    model = GPClassifier(**settings)
    return fit(model, X, y, w, client, tmp_path).predict_proba(X_test)


@pytest.mark.parametrize("path", list(PATHS))
def test_every_method_on_every_path_takes_weights_or_refuses_them(client, tmp_path, path):
    """For every registered method on this path (two classes): where the registry says the method takes the path
    and weights, a weighted fit trains another model than the unweighted one (non-uniform weights), and a row of
    weight 0 is in no step (its values changed: the same model); where it says the method takes the path but not
    weights, weights are refused with one ValueError naming the method; a path the method does not take is refused
    with or without weights. The test reads the registry (``agpc.methods.supports``)."""
    extra, needs, fit = PATHS[path]
    X, y = binary_toy(N, seed=1)
    w = np.random.default_rng(0).uniform(0.2, 3.0, size=N)
    w[3] = 0.0
    X_other, y_other = _with_row_changed(X, y, 3)
    for name in M.method_names():
        settings = _fixed_start(X, method=name, **extra)
        if not all(M.supports(name, need) for need in needs):
            if needs:  # the path itself is refused, before the weights are looked at
                with pytest.raises((ValueError, AttributeError)):
                    _predictions(fit, settings, X, y, w, client, tmp_path, X)
            continue
        if not M.supports(name, "sample_weight"):
            with pytest.raises(ValueError, match=f"method={name!r}"):
                _predictions(fit, settings, X, y, w, client, tmp_path, X)
            continue
        weighted = _predictions(fit, settings, X, y, w, client, tmp_path, X)
        unweighted = _predictions(fit, settings, X, y, None, client, tmp_path, X)
        assert np.max(np.abs(weighted - unweighted)) > 1e-4, (name, path)
        other = _predictions(fit, settings, X_other, y_other, w, client, tmp_path, X)
        np.testing.assert_allclose(other, weighted, rtol=1e-10, atol=1e-12, err_msg=f"{name}, {path}")


# -- dask: the same model as in memory, the checks ---------------------------------------------------------------------

@pytest.mark.parametrize("settings", [dict(method="ep"), dict(method="sep"), dict(method="adf"),
                                      dict(method="ep", batch_size=10, local_steps=0),
                                      dict(method="sep", batch_size=10, local_steps=0),
                                      dict(method="svi", batch_size=10, local_steps=0),
                                      dict(method="vi-jj"), dict(method="vi-taylor")])
def test_dask_weighted_fit_is_the_fit_in_memory(client, settings):
    """Batch passes (one task a chunk: EP's sites, vi-*'s weighted bound) and minibatches brought to the driver
    weight the rows as a fit in memory does: the same model to round-off (weights chunked otherwise than the rows:
    rechunked; class weights too)."""
    X, y = binary_toy(60, seed=2)
    w = np.random.default_rng(1).uniform(0.0, 2.0, size=60)
    options = _fixed_start(X, max_iter=4, shuffle=False, class_weight={1.0: 2.5}) | settings
    on_dask = GPClassifier(client=client, **options).fit(*_dask(X, y, chunks=20),
                                                         sample_weight=da.from_array(w, chunks=25))
    in_memory = GPClassifier(**options).fit(X, y, sample_weight=w)
    np.testing.assert_allclose(on_dask.predict_proba(X), in_memory.predict_proba(X), rtol=1e-9, atol=1e-12)


def test_dask_batch_weight_zero_is_the_row_removed(client):
    """Batch EP on a dask array: a row of weight 0 is the row removed (same start), as in memory."""
    X, y = binary_toy(40, seed=3)
    w = np.ones(40)
    w[7] = 0.0
    options = _fixed_start(X, max_iter=4, optimize=False, client=client)  # (learning: the test above)
    weighted = GPClassifier(**options).fit(*_dask(X, y), sample_weight=da.from_array(w, chunks=10))
    keep = np.arange(40) != 7
    removed = GPClassifier(**options).fit(*_dask(X[keep], y[keep]))
    np.testing.assert_allclose(weighted.predict_proba(X), removed.predict_proba(X), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("weights, message", [
    (np.r_[np.nan, np.ones(39)], "finite: nan at row 0"),
    (np.r_[np.ones(20), -1.0, np.ones(19)], "non-negative: -1.0 at row 20"),
    (np.ones(39), "one weight a row"),
    (np.zeros(40), "every weight is zero"),
    (np.where(binary_toy(40, seed=1)[1] > 0, 0.0, 1.0), "has none"),
    (np.r_[np.ones(30), 1e150, np.ones(9)], r"1e\+150 at row 30, more than a fit in float64 carries"),
])
@pytest.mark.parametrize("lazy", [True, False])
def test_dask_bad_weights_are_refused_as_in_memory(client, weights, message, lazy):
    """Weights of a dask fit are checked on the cluster (a dask array: never brought to the driver) with the
    messages of a fit in memory."""
    X, y = binary_toy(40, seed=1)
    given = da.from_array(weights, chunks=10) if lazy else weights
    with pytest.raises(ValueError, match=message):
        GPClassifier(max_iter=1, client=client).fit(*_dask(X, y), sample_weight=given)
    with pytest.raises(ValueError, match=message):
        GPClassifier(max_iter=1).fit(X, y, sample_weight=weights)


def test_dask_class_weight_balanced_and_refused_dicts(client, caplog):
    """"balanced" on a dask array counts the classes on the cluster: the fit equals the one in memory, and the
    scheduler logs no "different run_spec" warning (the weights were computed, then persisted from a second graph
    of the same keys); a class weight that removes a class is refused as in memory."""
    X, y = binary_toy(40, seed=4)
    options = _fixed_start(X, max_iter=3, class_weight="balanced")
    with caplog.at_level(logging.WARNING, logger="distributed.scheduler"):
        on_dask = GPClassifier(client=client, **options).fit(*_dask(X, y))
    assert not [r for r in caplog.records if "run_spec" in r.getMessage()]
    in_memory = GPClassifier(**options).fit(X, y)
    np.testing.assert_allclose(on_dask.predict_proba(X), in_memory.predict_proba(X), rtol=1e-9, atol=1e-12)
    for model in (GPClassifier(client=client, max_iter=1, class_weight={1.0: 0.0}), GPClassifier(max_iter=1,
                                                                                              class_weight={1.0: 0.0})):
        with pytest.raises(ValueError, match=r"class .*1\.0.* has none"):
            model.fit(*(_dask(X, y) if model.client is not None else (X, y)))
    with pytest.raises(ValueError, match="finite and non-negative"):
        GPClassifier(max_iter=1, class_weight={1.0: -2.0}).fit(X, y)


# -- data-parallel rounds: a weight-0 row in no step --------------------------------------------------------------------

@pytest.mark.parametrize("method", ["ep", "sep", "adf", "svi"])
def test_data_parallel_step_with_a_weight_zero_row(tmp_path, method):
    """A shard's round (``data_parallel.step_shard``, the task of a round) of two minibatch steps, a weight-0 row in
    one of them (the first step from a uniform factor moves the factor only: the gradient is zero at q = prior): the
    chunk's factor (EP: made from its sites), the parameters, the optimiser's state and the steps' log Z estimates
    are the same whatever the row holds."""
    X, y = binary_toy(20, seed=5)
    w = np.random.default_rng(2).uniform(0.5, 2.0, size=20)
    w[4] = 0.0
    Z = X[:5].copy()
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    options = engines.EngineOptions(optimize=("kernel", "inducing"), site_rows=0 if method == "ep" else None)
    template = engines.ENGINES[method](method, kernel, Z, n_total=20, minibatch=True, options=options)
    tied = method != "svi"
    spec = {"factory": engines.ENGINES[method], "method": method, "options": options, "kernel": kernel, "Z": Z,
            "n_total": float(w.sum()) if method in ("sep", "adf") else 20, "seed": 3, "batch_size": 10,
            "optimizer": template.optimizer.snapshot(), "damping": template.damping,
            "total": ep.uniform_factor(Z) if tied else None,
            "state": {k: template.state[k] for k in ("whitened_mean", "whitened_chol") if k in template.state},
            "site_directory": str(tmp_path), "generation": 1, "chunk_weights": [float(w.sum())],
            "factors": {0: ep.uniform_factor(Z)} if tied else {}, "site_files": {0: None} if method == "ep" else {}}
    out = data_parallel.step_shard(spec, [(0, 0, 0, 2)], {0: (X, y, w)})
    X_other, y_other = _with_row_changed(X, y, 4)
    other = data_parallel.step_shard(dict(spec, generation=2), [(0, 0, 0, 2)], {0: (X_other, y_other, w)})
    np.testing.assert_allclose(out["log_z"], other["log_z"], rtol=1e-12)
    for name, value in out["kernel"].params.items():
        np.testing.assert_allclose(value, other["kernel"].params[name], rtol=1e-12, err_msg=name)
    np.testing.assert_allclose(out["Z"], other["Z"], rtol=1e-12, atol=1e-13)
    if tied:
        for part in ("precision", "shift"):
            np.testing.assert_allclose(getattr(out["factors"][0], part), getattr(other["factors"][0], part),
                                       rtol=1e-11, atol=1e-12, err_msg=part)
    for name in out["state"]:
        np.testing.assert_allclose(out["state"][name], other["state"][name], rtol=1e-12, atol=1e-13)
    assert not np.allclose(out["Z"], Z)  # (the step moved the parameters)


@pytest.mark.parametrize("method", ["sep", "adf"])
def test_a_shards_steps_are_the_weighted_steps_in_one_process(tmp_path, method):
    """One shard stepping the only chunk: its chunk's factor stands for the chunk's rows' weight, so its steps are those
    of a weighted minibatch fit in one process on the rows in the chunk's order (the factor, the parameters and the log
    Z estimates, to round-off; a factor standing for the rows' count would differ)."""
    X, y = binary_toy(20, seed=5)
    w = np.random.default_rng(2).uniform(0.0, 3.0, size=20)
    Z = X[:5].copy()
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    options = engines.EngineOptions(optimize=("kernel", "inducing"))
    template = engines.ENGINES[method](method, kernel, Z, n_total=float(w.sum()), minibatch=True, options=options)
    template.carries_factor = False  # a shard's steps do not carry its factor to the moved Z (docs/methods/sep.md)
    spec = {"factory": engines.ENGINES[method], "method": method, "options": options, "kernel": kernel, "Z": Z,
            "n_total": float(w.sum()), "seed": 3, "batch_size": 10, "optimizer": template.optimizer.snapshot(),
            "damping": template.damping, "total": ep.uniform_factor(Z), "state": {}, "site_directory": str(tmp_path),
            "generation": 1, "chunk_weights": [float(w.sum())], "factors": {0: ep.uniform_factor(Z)},
            "site_files": {}}
    out = data_parallel.step_shard(spec, [(0, 0, 0, 2)], {0: (X, y, w)})
    order = data_parallel.chunk_permutation(3, 0, 0, 20)
    template.take_sample_weight(w[order])
    trainer = training.Trainer(template)
    log_z = [trainer.step_until_taken(X[order], y[order], lo, lo + 10, stepping=True)[1] for lo in (0, 10)]
    np.testing.assert_allclose(out["log_z"], log_z, rtol=1e-10)
    np.testing.assert_allclose(out["factors"][0].precision, template.state["factor"].precision, rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(out["Z"], template.state["Z"], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", ["ep", "sep"])
def test_rounds_with_unit_weights_are_the_unweighted_rounds(method):
    """Weights of 1 pass through the rounds (shared beside the rows, each chunk's total sent to its shard) without
    changing their arithmetic: the model of the unweighted rounds, to round-off."""
    X, y = binary_toy(40, seed=6)
    options = _fixed_start(X, method=method, batch_size=10, local_steps=2, n_jobs=2, max_iter=3)
    weighted = GPClassifier(**options).fit(X, y, sample_weight=np.ones(40))
    plain = GPClassifier(**options).fit(X, y)
    np.testing.assert_allclose(weighted.predict_proba(X), plain.predict_proba(X), rtol=1e-12, atol=1e-14)


# -- partial_fit ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["sep", "adf"])
def test_partial_fit_weights_each_calls_rows(method):
    """A stream of weighted batches: each step counts its rows by weight (the model stands for the weight seen); a
    weight-0 row changes nothing; integer weights equal the batch's rows repeated within each step (SEP's step on a
    row twice is its step on the row of weight 2)."""
    X, y = binary_toy(40, seed=7)
    counts = np.random.default_rng(5).integers(0, 3, size=40).astype(float)
    counts[[0, 1]] = [1.0, 2.0]
    options = dict(method=method, n_inducing=5, inducing=X[:5].copy(), kernel=RBF(lengthscales=[1.0, 1.0]),
                   kernel_prior=None, random_state=0)
    weighted, repeated = GPClassifier(**options), GPClassifier(**options)
    for lo in range(0, 40, 10):
        rows = slice(lo, lo + 10)
        weighted.partial_fit(X[rows], y[rows], classes=[-1.0, 1.0], sample_weight=counts[rows])
        index = np.repeat(np.arange(lo, lo + 10), counts[rows].astype(int))
        repeated.partial_fit(X[index], y[index], classes=[-1.0, 1.0])
    assert weighted.history_["n_rows_seen"][-1] == pytest.approx(counts.sum())
    np.testing.assert_allclose(weighted.predict_proba(X), repeated.predict_proba(X), rtol=1e-9, atol=1e-12)


def test_partial_fit_refuses_balanced_and_bad_weights():
    X, y = binary_toy(20, seed=1)
    with pytest.raises(ValueError, match="balanced"):
        GPClassifier(method="sep", n_inducing=5, class_weight="balanced").partial_fit(X, y)
    with pytest.raises(ValueError, match="non-negative"):
        GPClassifier(method="sep", n_inducing=5).partial_fit(X, y, sample_weight=np.r_[-1.0, np.ones(19)])
    model = GPClassifier(method="sep", n_inducing=5, class_weight={1.0: 2.0}).partial_fit(X, y)
    assert model.history_["n_rows_seen"][-1] == pytest.approx(20 + np.sum(y > 0))


# -- checkpoints on these paths ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("params, stop_at", [
    (dict(method="ep", max_iter=4, dask=True), 13),  # batch passes on a dask array (after 10 warm-up sweeps)
    (dict(method="sep", batch_size=10, local_steps=0, max_iter=3, dask=True), 9),  # minibatches on the driver
    (dict(method="sep", batch_size=10, local_steps=1, max_iter=4, dask=True), 9),  # data-parallel rounds
    (dict(method="ep", batch_size=10, local_steps=1, max_iter=4, n_jobs=2), 9),  # local worker processes
    (dict(method="svi", batch_size=10, local_steps=1, max_iter=4, n_jobs=2), 9),
])
def test_weighted_fit_resumes_on_every_path(monkeypatch, tmp_path, client, params, stop_at):
    """A weighted fit's checkpoints on a dask array and in worker processes: interrupted and resumed, it ends at the
    uninterrupted model; a resume with other weights is refused (the fingerprint digests the weights where they are)."""
    X, y = binary_toy(60, seed=8)
    params = dict(params)
    on_dask = params.pop("dask", False)
    data = _dask(X, y, chunks=20) if on_dask else (X, y)
    params = _fixed_start(X, **params) | dict(class_weight={1.0: 3.0}) | (dict(client=client) if on_dask else {})
    reference, resumed = interrupted_then_resumed(monkeypatch, params, tmp_path / "run.ckpt", stop_at, *data)
    np.testing.assert_allclose(resumed.predict_proba(X), reference.predict_proba(X), rtol=1e-10, atol=1e-14)
    other = GPClassifier(**dict(params, class_weight={1.0: 2.0}), checkpoint_path=tmp_path / "run.ckpt",
                         checkpoint_every=4)
    with pytest.raises(ValueError, match="sample weights"):
        other.fit(*data, resume=True)


MULTICLASS_PATHS = ("in memory, minibatches", "dask batch", "dask minibatches", "dask data-parallel", "n_jobs",
                    "partial_fit")


@pytest.mark.parametrize("method", ["ep", "sep"])
def test_dask_multiclass_batch_weighted_fit_is_the_fit_in_memory(client, method):
    """Three classes: the batch passes on a dask array (one task a chunk) weight the rows as multiclass EP / SEP in
    memory does (power EP; the tied factors counting rows by weight): the same model to round-off."""
    X, y = three_classes(60, 5)
    w = np.random.default_rng(4).uniform(0.0, 2.0, size=60)
    options = _fixed_start(X, method=method, batch_size=None, max_iter=4, shuffle=False, class_weight={2: 2.5})
    on_dask = GPClassifier(client=client, **options).fit(*_dask(X, y, chunks=20),
                                                         sample_weight=da.from_array(w, chunks=25))
    in_memory = GPClassifier(**options).fit(X, y, sample_weight=w)
    unweighted = GPClassifier(**options).fit(X, y)
    np.testing.assert_allclose(on_dask.predict_proba(X), in_memory.predict_proba(X), rtol=1e-9, atol=1e-12)
    assert np.max(np.abs(in_memory.predict_proba(X) - unweighted.predict_proba(X))) > 1e-4


@pytest.mark.parametrize("path", MULTICLASS_PATHS)
def test_multiclass_weights_on_the_paths(client, tmp_path, path):
    """Three classes (SEP), every path: the weighted model differs from the unweighted one and a row of weight 0 is in
    no step (its values and label changed: the same model)."""
    extra, _, fit = PATHS[path]
    X, y = three_classes(60, 3)
    y = y.astype(float)
    w = np.random.default_rng(2).uniform(0.2, 3.0, size=60)
    w[3] = 0.0
    X_other, y_other = X.copy(), y.copy()
    X_other[3], y_other[3] = [4.0, -4.0], (y[3] + 1) % 3
    settings = _fixed_start(X, method="sep", **extra)
    weighted = _predictions(fit, settings, X, y, w, client, tmp_path, X)
    unweighted = _predictions(fit, settings, X, y, None, client, tmp_path, X)
    assert np.max(np.abs(weighted - unweighted)) > 1e-4
    other = _predictions(fit, settings, X_other, y_other, w, client, tmp_path, X)
    np.testing.assert_allclose(other, weighted, rtol=1e-10, atol=1e-12)
