"""The method registry (agpc.methods): a method registered from outside the package is validated, fitted, tagged,
offered by the command line and listed in the support table with no other edit; the table in docs/methods.md is
the registry's; an unknown method is one error that lists the names."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from agpc import GPClassifier, classifier
from agpc import methods as M
from agpc.cli import main as cli_main
from agpc.datasets import make_banana
from agpc.inference import engines

DOCS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "methods.md"

TOY = M.Method("toy-adf", family="ep", engine="adf", likelihood_reason="uses the probit likelihood (toy)",
               capabilities={"minibatch", "partial_fit", "out_of_core", "validation_data", "checkpoints"},
               remarks={"dask": "not for a toy"})


@pytest.fixture
def toy():
    """The toy method registered for one test, and removed after it whatever the test did."""
    M.register_method(TOY)
    try:
        yield TOY
    finally:
        M.unregister_method(TOY.name)
    assert TOY.name not in M.method_names()


def _data(n=80, seed=3):
    return make_banana(n, random_state=seed)


def test_a_toy_method_is_validated_and_refused_once_unregistered(toy):
    GPClassifier(method="toy-adf").check_params()
    with pytest.raises(ValueError, match=r"method='toy-adf' uses the probit likelihood \(toy\).*'logistic'"):
        GPClassifier(method="toy-adf", likelihood="logistic").check_params()
    M.unregister_method("toy-adf")
    try:
        with pytest.raises(ValueError, match="method must be one of 'ep', .*got 'toy-adf'"):
            GPClassifier(method="toy-adf").check_params()
    finally:
        M.register_method(TOY)


def test_a_toy_method_fits_by_its_engine_as_the_method_it_is_built_on(toy):
    """The toy runs the ADF engine: the same seed gives ADF's model, row for row (not merely a good one)."""
    X, y = _data()
    options = dict(n_inducing=6, max_iter=4, batch_size=20, random_state=0)
    toy_model = GPClassifier(method="toy-adf", **options).fit(X, y)
    adf_model = GPClassifier(method="adf", **options).fit(X, y)
    np.testing.assert_array_equal(toy_model.predict_proba(X), adf_model.predict_proba(X))
    assert toy_model.likelihood_ == "probit"
    streamed = GPClassifier(method="toy-adf", n_inducing=6, random_state=0)
    streamed.partial_fit(X[:40], y[:40]).partial_fit(X[40:], y[40:])
    assert streamed.n_iter_ == 2


def test_a_toy_method_is_tagged_by_its_capabilities(toy):
    model = GPClassifier(method="toy-adf")
    assert model.__sklearn_tags__().classifier_tags.multi_class is False
    assert hasattr(model, "partial_fit")
    assert not hasattr(GPClassifier(method="ep"), "partial_fit")
    X, y = _data(90)
    with pytest.raises(ValueError, match="3 classes but method='toy-adf' is binary only"):
        GPClassifier(method="toy-adf", n_inducing=4).fit(X, np.arange(90) % 3)


def test_the_command_line_offers_a_toy_method(toy, capsys):
    with pytest.raises(SystemExit):
        cli_main(["fit", "--help"])
    assert "toy-adf" in capsys.readouterr().out
    assert cli_main(["fit", "data.csv", "--method", "no-such-method"]) != 0
    assert "toy-adf" in capsys.readouterr().err


def test_the_support_table_lists_a_toy_method(toy):
    page = M.write_support_table(DOCS_PAGE.read_text(encoding="utf-8"))
    row = next(line for line in page.splitlines() if line.startswith("| `toy-adf`"))
    assert row.split(" | ")[1:] == ["probit", "no", "yes", "yes", "yes", "no (not for a toy)", "no", "yes", "yes", "no",
                                    "yes", "no |"]


def test_the_docs_table_is_the_registry():
    text = DOCS_PAGE.read_text(encoding="utf-8")
    assert M.write_support_table(text) == text, "docs/methods.md's support table differs: run python docs/support_table.py"
    for name in M.method_names():
        assert f"`{name}`" in text.split(M.TABLE_BEGIN)[1].split(M.TABLE_END)[0]


def test_python_m_agpc_methods_rewrites_the_table(tmp_path):
    page = tmp_path / "methods.md"
    page.write_text(f"intro\n{M.TABLE_BEGIN}\nstale\n{M.TABLE_END}\noutro\n", encoding="utf-8")
    M.main([str(page)])
    assert page.read_text(encoding="utf-8") == f"intro\n{M.TABLE_BEGIN}\n{M.support_table()}\n{M.TABLE_END}\noutro\n"


def test_an_unknown_method_is_one_error_listing_the_names():
    names = ", ".join(repr(n) for n in M.method_names())
    with pytest.raises(ValueError, match=f"method must be one of {names}, got 'laplace'"):
        GPClassifier(method="laplace").fit(*_data(20))
    with pytest.raises(ValueError, match="unknown method 'laplace': use one of 'ep', 'sep'"):
        M.get_method("laplace")
    assert M.supports("laplace", "multiclass") is False
    with pytest.raises(ValueError, match="unknown capability 'gpu'"):
        M.supports("ep", "gpu")


def test_the_registry_refuses_what_it_cannot_hold(toy):
    with pytest.raises(ValueError, match="registered already"):
        M.register_method(TOY)
    with pytest.raises(ValueError, match="built in and cannot be"):
        M.unregister_method("ep")
    with pytest.raises(ValueError, match="built in and cannot be"):
        M.register_method(M.Method("ep", family="ep", engine="ep"), replace=True)
    with pytest.raises(ValueError, match="engine must be one of"):
        M.Method("toy", family="ep", engine="laplace")
    with pytest.raises(ValueError, match="unknown capabilities"):
        M.Method("toy", family="ep", engine="ep", capabilities={"gpu"})
    with pytest.raises(TypeError, match="takes an agpc.methods.Method"):
        M.register_method("toy")


def test_the_built_in_methods_are_the_engines():
    assert set(M.method_names()) == set(engines.ALL_METHODS)
    assert M.methods_supporting("partial_fit") == ("sep", "adf")
    assert M.methods_supporting("multiclass") == ("ep", "sep", "adf", "svi", "gfitc")
    assert all(M.get_method(name).engine == name for name in engines.ALL_METHODS)


def test_the_deprecated_classifier_methods_alias_is_gone():
    """``agpc.classifier.METHODS`` (the method names before the registry) has been removed after its deprecation:
    ``agpc.methods.method_names()`` is the one list."""
    assert not hasattr(classifier, "METHODS")


def test_a_method_sets_its_own_training_loop_settings():
    """A method's ``train_options`` reach the training loop: batch EP without the 10 warm-up sweeps before its
    first hyper-parameter step takes max_iter steps where EP takes max_iter + 10."""
    no_warmup = M.Method("toy-ep-no-warmup", family="ep", engine="ep", capabilities={"minibatch"},
                         train_options=lambda params, n_classes: {"n_warmup": 0})
    bad = M.Method("toy-ep-bad", family="ep", engine="ep", train_options=lambda params, n_classes: {"warm": 0})
    M.register_method(no_warmup)
    M.register_method(bad)
    try:
        X, y = _data(60)
        options = dict(n_inducing=5, max_iter=3, batch_size=None, random_state=0)
        assert GPClassifier(method="ep", **options).fit(X, y).history_["n_steps"][-1] == 3 + 10
        assert GPClassifier(method="toy-ep-no-warmup", **options).fit(X, y).history_["n_steps"][-1] == 3
        with pytest.raises(ValueError, match=r"method 'toy-ep-bad': train_options returned \['warm'\]"):
            GPClassifier(method="toy-ep-bad", **options).fit(X, y)
    finally:
        M.unregister_method(no_warmup.name)
        M.unregister_method(bad.name)


def test_a_method_sets_its_own_engine_options():
    """``train_options`` also name options of the engine (``EngineOptions``): a method of EP that always damps by
    0.25 trains the model EP trains with damping=0.25."""
    damped = M.Method("toy-ep-damped", family="ep", engine="ep", train_options=lambda params, n_classes: {"damping": 0.25})
    M.register_method(damped)
    try:
        X, y = _data(60)
        options = dict(n_inducing=5, max_iter=3, batch_size=None, random_state=0)
        own = GPClassifier(method="toy-ep-damped", **options).fit(X, y)
        np.testing.assert_array_equal(own.history_["damping"], [0.25] * len(own.history_["damping"]))
        reference = GPClassifier(method="ep", damping=0.25, **options).fit(X, y)
        np.testing.assert_array_equal(own.predict_proba(X), reference.predict_proba(X))
        assert not np.array_equal(own.predict_proba(X), GPClassifier(method="ep", **options).fit(X, y).predict_proba(X))
    finally:
        M.unregister_method(damped.name)


def test_a_toy_method_without_dask_is_refused_on_a_dask_array_before_any_cluster(toy):
    da = pytest.importorskip("dask.array")
    X, y = _data(40)
    on_dask = M.methods_supporting("dask")
    assert {"ep", "sep", "adf", "svi"} <= set(on_dask) and "toy-adf" not in on_dask
    with pytest.raises(ValueError, match=re.escape(f"fit on a dask array trains the methods {list(on_dask)}, "
                                                   "not 'toy-adf'")):
        GPClassifier(method="toy-adf", n_inducing=4).fit(da.from_array(X, chunks=20), da.from_array(y, chunks=20))


@pytest.mark.parametrize("record, message", [
    (dict(name="jj-probit", family="quadratic", engine="vi-jj", likelihoods=("probit",)), r"likelihoods \['probit'\]"),
    (dict(name="ep-logit", family="ep", engine="ep", likelihoods=("logistic",)), r"likelihoods \['logistic'\]"),
    (dict(name="jj-multi", family="quadratic", engine="vi-jj", likelihoods=("logistic",),
          capabilities={"multiclass"}), r"capabilities \['multiclass'\]"),
    (dict(name="ep-stream", family="ep", engine="ep", capabilities={"partial_fit"}), r"capabilities \['partial_fit'\]"),
    (dict(name="svi-multi", family="variational", engine="svi", capabilities={"multiclass"}),
     "more than two classes with the likelihood 'robust-max'"),
])
def test_a_method_beyond_what_its_engine_trains_is_refused(record, message):
    """Found by review: a method promising a likelihood or capability its engine lacks trained one model and
    predicted (or saved) it as another, or failed deep inside a fit."""
    with pytest.raises(ValueError, match=message):
        M.register_method(M.Method(**record))
    assert record["name"] not in M.method_names()
