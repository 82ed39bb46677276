"""Minibatch EP's exact rebuild of q goes over the rows with a site alone (``sites.only_rows_with_sites``): a row
whose sites are all zero adds nothing to q's sums, and in the first epoch most rows have none yet. The time budget
keeps room for that rebuild scaled to those rows (``hooks.TimeBudget._final_seconds``)."""

import array_api_strict
import numpy as np
import pytest

from agpc.inference import engines, hooks, sites, training
from agpc.kernels import RBF, ClassKernels
from conftest import to_np
from helpers import binary_toy, three_classes

JITTER = 1e-6


def test_rows_with_sites_are_those_with_any_site_other_than_zero():
    nu = np.array([0.0, 1.0, 0.0, 0.0, 2.0])
    mu = np.array([0.0, 0.0, -0.5, 0.0, 1.0])
    assert sites.rows_with_sites(nu, mu).tolist() == [1, 2, 4]
    assert sites.rows_with_sites(nu + 1.0, mu) is None  # every row has one
    pairs = np.zeros((4, 6))
    pairs[1, 5] = 0.3  # one of a multiclass row's 2C sites
    pairs[3, 0] = -1e-300
    assert sites.rows_with_sites(pairs, np.zeros_like(pairs)).tolist() == [1, 3]
    assert sites.rows_with_sites(np.zeros(3), np.zeros(3)).tolist() == []


@pytest.mark.parametrize("device", [None, array_api_strict.Device("device1")], ids=["default", "device1"])
def test_only_rows_with_sites_gathers_the_rows_in_memory_of_the_sites_library(tmp_path, device):
    X = np.arange(16.0).reshape(8, 2)
    y = np.array([1.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0, -1.0])
    nu = np.array([0.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0])
    mu = np.array([0.0, 0.0, -0.5, 0.0, 1.0, 0.0, 0.0, 0.0])
    kept = sites.only_rows_with_sites(X, y, nu, mu)
    for got, full in zip(kept, (X, y, nu, mu)):
        np.testing.assert_array_equal(got, full[[1, 2, 4]])
    assert sites.only_rows_with_sites(X, None, nu, mu)[1] is None
    assert sites.rows_in_site_sums(X, nu, mu) == 3
    xs = array_api_strict
    strict = [xs.asarray(a, device=device) for a in (X, y, nu, mu)]
    kept = sites.only_rows_with_sites(*strict)
    for got, full in zip(kept, (X, y, nu, mu)):
        assert got.device == strict[0].device
        np.testing.assert_array_equal(to_np(got), full[[1, 2, 4]])
    # data on disk is read a block at a time, in order; a host X with another library's sites stays where it is
    disk = np.memmap(tmp_path / "X.dat", dtype=np.float64, mode="w+", shape=X.shape)
    disk[:] = X
    for rows in (disk, X):
        sites_of = (nu, mu) if rows is disk else (strict[2], strict[3])
        got = sites.only_rows_with_sites(rows, y, *sites_of)
        assert got[0] is rows and got[2] is sites_of[0]
        assert sites.rows_in_site_sums(rows, *sites_of) == 8


def test_the_copy_of_the_rows_gathered_is_bounded(monkeypatch):
    """The rows gathered are a copy: not where more than GATHER_MAX_SHARE of the rows have sites (the pass over every
    row costs less than twice the other) or the copy would hold more than GATHER_MAX_ELEMENTS elements of X."""
    X = np.arange(40.0).reshape(20, 2)
    nu = np.zeros(20)
    nu[:18] = 1.0
    assert sites.rows_in_site_sums(X, nu, np.zeros(20)) == 18  # 90% of the rows: gathered
    nu[18] = 1.0
    assert sites.rows_in_site_sums(X, nu, np.zeros(20)) == 20  # more: every row, as given
    assert sites.only_rows_with_sites(X, None, nu, np.zeros(20))[0] is X
    nu[5:] = 0.0
    assert sites.rows_in_site_sums(X, nu, np.zeros(20)) == 5
    monkeypatch.setattr(sites, "GATHER_MAX_ELEMENTS", 9)  # 5 rows of 2 columns: 10 elements
    assert sites.rows_in_site_sums(X, nu, np.zeros(20)) == 20
    assert sites.only_rows_with_sites(X, None, nu, np.zeros(20))[0] is X


def test_where_no_row_has_a_site_the_first_stands_for_them_all():
    """A rebuild before any row has a site (the guard's repair of a fit's first step, a fit stopped before its first
    step, a run given zero sites) is the uniform factor, from the first row's zero sites."""
    X = np.arange(8.0).reshape(4, 2)
    kept = sites.only_rows_with_sites(X, np.ones(4), np.zeros(4), np.zeros(4))
    assert [a.shape[0] for a in kept] == [1, 1, 1, 1]
    assert sites.rows_in_site_sums(X, np.zeros((4, 6)), np.zeros((4, 6))) == 1


def _stepped(engine, X, y, batches):
    trainer = training.Trainer(engine)
    for lo, hi in batches:
        took, _, _ = trainer.step(X, y, lo, hi, stepping=True)
        assert took
    return trainer


def _seen_rows(engine):
    """The rows each call of the engine's passes' exact_factor was given."""
    seen, module = [], engine.passes

    class Passes:  # the engine's passes module, its exact_factor counted (the module itself is left alone)
        def __getattr__(self, name):
            return getattr(module, name)

        @staticmethod
        def exact_factor(kernel, Z, X, *args, **kwargs):
            seen.append(X.shape[0])
            return module.exact_factor(kernel, Z, X, *args, **kwargs)

    engine.passes = Passes()
    return seen


def _problem(kind):
    if kind == "binary":
        X, y = binary_toy(300, seed=4)
        kernel = RBF(lengthscales=[1.0, 1.0], noise=0.01).for_inputs(X)
        return X, y.astype(float), kernel, X[:8].copy()
    X, y = three_classes(300, seed=2)
    kernels = ClassKernels([RBF(lengthscales=[1.0, 1.0], noise=0.05).for_inputs(X) for _ in range(3)])
    return X, y.astype(float), kernels, np.stack([X[:6] + 0.05 * c for c in range(3)])


@pytest.mark.parametrize("kind", ["binary", "multiclass"])
def test_the_exact_rebuild_of_q_goes_over_the_rows_with_sites_and_gives_the_same_q(kind):
    """In the first epoch: the rebuild's pass is given the visited rows alone, and its factor is the one a pass over
    every row gives (the others' sites are zero); once every row has a site, every row, as before."""
    X, y, kernel, Z = _problem(kind)
    engine = engines.make_engine("ep", kernel, Z, n_total=300, minibatch=True, jitter=JITTER)
    batches = [(60, 90), (210, 240), (0, 30)]
    _stepped(engine, X, y, batches)
    assert engine.rows_in_q(X) == 90
    # the time budget's projection, through the same rule: up to 90% of the rows gathered, every row past it
    assert [engine.rows_in_q(X, with_sites=k) for k in (0, 150, 270, 271)] == [1, 150, 270, 300]
    seen = _seen_rows(engine)
    factor, _ = engine._exact_factor(X, y)
    every = engine.passes.exact_factor(engine.state["kernel"], engine.state["Z"], X, engine.state["nu"],
                                       engine.state["mu"], jitter=JITTER, y=y)
    assert seen == [90, 300]
    parts = getattr(factor, "factors", (factor,))
    for got, want in zip(parts, getattr(every, "factors", (every,))):
        np.testing.assert_allclose(got.precision, want.precision, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(got.shift, want.shift, rtol=1e-10, atol=1e-10)
    engine.rebuild_factor(X, y)  # (the guard's repair and a time-stopped fit's final pass: q alone)
    assert seen[-1] == 90
    engine.time_rebuild(X, y, 120)  # the time budget's timing: the first rows, every one
    assert seen[-1] == 120
    _stepped(engine, X, y, [(lo, lo + 30) for lo in range(0, 300, 30) if lo not in (60, 210, 0)])
    assert engine.rows_in_q(X) == 300
    engine.rebuild_factor(X, y)
    assert seen[-1] == 300


@pytest.mark.parametrize("kind", ["binary", "multiclass"])
def test_a_rebuild_before_any_site_is_the_uniform_factor(kind):
    X, y, kernel, Z = _problem(kind)
    engine = engines.make_engine("ep", kernel, Z, n_total=300, minibatch=True, jitter=JITTER)
    assert engine.rows_in_q(X) == 1
    factor, _ = engine._exact_factor(X, y)
    for part in getattr(factor, "factors", (factor,)):
        assert not np.any(part.precision) and not np.any(part.shift)


def test_the_guard_repairs_a_fresh_fits_first_step_by_a_rebuild():
    """The guard's first remedy where there are exact rebuilds is one: on the first step of a fresh fit no row has a
    site yet, and the rebuild is the uniform factor (it had raised an error when the pass was given no row)."""
    X, y, kernel, Z = _problem("binary")
    engine = engines.make_engine("ep", kernel, Z, n_total=300, minibatch=True, jitter=JITTER)
    module, calls = engine.passes, []

    class Passes:  # the first step's log Z not finite, once
        def __getattr__(self, name):
            return getattr(module, name)

        @staticmethod
        def evaluate_factor(*args, **kwargs):
            out = module.evaluate_factor(*args, **kwargs)
            calls.append(1)
            return dict(out, log_z=out["log_z"] * np.nan) if len(calls) == 1 else out

    engine.passes = Passes()
    trainer = training.Trainer(engine)
    trainer.step_until_taken(X, y, 0, 30, stepping=True, repair=lambda: trainer.rebuild_factor(X, y))
    assert trainer.n_rebuilds == 1 and engine.rows_in_q(X) == 30


def test_methods_without_rows_of_sites_count_every_row():
    X, y, kernel, Z = _problem("binary")
    for method, minibatch in (("sep", True), ("ep", False)):
        engine = engines.make_engine(method, kernel, Z, n_total=300, minibatch=minibatch, jitter=JITTER)
        assert engine.rows_in_q(X) is None


class _Trainer:
    """What the time budget reads of a trainer: its steps, and its engine's count of the rows q's rebuild takes (the
    sites' own rule, ``sites.rows_in_site_sums``, for rows in memory)."""

    def __init__(self, n):
        self.n_steps, sites_of = 0, np.zeros(n)
        self.engine = type("Engine", (), {"rows_in_q": staticmethod(
            lambda X, with_sites=None: sites.rows_in_site_sums(X, sites_of, None, with_sites=with_sites))})()


def test_the_room_kept_for_the_final_rebuild_grows_with_the_rows_that_have_sites(monkeypatch):
    """n = 200,000 rows, minibatches of 200, the rebuild over all rows estimated at 10 s from 4 x 8,192 rows: at the
    start of a fresh fit the room kept is that of the timed rows (1.6 s x FINAL_RESERVE), then 200 rows more a step;
    every row once more than GATHER_MAX_SHARE (90%) of them would have sites (the rebuild takes them all then), or
    the steps have visited all; all rows where the engine does not count them."""
    clock = {"now": 0.0}
    monkeypatch.setattr(hooks.time, "perf_counter", lambda: clock["now"])
    budget = hooks.TimeBudget(60.0, started=0.0, batch=False)
    n, timed = 200_000, 4 * 8192
    trainer, X = _Trainer(n), np.zeros((n, 1))
    budget.seconds.update(step=0.01, final=10.0, rebuild=20.0)
    budget.trainer, budget.final_rows, budget.reserve_final = trainer, (0, 0, 200, n, timed, X), True
    assert budget._final_seconds() == pytest.approx(10.0 * timed / n)
    trainer.n_steps = 300  # 60,000 rows visited, the next step's too
    assert budget._final_seconds() == pytest.approx(10.0 * 60_200 / n)
    assert budget._final_seconds(ahead=0) == pytest.approx(10.0 * 60_000 / n)
    last_start = 60.0 - 0.01 - hooks.FINAL_RESERVE * 10.0 * 60_200 / n
    clock["now"] = last_start - 0.01
    assert not budget.exhausted(False)
    clock["now"] = last_start + 0.01
    assert budget.exhausted(False) and budget.final_pass_fits(with_log_z=False)
    trainer.n_steps = 899  # 180,000 rows with the next step: 90%, still gathered
    assert budget._final_seconds() == pytest.approx(10.0 * 180_000 / n)
    trainer.n_steps = 900  # past 90%: every row
    assert budget._final_seconds() == pytest.approx(10.0)
    trainer.n_steps = 2000  # past an epoch: every row
    assert budget._final_seconds() == pytest.approx(10.0)
    budget.final_rows = None
    trainer.n_steps = 0
    assert budget._final_seconds() == pytest.approx(10.0)


def test_a_time_budget_counts_the_rows_with_sites_at_its_start():
    """``start`` asks the engine how many rows hold sites (a resumed fit's: some; a fresh fit's: none) and notes the
    steps taken so far and the rows a step."""
    X, y, kernel, Z = _problem("binary")
    engine = engines.make_engine("ep", kernel, Z, n_total=300, minibatch=True, jitter=JITTER)
    trainer = _stepped(engine, X, y, [(30, 60), (90, 120)])
    batches = [(lo, min(300, lo + 30)) for lo in range(0, 300, 30)]
    run = type("Run", (), {"minibatch": True, "X": X, "y": y, "trainer": trainer, "batches": batches,
                           "resumed": False, "schedule": engine.schedule(training.TrainSettings(), True)})()
    budget = hooks.TimeBudget(600.0)
    budget.start(run, rows=50)
    assert budget.final_rows[:5] == (60, trainer.n_steps, 30, 300, 200) and budget.final_rows[5] is X
    assert budget.reserve_final and budget.seconds["rebuild"] == hooks.REBUILD_PASSES * budget.seconds["final"]
    assert budget._final_seconds() == pytest.approx(budget.seconds["final"] * max(200, 90) / 300)
    trainer.n_steps += 5  # 240 rows with sites by the next step
    assert budget._final_seconds() == pytest.approx(budget.seconds["final"] * 240 / 300)


def test_multiclass_minibatch_ep_steps_and_rebuilds_on_array_api_strict_as_on_numpy():
    """Multiclass sites are (n, 2C): their rows are sliced as ``[lo:hi, ...]``, which the standard asks of an array of
    more than one axis (``[lo:hi]`` alone raised IndexError on array_api_strict). On device1: the same sites and the
    same q rebuilt from the rows with sites as on NumPy."""
    xs, device = array_api_strict, array_api_strict.Device("device1")
    X, y, kernels, Z = _problem("multiclass")
    runs = {}
    for name, to in (("numpy", lambda a: a), ("strict", lambda a: xs.asarray(a, device=device))):
        Xd = to(X)
        ks = ClassKernels([RBF(lengthscales=[1.0, 1.0], noise=0.05).for_inputs(Xd) for _ in range(3)])
        engine = engines.make_engine("ep", ks, to(Z.copy()), n_total=300, minibatch=True, jitter=JITTER)
        _stepped(engine, Xd, to(y), [(60, 90), (210, 240), (0, 30)])
        factor, _ = engine._exact_factor(Xd, to(y))
        runs[name] = (engine.state["nu"], factor, engine.rows_in_q(Xd))
    np.testing.assert_allclose(to_np(runs["strict"][0]), runs["numpy"][0], rtol=1e-9, atol=1e-12)
    for got, want in zip(runs["strict"][1].factors, runs["numpy"][1].factors):
        np.testing.assert_allclose(to_np(got.precision), want.precision, rtol=1e-9, atol=1e-9)
    assert runs["strict"][2] == runs["numpy"][2] == 90

