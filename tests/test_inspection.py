"""Looking at a fitted model (``agpc.inspection``): ``GPClassifier.summary()`` and ``agpc inspect`` say what the model
is, which features matter (1 / lengthscale^2 of the ARD kernel, normalised), how training went and why it stopped,
the same after a save and load; the expected calibration error matches a hand computation and an independent
implementation; ``--plot`` writes one PNG through the safe-write rules; bad files are one line."""

import io
import json
import shutil
import sys
import zipfile
from pathlib import Path

import array_api_strict
import numpy as np
import pandas
import pytest

from agpc import RBF, GPClassifier, Linear, Matern52, inspection, load_model
from agpc.checkpoints import HEADER_KEY
from agpc.cli import main
from agpc.datasets import make_banana
from agpc.inspection import STOP_REASONS, STOPPED_BECAUSE, expected_calibration_error, feature_relevance, \
    plot_model, reliability_bins
from helpers import three_classes, write_table

ROOT = Path(__file__).resolve().parent.parent
FAST = dict(n_inducing=8, max_iter=5, random_state=0)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def relevant_and_noise(n=120, seed=0):
    """Feature "signal" decides the label; "noise" does not."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = (X[:, 0] + 0.2 * rng.normal(size=n) > 0).astype(int)
    return pandas.DataFrame(X, columns=["signal", "noise"]), y


@pytest.fixture(scope="module")
def named():
    X, y = relevant_and_noise()
    return GPClassifier(n_inducing=10, max_iter=30, random_state=0).fit(X, y), X, y


@pytest.fixture(scope="module")
def banana_model():
    X, y = make_banana(200, random_state=0)
    return GPClassifier(**FAST).fit(X, y), X, y


def saved_and_loaded(model):
    buffer = io.BytesIO()
    model.save(buffer)
    buffer.seek(0)
    return GPClassifier.load(buffer), buffer


# -- the summary ---------------------------------------------------------------------------------------

def test_summary_of_a_binary_model_says_what_it_is_and_how_training_went(banana_model):
    model, X, _ = banana_model
    text = model.summary()
    assert isinstance(text, str)
    lines = text.splitlines()
    assert lines[0] == "GPClassifier: method ep, likelihood probit, dtype float64"
    assert lines[1] == "data: 200 rows, 2 features; 2 classes: -1, 1"
    assert "features: not named" in text
    assert f"inducing points: {model.inducing_points_.shape[0]}\n" in text
    assert f"stopped: {STOPPED_BECAUSE['max_iter']}" in text
    steps = model.history_["n_steps"][-1]
    assert f"iterations (epochs with minibatches): {model.n_iter_}, {steps} steps" in text
    assert model.n_warmup_ > 0 and f"steps; of them {model.n_warmup_} warm-up sweeps, which max_iter does not count" in text
    assert saved_and_loaded(model)[0].n_warmup_ == model.n_warmup_  # (kept in the model file's fit record)
    assert f"final log Z (EP's estimate): {model.log_marginal_likelihood_:.6g}" in text
    assert f"fit time: {model.fit_time_:.3g} s" in text
    assert f"jitter: {model.jitter_:.3g}" in text
    assert "validation: none" in text
    assert model.n_samples_fit_ == X.shape[0] and model.stop_reason_ == "max_iter"


def test_relevance_is_the_normalised_inverse_squared_lengthscale_sorted_with_names(named):
    model, X, _ = named
    lengthscales = np.exp(np.asarray(model.kernel_.params["log_lengthscales"]))
    expected = (1 / lengthscales ** 2) / np.sum(1 / lengthscales ** 2)
    relevance, why = feature_relevance(model.kernel_)
    assert why is None
    np.testing.assert_allclose(relevance, expected, rtol=1e-12)
    assert relevance[list(X.columns).index("signal")] > 0.8  # the feature that decides the label
    text = model.summary()
    assert "features: signal, noise" in text
    table = text.split("feature relevance:")[1].splitlines()[2:4]
    assert table[0].split()[0] == "signal" and table[1].split()[0] == "noise"  # most relevant first
    for row in table:
        name, shown, lengthscale = row.split()
        j = list(X.columns).index(name)
        assert float(shown) == pytest.approx(expected[j], abs=5e-5)
        assert float(lengthscale) == pytest.approx(lengthscales[j], rel=1e-3)


def test_max_features_lists_the_most_relevant_and_sums_the_rest():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 5))
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    model = GPClassifier(**FAST).fit(X, y)
    relevance, _ = feature_relevance(model.kernel_)
    order = np.argsort(-relevance, kind="stable")
    text = model.summary(max_features=2)
    rows = text.split("feature relevance:")[1].splitlines()[2:5]
    assert [row.split()[0] for row in rows[:2]] == [f"x{j}" for j in order[:2]]
    assert rows[2] == f"  ... 3 more features, relevance {relevance[order[2:]].sum():.4f} together"
    with pytest.raises(ValueError, match="max_features must be a positive integer"):
        model.summary(max_features=0)


def test_a_linear_kernels_lengthscales_are_one_over_the_root_of_its_slope_variances():
    """A linear kernel's "lengthscale" is 1 / sqrt(v_j), its relevance v_j normalised (docs: the distance along
    feature j over which the slope moves f by one prior standard deviation). With unequal slope variances (held:
    optimize=False) the summary's column must show 1 / sqrt(v_j); the multiclass test's equal variances could not tell
    v ** 0.5 from v ** -0.5."""
    X, y = relevant_and_noise(60, seed=2)
    model = GPClassifier(kernel=Linear(variances=[4.0, 0.25], bias=1.0), optimize=False, max_iter=3, n_inducing=8,
                         random_state=0).fit(X.to_numpy(), y)
    rows = model.summary().split("feature relevance:")[1].splitlines()[2:4]
    shown = {row.split()[0]: (float(row.split()[1]), float(row.split()[2])) for row in rows}
    assert shown == {"x0": (pytest.approx(4.0 / 4.25, abs=5e-5), pytest.approx(0.5, rel=1e-3)),
                     "x1": (pytest.approx(0.25 / 4.25, abs=5e-5), pytest.approx(2.0, rel=1e-3))}
    assert [row.split()[0] for row in rows] == ["x0", "x1"]


def test_the_relevance_plot_shows_the_most_relevant_features_most_relevant_on_top(monkeypatch, tmp_path):
    """The plot's relevance panel: the ``max_features`` most relevant features, the most relevant on top (a bar
    chart reads from the top). A break sorting ascending drew the least relevant ones and passed every test, which
    checked only that a PNG was written."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 5))
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    model = GPClassifier(**FAST).fit(X, y)
    relevance, _ = feature_relevance(model.kernel_)
    figures = []
    real = inspection._figure
    monkeypatch.setattr(inspection, "_figure", lambda: figures.append(real()) or figures[-1])
    plot_model(model.report(), tmp_path / "model.png", max_features=3)
    panel = figures[0].axes[2]
    bars = sorted(panel.patches, key=lambda bar: bar.get_y())  # bottom to top
    labels = [label.get_text() for label in panel.get_yticklabels()]  # bottom to top
    top = np.argsort(-relevance, kind="stable")[:3]
    assert labels == [f"x{j}" for j in top[::-1]]
    np.testing.assert_allclose([bar.get_width() for bar in bars], relevance[top[::-1]], rtol=1e-12)


def test_summary_of_a_multiclass_model_has_a_relevance_column_a_class():
    X, y = three_classes(90, 0)
    model = GPClassifier(n_inducing=6, max_iter=3, random_state=0).fit(X, y)
    text = model.summary()
    assert "3 classes: 0, 1, 2" in text and "kernel: one kernel a class" in text
    assert "inducing points: 6 a class" in text
    assert all(f"  class {c}: RBF: amplitude" in text for c in range(3))
    relevance, why = feature_relevance(model.kernel_)
    assert why is None and relevance.shape == (3, 2)
    np.testing.assert_allclose(relevance.sum(axis=1), 1.0)
    header = text.split("feature relevance:")[1].splitlines()[1].split()
    assert header == ["feature", "mean", "class", "0", "class", "1", "class", "2"]


def test_a_multiclass_linear_model_says_its_relevance_is_its_slope_variances():
    X, y = three_classes(90, 0)
    model = GPClassifier(kernel=Linear(), n_inducing=6, max_iter=3, random_state=0).fit(X, y)
    text = model.summary()
    assert all(f"  class {c}: Linear: bias" in text for c in range(3))
    assert "feature relevance: slope variance v (a linear kernel" in text
    variances = np.stack([np.asarray(k.variances) for k in model.kernel_.kernels])
    np.testing.assert_allclose(feature_relevance(model.kernel_)[0], variances / variances.sum(axis=1, keepdims=True))


def test_a_kernel_without_one_set_of_ard_lengthscales_says_so(banana_model):
    _, X, y = banana_model
    model = GPClassifier(kernel=RBF(1.0) + Matern52(1.0), kernel_prior=None, **FAST).fit(X, y)
    text = model.summary()
    assert "feature relevance: none (the Sum kernel has no one set of ARD lengthscales" in text
    assert "0.lengthscales [" in text and "1.amplitude" in text  # the terms' parameters are listed instead
    relevance, why = feature_relevance(RBF(lengthscales=2.0))  # one lengthscale, not broadcast to the features
    assert relevance is None and "one lengthscale shared by every feature" in why


@pytest.mark.parametrize("settings, reason", [
    (dict(max_time=1e-4, n_inducing=8), "max_time"),
    (dict(optimize=False, n_inducing=8, tol=1e-3), "converged"),
    (dict(n_inducing="auto"), "plateau"),  # the exact model of small binary data stops on a plateau of log Z
])
def test_every_stop_is_recorded_and_said(settings, reason):
    X, y = make_banana(80, random_state=0)
    model = GPClassifier(random_state=0, **settings).fit(X, y)
    assert model.stop_reason_ == reason
    assert f"stopped: {STOPPED_BECAUSE[reason]}" in model.summary()
    assert set(STOPPED_BECAUSE) == set(STOP_REASONS)


def test_validation_scores_and_early_stopping_are_in_the_summary():
    X, y = make_banana(120, random_state=0)
    Xv, yv = make_banana(60, random_state=1)
    model = GPClassifier(n_inducing=8, max_iter=30, n_iter_no_change=2, tol=10.0, random_state=0).fit(
        X, y, validation_data=(Xv, yv))  # (tol 10: no score counts as an improvement, so it stops after two)
    assert model.stop_reason_ == "early_stopping"
    history = model.history_
    best = int(np.argmin(history["validation_nll"]))
    text = model.summary()
    assert f"stopped: {STOPPED_BECAUSE['early_stopping']}" in text
    assert f"validation ({len(history['validation_nll'])} scores):" in text
    assert (f"  last: NLL {history['validation_nll'][-1]:.4f}, error {history['validation_error'][-1]:.4f} "
            f"(step {history['validation_step'][-1]})") in text
    assert f"  best: NLL {history['validation_nll'][best]:.4f}" in text


def test_a_stream_says_so():
    X, y = make_banana(100, random_state=0)
    model = GPClassifier(method="sep", n_inducing=8, random_state=0)
    model.partial_fit(X[:50], y[:50], classes=[-1, 1]).partial_fit(X[50:], y[50:])
    assert model.stop_reason_ == "partial_fit" and model.n_samples_fit_ == 100
    assert "data: 100 rows" in model.summary() and "fit time: not measured for partial_fit" in model.summary()


# -- the record in the model file ----------------------------------------------------------------------

def test_a_loaded_model_prints_the_same_summary(named, banana_model):
    for model in (named[0], banana_model[0]):
        loaded, _ = saved_and_loaded(model)
        assert loaded.summary() == model.summary()
        assert (loaded.stop_reason_, loaded.n_samples_fit_, loaded.fit_time_) == (
            model.stop_reason_, model.n_samples_fit_, model.fit_time_)


def rewritten(buffer, change):
    """The model file in ``buffer`` with its JSON header changed by ``change(header)``."""
    buffer.seek(0)
    with zipfile.ZipFile(buffer) as source:
        members = {name: source.read(name) for name in source.namelist()}
    arrays = dict(np.load(io.BytesIO(buffer.getvalue()), allow_pickle=False))
    header = json.loads(str(arrays[HEADER_KEY]))
    change(header)
    arrays[HEADER_KEY] = np.asarray(json.dumps(header))
    out = io.BytesIO()
    np.savez(out, **arrays)
    out.seek(0)
    assert set(members) == set(zipfile.ZipFile(out).namelist())
    out.seek(0)
    return out


def test_a_file_without_the_record_loads_and_says_not_recorded(banana_model):
    _, buffer = saved_and_loaded(banana_model[0])
    older = GPClassifier.load(rewritten(buffer, lambda header: header.pop("fit_record")))
    assert older.stop_reason_ is None and older.n_samples_fit_ is None and older.fit_time_ is None
    text = older.summary()
    assert "data: rows not recorded" in text and "stopped: not recorded" in text and "fit time: not recorded" in text
    fixture = load_model(ROOT / "tests" / "data" / "model_v2" / "multiclass_iris.npz")  # written by an older agpc
    assert "stopped: not recorded" in fixture.summary()


@pytest.mark.parametrize("record, field", [
    ({"stop_reason": "import os"}, "fit_record.stop_reason"),
    ({"n_samples_fit": -3}, "fit_record.n_samples_fit"),
    ({"fit_time": "1 s"}, "fit_record.fit_time"),
    ({"ard": "yes"}, "fit_record.ard"),
    ({"n_warmup": -1}, "fit_record.n_warmup"),
    ({"subsample_rows": -1}, "fit_record.subsample_rows"),
    ({"subsample_iter": 2.5}, "fit_record.subsample_iter"),
    ({"subsample_rows": 500, "n_samples_fit": 400}, "fit_record.subsample_rows: 500 rows of a subsample, not fewer"),
    ({"subsample_rows": 0, "subsample_iter": 3}, "fit_record.subsample_iter: 3 iterations on a subsample of 0 rows"),
    ([1, 2], "fit_record"),
])
def test_a_bad_record_is_refused_naming_it(banana_model, record, field):
    _, buffer = saved_and_loaded(banana_model[0])
    with pytest.raises(ValueError, match=f"not a valid agpc model file: {field}"):
        GPClassifier.load(rewritten(buffer, lambda header: header.update(fit_record=record)))


@pytest.mark.parametrize("entry, value, said", [("log_marginal_likelihood", float("nan"), "history.log_marginal_likelihood"),
                                                ("time", float("inf"), "history.time"),
                                                ("damping", float("inf"), "history.damping")])
def test_a_model_file_whose_history_holds_nan_is_refused(banana_model, entry, value, said):
    """docs/usage.md: load checks every field for finiteness; a NaN in the history loaded. NaN is the damping that
    a method without damping records (SVI, vi-*): that loads."""
    _, buffer = saved_and_loaded(banana_model[0])

    def change(header):
        header["history"][entry][1] = value

    with pytest.raises(ValueError, match=rf"not a valid agpc model file: {said}: holds NaN or inf"):
        GPClassifier.load(rewritten(buffer, change))
    svi = GPClassifier(method="svi", n_inducing=5, max_iter=2, random_state=0).fit(*make_banana(60, random_state=0))
    assert np.isnan(svi.history_["damping"]).all() and np.isnan(saved_and_loaded(svi)[0].history_["damping"]).all()


def test_an_ordinal_models_summary_gives_its_relevance_and_cut_points():
    """summary() / agpc inspect of an ordinal model showed no feature relevance and said its one RBF had "each term"
    of its own; its kernel is the latent's, beside its cut points."""
    X, y = relevant_and_noise(120, seed=3)
    labels = np.digitize(X["signal"].to_numpy(), [-0.5, 0.5])
    model = GPClassifier(likelihood="ordinal", **FAST).fit(X, labels)
    text = model.summary()
    cuts = ", ".join(f"{v:.4g}" for v in model.cut_points_)
    assert "kernel: RBF: amplitude" in text and f"cut points {cuts}" in text and "each term" not in text
    rows = text.split("feature relevance:")[1].splitlines()[2:4]
    lengthscales = np.asarray(model.kernel_.latent.lengthscales)
    relevance, why = feature_relevance(model.kernel_)
    assert why is None and rows[0].split()[0] == "signal"
    np.testing.assert_allclose(relevance, (1 / lengthscales ** 2) / np.sum(1 / lengthscales ** 2), rtol=1e-12)


# -- the expected calibration error --------------------------------------------------------------------

def test_ece_equals_a_hand_computation():
    # top-class probabilities 0.9 (right), 0.85 (right), 0.8 (wrong), 0.7 (right), 0.55 (wrong); 0.9, 0.8 and 0.7
    # lie on bin edges, in the bin they close: (0.8, 0.9] holds 0.9 and 0.85, accuracy 1, confidence 0.875;
    # (0.7, 0.8]: 0.8, accuracy 0; (0.6, 0.7]: 0.7, accuracy 1; (0.5, 0.6]: 0.55, accuracy 0.
    # ECE = (2 * 0.125 + 0.8 + 0.3 + 0.55) / 5 = 0.38
    proba = np.array([[0.9, 0.1], [0.85, 0.15], [0.8, 0.2], [0.3, 0.7], [0.45, 0.55]])
    labels = np.array([0, 0, 1, 1, 0])
    assert expected_calibration_error(proba, labels) == pytest.approx(0.38, abs=1e-15)
    counts, accuracy, confidence = reliability_bins(proba, labels)
    np.testing.assert_array_equal(counts, [0, 0, 0, 0, 0, 1, 1, 1, 2, 0])
    assert confidence[8] == pytest.approx(0.875) and accuracy[8] == 1.0 and np.isnan(accuracy[0])
    # three classes: 0.5 (right, bin (0.4, 0.5]), 0.6 (wrong), 0.34 (wrong): (0.5 + 0.6 + 0.34) / 3 = 0.48
    proba = np.array([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.34, 0.33, 0.33]])
    assert expected_calibration_error(proba, np.array([0, 1, 2])) == pytest.approx(0.48, abs=1e-15)


def ece_by_loops(proba, labels, n_bins=10):
    """An independent ECE: each row walked to its bin one edge at a time, sums kept in Python lists."""
    rows, hits, confidence = [0] * n_bins, [0.0] * n_bins, [0.0] * n_bins
    for p, label in zip(proba.tolist(), labels.tolist()):
        top = max(p)
        b = 0
        while b < n_bins - 1 and top > (b + 1) / n_bins:
            b += 1
        rows[b] += 1
        hits[b] += float(p.index(top) == label)
        confidence[b] += top
    return sum(abs(hits[b] - confidence[b]) for b in range(n_bins) if rows[b]) / len(labels)


@pytest.mark.parametrize("n_classes", [2, 3, 7])
@pytest.mark.parametrize("n_bins", [10, 4])
def test_ece_equals_an_independent_implementation(n_classes, n_bins):
    rng = np.random.default_rng(n_classes + n_bins)
    proba = rng.dirichlet(np.full(n_classes, 0.6), size=300)
    proba[:10] = np.round(proba[:10], 1)  # some on the bin edges
    proba[:10] /= proba[:10].sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(n_classes, p=p) for p in proba])
    assert expected_calibration_error(proba, labels, n_bins) == pytest.approx(ece_by_loops(proba, labels, n_bins),
                                                                              abs=1e-12)


def test_ece_runs_on_the_array_api(xp_device):
    xp, device = xp_device
    rng = np.random.default_rng(0)
    proba = rng.dirichlet(np.ones(3), size=50)
    labels = rng.integers(0, 3, size=50)
    got = expected_calibration_error(xp.asarray(proba, device=device), xp.asarray(labels, device=device))
    assert got == pytest.approx(ece_by_loops(proba, labels), abs=1e-12)


def test_ece_refuses_bad_arguments():
    proba = np.array([[0.6, 0.4]])
    with pytest.raises(ValueError, match="n_bins must be a positive integer"):
        expected_calibration_error(proba, np.array([0]), n_bins=0)
    with pytest.raises(ValueError, match="expected probabilities"):
        expected_calibration_error(proba, np.array([0, 1]))
    with pytest.raises(ValueError, match="expected probabilities"):
        expected_calibration_error(array_api_strict.asarray(proba[:0]), array_api_strict.asarray([], dtype=array_api_strict.int64))


# -- the command ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory, named):
    model, X, y = named
    where = tmp_path_factory.mktemp("inspect")
    path = where / "model.agpc"
    model.save(path)
    table = write_table(where / "data.csv", {**{c: X[c].to_numpy() for c in X.columns}, "label": y})
    return path, table


def test_inspect_prints_the_summary(files, named, capsys):
    path, _ = files
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr()
    assert out.out == named[0].summary() and out.err == ""


def test_inspect_with_data_scores_the_calibration(files, named, capsys):
    path, table = files
    model, X, y = named
    assert main(["inspect", str(path), "--data", str(table), "--target", "label"]) == 0
    proba = model.predict_proba(X)
    ece = expected_calibration_error(proba, np.searchsorted(model.classes_, y))
    assert f"ECE {ece:.4f}   ({len(y)} rows)" in capsys.readouterr().out


def test_inspect_warns_when_it_takes_columns_by_position(files, named, tmp_path, capsys):
    path, _ = files
    _, X, y = named
    np.savez(tmp_path / "rows.npz", X=X.to_numpy(), y=y)
    assert main(["inspect", str(path), "--data", str(tmp_path / "rows.npz"), "--target", "y"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("agpc: warning:") and "taken by position" in err[0]


def test_inspect_plot_writes_one_png(files, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path, table = files
    for extra in ([], ["--data", str(table), "--target", "label"]):
        out = tmp_path / f"plot{len(extra)}.png"
        assert main(["inspect", str(path), "--plot", str(out), *extra]) == 0
        assert out.read_bytes()[:8] == PNG_SIGNATURE and out.stat().st_size > 10_000
        assert capsys.readouterr().out.endswith(f"wrote {out}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot0.png", "plot4.png"]  # no temporary left


@pytest.mark.parametrize("target", ["/dev/null", "directory"])
def test_inspect_plot_refuses_a_device_or_a_directory(files, tmp_path, capsys, target):
    path, _ = files
    if target == "directory":
        target = tmp_path / "directory"
        target.mkdir()
    status = main(["inspect", str(path), "--plot", str(target)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and err[0].startswith("agpc: error: cannot write")
    assert ("is under /dev" in err[0]) if str(target) == "/dev/null" else ("it is a directory" in err[0])
    assert [p.name for p in tmp_path.iterdir()] == ([] if str(target) == "/dev/null" else ["directory"])


def test_plot_model_writes_a_png_and_refuses_a_directory(banana_model, tmp_path):
    pytest.importorskip("matplotlib")
    model, X, y = banana_model
    proba = model.predict_proba(X)
    path = plot_model(model.report(), tmp_path / "model.png",
                      calibration=(proba, np.searchsorted(model.classes_, y)))
    assert Path(path).read_bytes()[:8] == PNG_SIGNATURE
    with pytest.raises(ValueError, match="it is a directory"):
        plot_model(model.report(), tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["model.png"]


def test_inspect_plot_of_a_history_beyond_what_an_axis_spans_draws_the_rest_and_says_so(banana_model, tmp_path,
                                                                                         monkeypatch, capsys):
    """The hostile-input audit of 2026-12-04: a forged model file whose history held +-1e308 failed in matplotlib's
    ticker ('arange: cannot compute length', after NumPy's overflow warning). The curve is drawn without those
    points, the panel says how many it left out, and nothing is printed to stderr."""
    pytest.importorskip("matplotlib")
    model = banana_model[0]
    _, buffer = saved_and_loaded(model)

    def change(header):
        header["history"]["log_marginal_likelihood"][:2] = [1e308, -1e308]

    forged = tmp_path / "forged.agpc"
    forged.write_bytes(rewritten(buffer, change).getvalue())
    figures = []
    real = inspection._figure
    monkeypatch.setattr(inspection, "_figure", lambda: figures.append(real()) or figures[-1])
    out = tmp_path / "plot.png"
    assert main(["inspect", str(forged), "--plot", str(out)]) == 0
    assert capsys.readouterr().err == "" and out.read_bytes()[:8] == PNG_SIGNATURE
    panel = figures[0].axes[0]
    assert len(model.history_["n_steps"]) > 2
    np.testing.assert_array_equal(panel.lines[0].get_xdata(), model.history_["n_steps"][2:])
    np.testing.assert_array_equal(panel.lines[0].get_ydata(), model.history_["log_marginal_likelihood"][2:])
    assert [text.get_text() for text in panel.texts] == ["2 recorded points beyond +-1e+300 not drawn"]


# the history an agpc before the one training loop recorded (no step counts; no guard counts, before the guard)
OLDER_HISTORY = ("log_marginal_likelihood", "time", "n_invalid_sites", "damping")


def test_an_older_files_history_continued_by_partial_fit_loads_and_plots(tmp_path, monkeypatch, capsys):
    """A hostile-input audit: ``partial_fit`` continuing a file of an older agpc, whose history has no step counts,
    starts them empty beside the longer log Z (``streaming.trainer_from_fitted``): a real fit's history of entries of
    other lengths. Its file loads (``load_model`` refuses only an entry longer than log Z's), and ``agpc inspect
    --plot`` failed on it in matplotlib ("operands could not be broadcast together"). The curve is drawn at the step
    counts there are (partial_fit's records, the last) and the panel says how many earlier records it left out."""
    pytest.importorskip("matplotlib")
    X, y = make_banana(200, random_state=0)
    _, buffer = saved_and_loaded(GPClassifier(method="sep", **FAST).fit(X, y))
    older = GPClassifier.load(rewritten(buffer, lambda header: header.update(
        history={key: header["history"][key] for key in OLDER_HISTORY})))
    model = older.partial_fit(X[:50], y[:50], n_total=250).partial_fit(X[50:100], y[50:100])
    path = tmp_path / "continued.agpc"
    model.save(path)
    history = load_model(path).history_
    records, counted = len(history["log_marginal_likelihood"]), len(history["n_steps"])
    assert counted == 2 and records > counted
    figures = []
    real = inspection._figure
    monkeypatch.setattr(inspection, "_figure", lambda: figures.append(real()) or figures[-1])
    assert main(["inspect", str(path)]) == 0 and main(["inspect", str(path), "--plot", str(tmp_path / "p.png")]) == 0
    assert capsys.readouterr().err == ""
    panel = figures[0].axes[0]
    np.testing.assert_array_equal(panel.lines[0].get_xdata(), history["n_steps"])
    np.testing.assert_array_equal(panel.lines[0].get_ydata(), history["log_marginal_likelihood"][-2:])
    assert [text.get_text() for text in panel.texts] == [f"{records - 2} earlier records without a step count not "
                                                         "drawn"]


def test_inspect_without_matplotlib_names_it(files, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    status = main(["inspect", str(files[0]), "--plot", str(tmp_path / "out.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "'matplotlib'" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_inspect_of_a_missing_or_corrupt_file_is_one_line(tmp_path, files, capsys):
    corrupt_zip = tmp_path / "truncated.agpc"
    corrupt_zip.write_bytes(files[0].read_bytes()[:-200])
    not_zip = tmp_path / "text.agpc"
    not_zip.write_text("not a model")
    other_npz = tmp_path / "other.agpc"
    np.savez(other_npz, X=np.zeros(3))
    shutil.move(str(other_npz) + ".npz", other_npz)
    for path, says in ((tmp_path / "absent.agpc", "no such model file"), (not_zip, "is not an agpc model file"),
                       (corrupt_zip, "truncated.agpc"), (other_npz, "not a valid agpc model file")):
        status = main(["inspect", str(path)])
        out = capsys.readouterr()
        assert status == 2 and out.out == "", path
        lines = out.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("agpc: error:") and says in lines[0], lines


def test_inspect_data_and_target_go_together(files, capsys):
    assert main(["inspect", str(files[0]), "--data", str(files[1])]) == 2
    assert "--data and --target go together" in capsys.readouterr().err


def test_predict_with_a_target_prints_the_ece(files, named, tmp_path, capsys):
    path, table = files
    model, X, y = named
    assert main(["predict", str(path), str(table), "--target", "label", "--out", str(tmp_path / "p.csv")]) == 0
    printed = capsys.readouterr().out
    predicted = np.loadtxt(tmp_path / "p.csv", delimiter=",", skiprows=1)[:, 1:]  # (after predicted_label)
    ece = ece_by_loops(predicted, np.searchsorted(model.classes_, y))
    assert f"NLL" in printed and f"ECE {ece:.4f}" in printed


@pytest.mark.parametrize("ard", [False, True])
def test_the_relevance_panel_says_when_one_shared_lengthscale_makes_it_the_features_scales(monkeypatch, tmp_path, ard):
    """With one lengthscale scale shared (ard_=False) the bars are the features' own scales, not learned: the panel
    says so, as the summary does (issue 41, item 7); a model with a lengthscale per feature has no such note."""
    rng = np.random.default_rng(2)
    X = rng.normal(size=(40, 3)) * [1.0, 10.0, 100.0]
    y = (X[:, 0] > 0).astype(int)
    model = GPClassifier(**dict(FAST, ard=ard)).fit(X, y)
    assert model.ard_ is ard
    figures = []
    real = inspection._figure
    monkeypatch.setattr(inspection, "_figure", lambda: figures.append(real()) or figures[-1])
    plot_model(model.report(), tmp_path / "model.png")
    panel = figures[0].axes[2]
    said = " ".join((panel.get_title() + " " + panel.get_xlabel()).split())
    assert ("not learned" in said) is (not ard)
    assert ("not learned per feature" in model.summary()) is (not ard)


def test_the_summary_and_the_plot_take_a_fitted_estimator_or_its_report(tmp_path):
    """``model_summary`` / ``plot_model`` read a ``ModelReport``; a fitted estimator gives its own (docs/usage.md
    calls plot_model(clf, ...)); anything else is one TypeError, an estimator not fitted NotFittedError."""
    from sklearn.exceptions import NotFittedError

    X, y = make_banana(80, random_state=0)
    model = GPClassifier(n_inducing=5, max_iter=2, random_state=0).fit(X, y)
    assert inspection.model_summary(model) == inspection.model_summary(model.report()) == model.summary()
    assert plot_model(model, tmp_path / "a.png").stat().st_size > 0
    with pytest.raises(TypeError, match="expected a fitted GPClassifier or an agpc.inspection.ModelReport, got str"):
        inspection.model_summary("model")
    with pytest.raises(NotFittedError):
        plot_model(GPClassifier(), tmp_path / "b.png")


@pytest.mark.parametrize("scale", [1e200, 1e-200])
def test_relevance_of_features_of_extreme_scale_is_that_of_the_same_features_at_scale_one(scale):
    """A hostile-input audit (2026-12-02): a model fitted on features of scale 1e200 (or 1e-200) printed NaN relevance
    in ``summary()`` and ``agpc inspect``, with NumPy's overflow warnings: 1 / l^2 overflowed. Relevance is
    normalised, so it does not depend on the features' common scale; it is taken in logs now."""
    from agpc.inspection import feature_relevance

    X, y = make_banana(200, random_state=0)
    at_one = GPClassifier(n_inducing=10, max_iter=3, random_state=0, ard=True).fit(X, y)
    scaled = GPClassifier(n_inducing=10, max_iter=3, random_state=0, ard=True).fit(X * scale, y)
    relevance, why = feature_relevance(scaled.kernel_)
    assert why is None
    np.testing.assert_allclose(relevance, feature_relevance(at_one.kernel_)[0], rtol=1e-6)
    assert "nan" not in scaled.summary().lower()
