"""The engines the training loop drives: one step of each method, and never a loop of their own.

Every method is an engine with the same step protocol; ``training.Trainer`` holds one, wraps its steps in
the divergence guard, and ``training.train`` is the one loop (schedule, time budget, history, validation,
early stopping, checkpoints) for all of them:

  ``EPEngine``        EP / SEP / ADF, binary and multiclass, batch and minibatch (Hernandez-Lobato & Hernandez-Lobato
                      (2016), sec. 2.3, Villacampa-Calvo & Hernandez-Lobato (2017), Hernandez-Lobato et al. (2015)); its
                      passes run in memory (``ep``, ``multiclass_ep``) or on a cluster (``dask_engine.DaskPasses``). One
                      step: one damped site update of the rows given and, when stepping, one step on the
                      hyper-parameters.
  ``GFITCEngine``     GFITC (Naish-Guzman & Holden 2008): one step is one damped EP sweep at fixed
                      hyper-parameters; once the sites have settled, the next step is one step on the
                      hyper-parameters along the gradient of log Z_EP at them (Hernandez-Lobato & Hernandez-Lobato
                      (2016), sec. 3).
  ``SVIEngine``       SVI (Izmailov & Kropotov (2017), sec. 3.2; Villacampa-Calvo & Hernandez-Lobato (2017), sec. 3
                      multiclass): one step is one stochastic gradient step of eq. 11 on the rows given.
  ``QuadraticEngine`` vi-JJ / vi-JJ-hybrid / vi-JJ-full / vi-Taylor (Izmailov & Kropotov (2017), Alg. 1): one step is
                      one outer iteration, the analytic (q, xi) updates and one L-BFGS-B round.

The contract is ``Engine`` (``agpc.inference.contract``: an abstract base, the members the loop calls, with defaults
for the optional ones, and the parts every engine shares); ``ENGINES`` maps each built-in method's name to its engine
class, which is its own factory: ``cls(name, kernel, Z, n_total=, minibatch=, options=EngineOptions(...),
passes=None)``. ``agpc.methods`` carries the factory of every registered method (a method of one's own may bring its
own engine).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType, ModuleType

from ..backend import array_device, array_namespace, is_dask_array, read_rows, row_slice, to_host_vector
from ..checkpoint_rules import check_row_starts, check_saved_anchor
from ..kernels import step_lower_bounds
from ..likelihoods import LOGISTIC, ORDINAL_LIKELIHOOD, PROBIT, ROBUST_MAX, likelihood_by_name, probit_for
from ..optim import OPTIMIZERS, Rprop, lbfgsb_ascent
from . import ep, exact_ep, gfitc, multiclass_ep, multiclass_vi, variational
from .sites import cavity_of, only_rows_with_sites, rows_in_site_sums
from .tied_steps import TiedFactorSteps, held_arrays, held_from_arrays
# the contract and the parts every engine shares (named here too: the loop, data-parallel rounds, the registry and
# plug-in engines import them from this module, as before they had a module of their own)
from .contract import (ALL_METHODS, CLUSTER_QUADRATIC_METHODS, EP_METHODS, QUADRATIC_METHODS, ROUND_METHODS, Engine,
                       EngineOptions, EPSchedule, FittedParts, Forwarded, GFITCSchedule, Outcome, Schedule,
                       StateLayout, anchor_arrays, anchor_from_arrays, engine_likelihood, ep_passes, factor_arrays,
                       factor_from_arrays, forwarding, hyper_step, initial_steps, make_optimizer, parameter_names,
                       quoted_names, refuse_minibatch, refuse_passes, relative_change, relative_change_on_device,
                       shared_scale_grads, with_log_prior)

__all__ = ["Engine", "StateLayout", "Schedule", "FittedParts", "EngineOptions", "ENGINES", "Forwarded", "forwarding",
           "Outcome", "EPEngine", "GFITCEngine", "SVIEngine", "QuadraticEngine", "make_engine", "parameter_names",
           "relative_change", "relative_change_on_device", "with_log_prior", "shared_scale_grads", "hyper_step",
           "initial_steps", "make_optimizer", "factor_arrays", "factor_from_arrays", "anchor_arrays",
           "anchor_from_arrays", "SPARSE_BATCH_GROWTH", "EP_METHODS", "QUADRATIC_METHODS",
           "CLUSTER_QUADRATIC_METHODS", "ALL_METHODS", "ROUND_METHODS", "Bound", "QUADRATIC_BOUNDS"]

# Rprop's growth for the sparse model's binary and ordinal batch fits (EP, SEP, ADF): 10% a step while a gradient
# keeps its sign, where the seed's (Hernandez-Lobato & Hernandez-Lobato (2016), App. A.6) is 2%. At 2% a step of 0.01
# needs 116 agreeing steps to reach 0.1, and default fits ran 87-260 iterations to their plateau; at 10% the same
# plateau came 26-46% sooner on the binary study sets with the same test NLL; 20% (iRprop's usual value) was 0.004
# worse on one (docs/small_data_defaults.md, "Rprop's growth"). Multiclass fits, the exact model and GFITC keep 2%:
# the multiclass sets took as many iterations at 10% (waveform: one split +0.009 NLL); the others were measured at 2%.
SPARSE_BATCH_GROWTH = 1.1


# -- EP / SEP / ADF ---------------------------------------------------------------------------------

def _known_nonnegative(site_precision):
    """Whether every site precision is >= 0, looked at once (one host read) when sites come from outside; sites
    on a cluster are not gathered for it (False: the passes then take the general form)."""
    if site_precision is None or is_dask_array(site_precision):
        return False
    xp = array_namespace(site_precision)
    return bool(xp.all(site_precision >= 0.0))


class EPEngine(TiedFactorSteps, Engine):
    """EP, SEP and ADF (``ep.evaluate_factor`` for how they differ): EP keeps two numbers a row, SEP and ADF
    one m x m factor. Batch EP rebuilds q exactly from all its sites at the current hyper-parameters each
    pass; minibatch EP keeps the product of its sites as a u-space factor and swaps a minibatch's old sites
    for their new ones. ``passes``: where the passes run (the binary ``ep`` or the multiclass
    ``multiclass_ep`` module, or a ``dask_engine.DaskPasses`` for rows on a cluster)."""

    has_damping = True
    threaded_passes = True  # (ep.evaluate / binary_sweep / class_sweep, and the rebuild's site sums)
    objective = "log Z_q (EP estimate)"

    @classmethod
    def round_refusal(cls, name, n_classes):
        if cavity_of(name).own_sites and n_classes > 2:  # (EP: the method's name is its cavity's, as in ``__init__``)
            return (f"data-parallel multiclass training runs {quoted_names(m for m in ROUND_METHODS if m != name)} "
                    "(multiclass EP's per-row sites are not kept per chunk yet)")
        return None

    @property
    def log_z_climbed(self):
        """EP's gradient is its log Z's at its sites' fixed point; SEP's and ADF's tied factor is no such point (their
        batch log Z falls after its best, ADF's on 9 of 10 study sets, SEP's on 4 of 30 default fits by 0.2-0.7 nats)."""
        return self.cavity.own_sites

    def __init__(self, name, kernel, Z, *, n_total, minibatch, options, passes=None):
        if name not in EP_METHODS:
            raise ValueError(f"unknown method {name!r}: use one of {EP_METHODS}")
        names = parameter_names(kernel, tuple(options.optimize))
        optimizer = make_optimizer(options.optimizer, options.learning_rate, kernel, Z, names, minibatch,
                                   rprop_growth=None if (passes is exact_ep or kernel.n_latent > 1)
                                   else SPARSE_BATCH_GROWTH)
        super().__init__(kernel, Z, names=names, optimizer=optimizer if names else None, n_total=n_total,
                         minibatch=minibatch, jitter=options.jitter, block_rows=options.block_rows)
        self.method = self.name = name
        self.shared_lengthscales = options.shared_lengthscales
        self.damping = (0.99 if minibatch else 0.5) if options.damping is None else options.damping
        self.nominal_damping = self.damping
        self.passes = passes or ep_passes(kernel)
        # the model's likelihood, as its passes take it (``ep.block_pass``, ``multiclass_ep.pair_update``)
        self.likelihood = engine_likelihood(kernel, options)
        self.likelihood_option = {"likelihood": self.likelihood}
        # The cavity its passes form (``sites.Cavity``): the EP-family methods are named as their cavities ("ep",
        # "sep", "adf"), so the name gives it, once; every branch below is on its fields, never on the name.
        self.cavity = cavity_of(name)
        self.layout = self._state_layout()
        # Batch EP (binary): every site precision known >= 0, so a pass may form its sums by symmetric products
        # (``ep.evaluate``'s ``nonnegative_sites``). True from zero sites (kept so; a checkpoint's are looked at).
        self.sites_nonnegative = True
        site_precision = site_shift = None
        if self.cavity.own_sites:
            rows = n_total if options.site_rows is None else options.site_rows
            site_precision, site_shift = self.passes.zero_sites(rows, Z), self.passes.zero_sites(rows, Z)
        factor = self.passes.uniform_factor(Z) if (minibatch or not self.cavity.own_sites) else None
        # "site_sums": batch EP's (jitter, sums of the sites) at the current kernel and Z, from the last pass when
        # it did not step the hyper-parameters (``ep.evaluate``'s ``want_next_sums``); None otherwise.
        self.state.update(nu=site_precision, mu=site_shift, factor=factor, site_sums=None)
        if self.cavity.own_sites and minibatch:
            # minibatch EP's running site product: where it holds the sites of the rows not visited since its last
            # exact rebuild (``ep.Anchor``; None: zero sites, or the product is a shard's, whose task keeps it), and
            # the minibatches visited since (by their first row): a row's site leaves the product along the
            # direction it went in along, known for the rows of one visit a rebuild; "exact": (q, log Z_q) of the
            # last exact pass while no step was taken since (``rebuild_factor``)
            self.state.update(anchor=None, visited=frozenset(), exact=None)
        self.needs_rebuild = False
        self.full_gp = self.passes is exact_ep
        # the passes of rows on a cluster (``dask_engine.DaskPasses``, an object: in memory they are modules) keep
        # the sites on the workers, and write them beside a checkpoint themselves
        self.sites_on_cluster = not isinstance(self.passes, ModuleType)
        # Distributed SEP / minibatch EP (``data_parallel``): the factor is one shard's, standing for
        # ``factor_rows`` rows, and q = prior x (others + factor) (``ep.factor_cavity``). Set by whoever
        # steps the shard; None: the factor is all the data's.
        self.others = self.factor_rows = None
        # SEP / ADF: Z held between its moves, one step in a few (``tied_steps``); a stream's moves at each call
        self.holds_inducing = True

    def __setstate__(self, state):
        """Unpickling: an engine pickled before it held its likelihood (a partial_fit stream pickled between calls by
        an older agpc) takes the one its passes then read from the kernel: the ordinal likelihood for a kernel with cut
        points, the multiclass probit for one kernel a class, else the probit."""
        super().__setstate__(state)  # (its passes' module, by name: ``backend.ModulesByName``)
        if "likelihood" not in state:
            kernel = state["state"]["kernel"]
            self.likelihood = (ORDINAL_LIKELIHOOD if getattr(kernel, "cut_points", None) is not None
                               else probit_for(kernel))
            self.likelihood_option = {"likelihood": self.likelihood}
        if "cavity" not in state:  # (an engine pickled before it held its cavity: its name gives it, as in __init__)
            self.cavity = cavity_of(self.name)
        if "layout" not in state:  # (nor its layout, which its cavity gives)
            self.layout = self._state_layout()
        if "holds_inducing" not in state:  # (a stream's, which moved Z at every call then as now)
            self.holds_inducing = False

    def _state_layout(self):
        """Its state by role: EP's own sites a row ("nu", "mu"); the tied site product, SEP's and ADF's or minibatch
        EP's running one ("factor"); minibatch EP's rebuild flag, anchor and visited minibatches, and minibatch SEP's
        and ADF's gradient in Z held between its moves (checked as they are restored)."""
        return StateLayout(per_row=("nu", "mu") if self.cavity.own_sites else (), tied_factor="factor",
                           flags=("needs_rebuild",), extras=("anchor", "visited", "held_inducing"))

    def schedule(self, settings, minibatch):
        """Batch mode: ``settings.n_warmup`` sweeps before the first hyper-parameter step; minibatch EP: its running
        site product rebuilt exactly at each epoch's end and whenever ``needs_rebuild`` says it drifted."""
        return EPSchedule(self, warmup=settings.n_warmup if self.has_params and not minibatch else 0,
                          epoch_rebuilds=minibatch and self.cavity.own_sites)

    def start_from_sites(self, site_precision, site_shift):
        """EP: start from the given sites (one a row) instead of zero ones; they are looked at once (whether
        every precision is >= 0), and copied in minibatch mode, which updates them in place (and whose running
        product of them is built by an exact rebuild before the first step)."""
        if self.minibatch:  # never write into the caller's arrays
            site_precision = self.xp.asarray(site_precision, copy=True)
            site_shift = self.xp.asarray(site_shift, copy=True)
            self.needs_rebuild = True
        self.state.update(nu=site_precision, mu=site_shift)
        self.sites_nonnegative = _known_nonnegative(site_precision)

    def evaluate(self, X, y, lo, hi, *, stepping, weights=None):
        """The pass over the rows (unchecked factorisations: a failure is a NaN log Z_q) and the summary the
        loop brings to the host: log Z_q, the failed cavities, and in batch mode the change measure."""
        xp, state = self.xp, self.state
        kernel, Z = state["kernel"], state["Z"]
        batch_ep = not self.minibatch and self.cavity.own_sites
        if batch_ep:
            self._refuse_weights(weights)  # (a batch pass has no padding; sample weights are the engine's own)
            # the sweep damps the sites itself (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 25), block by block
            result = self.passes.evaluate(kernel, Z, X, y, state["nu"], state["mu"], jitter=self.jitter,
                                          want_grad=stepping, block_rows=self.block_rows, damping=self.damping,
                                          checked=False, **self._binary_batch_options(stepping), **self._weighted(),
                                          **self.likelihood_option)
        else:
            shard = {} if self.factor_rows is None else {"others": self.others, "factor_rows": self.factor_rows}
            if self.cavity.own_sites:  # minibatch EP: its rows' sites leave the running product as they went in
                if self.factor_rows is None and lo in state["visited"]:
                    # Visited since the last rebuild (a caller stepping rows twice in an epoch): their sites are
                    # held along the directions of that visit, which are not kept. Rebuild: all along today's.
                    self.rebuild_factor(X, y)
                shard.update(anchor=state["anchor"], damping=self.damping)
            n_total = self.n_total
            if self.sample_weight is not None:  # (``sample_weight_refusal``): the rows' weights, no padding here
                self._refuse_weights(weights)
                weights = self.sample_weight[lo:hi] if self.minibatch else self.sample_weight
                if self.cavity.own_sites:  # minibatch EP by power EP, its log Z and gradient scaled by n / b (the
                    # pass scales by n_total / sum(w), the rows counted by weight: n_total sum(w) / b gives n / b)
                    shard["sample_weights"] = True
                    n_total = self.n_total * xp.sum(weights) / (hi - lo)
            result = self.passes.evaluate_factor(
                kernel, Z, row_slice(X, lo, hi), row_slice(y, lo, hi), state["factor"], cavity=self.cavity,
                n_total=n_total, site_precision=state["nu"][lo:hi, ...] if self.cavity.own_sites else None,
                site_shift=state["mu"][lo:hi, ...] if self.cavity.own_sites else None,
                jitter=self.jitter, want_grad=stepping, block_rows=self.block_rows, weights=weights, checked=False,
                **shard, **self.likelihood_option,
            )
        parts = [result["log_z"], result["n_invalid"]]
        new_factor = None
        if not self.cavity.own_sites:  # SEP / ADF: the rows' share (rows / n) of the factor is replaced by their sites
            factor_rows = self.n_total if self.factor_rows is None else self.factor_rows
            # (a batch step's rows are all the rows: their weight, summed once, is n_total's)
            share = (hi - lo if weights is None else xp.sum(weights) if self.minibatch else self.n_total) / factor_rows
            new_factor = state["factor"].combine(1.0 - self.damping * share, result["site_delta"], self.damping)
            if not self.minibatch:  # batch SEP / ADF stop on the factor's change
                old = state["factor"]
                parts += [relative_change_on_device(new_factor.precision, old.precision, xp),
                          relative_change_on_device(new_factor.shift, old.shift, xp)]
        elif batch_ep:
            parts += [result["site_change"][k] for k in range(4)]
        like = Z
        summary = xp.stack([xp.asarray(v, dtype=like.dtype, device=array_device(like)) for v in parts])
        return summary, (result, new_factor)

    def sample_weight_refusal(self):
        """None: EP weights the rows by power EP (``ep``, ``multiclass_ep``, ``exact_ep``, a cluster's
        ``DaskPasses``), SEP / ADF count them by weight in the tied factor; a data-parallel shard's engine is given
        its rows' weights a step instead (``factor_rows`` set)."""
        if self.factor_rows is None:
            return None
        return (f"method {self.name!r}: a data-parallel shard's engine takes its rows' weights with each step, not "
                "as sample_weight")

    def take_sample_weight(self, weights):
        """SEP / ADF: the tied factor stands for the rows counted by their weights (n_total = sum of the weights),
        as it would for the rows repeated (docs/weights.md)."""
        super().take_sample_weight(weights)
        if weights is not None and not self.cavity.own_sites:
            total = getattr(self.passes, "total_weight", None)  # (rows on a cluster: summed there)
            self.n_total = float(self.xp.sum(weights)) if total is None else total(weights, None)

    def _binary_batch_options(self, stepping):
        """What a binary batch pass takes besides the sites: whether they are known nonnegative, the sums of the
        sites when the last pass left them at this kernel, Z and jitter, and whether to leave them for the next
        pass (a pass that does not step the hyper-parameters). A multiclass pass takes none of these."""
        if self.state["kernel"].n_latent > 1:
            return {}
        saved = self.state.get("site_sums")
        return {"nonnegative_sites": self.sites_nonnegative, "want_next_sums": not stepping,
                "site_sums": saved[1] if saved is not None and saved[0] == self.jitter else None}

    def restore(self, snap):
        undo = snap["undo"]
        if undo is not None:  # minibatch EP updated the rows' sites in place: write the old ones back
            lo, hi, old_nu, old_mu = undo
            snap["state"]["nu"][lo:hi, ...] = old_nu
            snap["state"]["mu"][lo:hi, ...] = old_mu
        super().restore(snap)
        # The guard's revert: SEP / ADF's gradients in Z held since Z last moved go too (a bad one among them would
        # come back with every retry of the move it spoils; at most TIED_INDUCING_EVERY - 1 good ones are lost).
        self.state["held_inducing"] = None

    def apply(self, work, lo, hi, *, stepping, scalars=None):
        xp, state = self.xp, self.state
        result, new_factor = work
        kernel, Z = state["kernel"], state["Z"]
        rho, n_invalid, change = self.damping, float(scalars[1]), 0.0
        if self.cavity.own_sites and not self.minibatch:  # the sites came back damped by rho
            change = ep.relative_site_change(scalars[2:6])
            state["nu"], state["mu"] = result["site_precision"], result["site_shift"]
            sums = result.get("site_sums")  # (the hyper-parameters stay: the next pass may start from them)
            state["site_sums"] = None if (stepping or sums is None) else (self.jitter, sums)
        elif self.cavity.own_sites:  # minibatch EP: swap the rows' old sites for the damped new ones
            # In place: the site store is the one n-sized thing minibatch EP holds (2 floats a row);
            # a copy per step would double it. The rows' old values are kept to undo the step.
            old_nu = xp.asarray(state["nu"][lo:hi, ...], copy=True)
            old_mu = xp.asarray(state["mu"][lo:hi, ...], copy=True)
            state["nu"][lo:hi, ...] = rho * result["site_precision"] + (1.0 - rho) * old_nu
            state["mu"][lo:hi, ...] = rho * result["site_shift"] + (1.0 - rho) * old_mu
            self._snapshot["undo"] = (lo, hi, old_nu, old_mu)
            # the product: each old site out along the direction it was held along, the damped new one in along
            # the current one (``ep.product_change``); the rows are now held along today's directions
            state["factor"] = state["factor"].combine(1.0, result["product_change"], 1.0)
            state["exact"] = None
            if self.factor_rows is None:
                state["visited"] = state["visited"] | {lo}
        else:  # SEP / ADF: the factor built in ``evaluate``
            if not self.minibatch:
                change = float(scalars[2]) + float(scalars[3])
            state["factor"] = new_factor
        if stepping:
            names, grads = self._names_stepped(result["grads"])
            state["kernel"], state["Z"] = hyper_step(self.optimizer, names, kernel, Z, grads, self.shared_lengthscales)
            if "Z" in names and self._moves_factor():  # the tied factor goes with them (``posterior.moved_factor``)
                self._carry_factor(kernel, Z, result.get("posterior"))
        return Outcome(change=change, stepped=stepping, record=True, n_invalid=n_invalid)

    def rebuild_factor(self, X, y, want_log_z=False):
        """Minibatch EP: recompute the product of all sites at the current hyper-parameters, which anchors it
        (``ep.Anchor``: every row's site then held along its current direction). ``want_log_z`` (an epoch's end): by
        two passes over the rows (q, then log Z_q's row terms, ``passes.evaluate``), returning log Z_q of this state,
        exact (the epoch's history entry; the final pass's while no step is taken: ``state["exact"]``). Else by one
        pass over the rows with sites (``_exact_factor``: the sums alone; the guard's repair, a time budget's end)."""
        s = self.state
        self.needs_rebuild = False
        s["visited"] = frozenset()
        if not want_log_z:
            s["factor"], s["anchor"] = self._exact_factor(X, y)
            s["exact"] = None
            return None
        final = self._exact_pass(X, y)
        s["factor"], s["anchor"] = self.passes.anchored_factor(s["kernel"], s["Z"], final["posterior"], self.jitter)
        s["exact"] = (final["posterior"], float(final["log_z"]))
        return s["exact"][1]

    def _exact_factor(self, X, y, rows=None):
        """(the product of the sites at the current hyper-parameters, its anchor) by one pass over the rows of X with
        a site (``rows_in_q``), or the first ``rows`` rows, every one of them, as the time budget times the pass."""
        s = self.state
        nu, mu = s["nu"], s["mu"]
        if rows is not None:
            X, y, nu, mu = row_slice(X, 0, rows), row_slice(y, 0, rows), nu[:rows, ...], mu[:rows, ...]
        nu, mu = self._sites_in_q(nu, mu, rows)
        if rows is None and not self.sites_on_cluster:
            X, y, nu, mu = only_rows_with_sites(X, y, nu, mu)
        return self.passes.exact_factor(s["kernel"], s["Z"], X, nu, mu, jitter=self.jitter, block_rows=self.block_rows,
                                        y=y, want_anchor=True)

    def rows_in_q(self, X, with_sites=None):
        """Minibatch EP: the rows of X with a site, which its exact rebuild of q takes (``sites.rows_in_site_sums``)."""
        if not (self.minibatch and self.cavity.own_sites) or self.sites_on_cluster:
            return None
        sites = self._sites_in_q(self.state["nu"], self.state["mu"]) if with_sites is None else (self.state["nu"], None)
        return rows_in_site_sums(X, *sites, with_sites=with_sites)

    def _exact_pass(self, X, y, **options):
        """q rebuilt exactly from all of EP's sites and log Z_q at it (``passes.evaluate``, no gradient)."""
        s = self.state
        return self.passes.evaluate(s["kernel"], s["Z"], X, y, s["nu"], s["mu"], jitter=self.jitter, want_grad=False,
                                    block_rows=self.block_rows, want_sites=False, **options, **self._weighted(),
                                    **self.likelihood_option)

    def _sites_in_q(self, site_precision, site_shift, rows=None):
        """The sites as q holds them: each w_i times with sample weights (power EP), else as they are."""
        if self.sample_weight is None:
            return site_precision, site_shift
        w = self.sample_weight[:rows]  # (all of them: rows None; weights of rows on a cluster come here as NumPy)
        if site_precision.ndim > 1:  # multiclass sites (n, 2C): a row's every site
            w = w[:, None]
        return w * site_precision, w * site_shift

    def time_rebuild(self, X, y, rows):
        """The work of the rebuild of q alone (``rebuild_factor()``: the product of the sites, one pass) on the first
        ``rows`` rows."""
        self._exact_factor(X, y, rows)

    def posterior(self, X, y, want_log_z=True):
        """q at the current state and its log Z_q. EP: rebuilt exactly from all sites (one pass over X), but
        minibatch EP scores validation data on its running site product. SEP / ADF: q from the factor, and
        log Z_q by one pass in batch mode (None in minibatch mode: the history's last estimate stands for it)."""
        s = self.state
        kernel, Z = s["kernel"], s["Z"]
        if s.get("exact") is not None:  # minibatch EP at an epoch's end: this pass was made then
            post, log_z = s["exact"]
            return post, log_z if want_log_z else None
        if self.cavity.own_sites and X is not None and (want_log_z or not self.minibatch):
            # batch mode: the sums of the sites when the last pass left them at this kernel and Z (one visit)
            final = self._exact_pass(X, y, **({} if self.minibatch else self._binary_batch_options(stepping=True)))
            return final["posterior"], float(final["log_z"]) if want_log_z else None
        post = self.passes.posterior_from_factor(kernel, Z, s["factor"], jitter=self.jitter)
        if want_log_z and X is not None and not self.minibatch:
            final = self.passes.evaluate_factor(kernel, Z, X, y, s["factor"], cavity=self.cavity, n_total=self.n_total,
                                                jitter=self.jitter, want_grad=False, block_rows=self.block_rows,
                                                weights=self.sample_weight, **self.likelihood_option)
            return post, float(final["log_z"])
        return post, None

    def validation_scores(self, post, X_val, y_val):
        s = self.state
        return self.passes.validation_scores(s["kernel"], s["Z"], post, X_val, y_val, **self.likelihood_option)

    def keep(self):
        """The state, safe from later steps: minibatch EP updates its sites in place, so they are copied
        (early stopping in that mode holds the sites twice)."""
        state = dict(self.state)
        if self.cavity.own_sites and self.minibatch:
            state["nu"] = self.xp.asarray(state["nu"], copy=True)
            state["mu"] = self.xp.asarray(state["mu"], copy=True)
        return state

    def checkpoint_state(self, path, step):
        s = self.state
        sites = (s["nu"], s["mu"])
        if self.sites_on_cluster and s["nu"] is not None:  # written by the workers, chunk by chunk
            s["nu"], s["mu"], record = self.passes.store_sites(path, step, s["nu"], s["mu"])
            sites = (record, None)
        saved = dict(self._common_checkpoint(), nu=sites[0], mu=sites[1], factor=factor_arrays(s["factor"]),
                     needs_rebuild=self.needs_rebuild)
        if "anchor" in s:  # minibatch EP
            saved.update(anchor=anchor_arrays(s["anchor"]), visited=sorted(int(lo) for lo in s["visited"]))
        if s.get("held_inducing") is not None:  # minibatch SEP / ADF between two moves of Z (``tied_steps``)
            saved["held_inducing"] = held_arrays(s["held_inducing"])
        return saved

    def checkpoint_written(self, saved):
        """After the file is written: the workers' copy of the sites' record can go."""
        if self.sites_on_cluster and isinstance(saved["nu"], dict):
            self.passes.release_sites(saved["nu"])

    def restore_checkpoint(self, saved, path):
        self._restore_common(saved)
        s = self.state
        s["nu"], s["mu"] = saved["nu"], saved["mu"]
        if isinstance(saved["nu"], dict):  # sites written chunk by chunk by a fit on a dask array
            if not self.sites_on_cluster:
                raise ValueError(f"checkpoint {path} was written by a fit on a dask array: resume it on a dask array")
            s["nu"], s["mu"] = self.passes.load_sites(saved["nu"], s["Z"].dtype)
        s["factor"] = factor_from_arrays(saved["factor"])
        s["site_sums"] = None
        if "exact" in s:  # (not in a checkpoint: a resumed fit's final pass is made again)
            s["exact"] = None
        self.sites_nonnegative = self.cavity.own_sites and _known_nonnegative(s["nu"])
        self.needs_rebuild = bool(saved["needs_rebuild"])

        def refuse(why):
            return ValueError(f"{path} is not a valid agpc checkpoint: {why}")

        s["held_inducing"] = held_from_arrays(saved.get("held_inducing"), s["Z"], self._holds_inducing(), refuse)
        if "anchor" in s:  # minibatch EP: where its product holds the sites (``ep.Anchor``)
            if "anchor" not in saved:  # a checkpoint from before anchors: an exact rebuild first anchors the product
                s["anchor"], s["visited"] = None, frozenset()
                self.needs_rebuild = True
                return
            check_saved_anchor(saved["anchor"], s["kernel"], s["Z"], "engine.anchor", refuse)
            check_row_starts(saved.get("visited"), self.n_total, "engine.visited", refuse)
            s["anchor"] = anchor_from_arrays(saved["anchor"], s["kernel"])
            s["visited"] = frozenset(saved["visited"])


# -- GFITC ------------------------------------------------------------------------------------------

class GFITCEngine(Engine):
    """GFITC: EP on the FITC prior (``gfitc``), batch only. A step is one parallel damped EP sweep (Hernandez-Lobato &
    Hernandez-Lobato (2016), eq. 25 damping) at fixed hyper-parameters; the sites have settled when the largest site
    change, relative to the largest site, falls below ``tol_ep`` or after ``max_sweeps`` sweeps. The next step
    that may move the hyper-parameters then evaluates log Z_EP and its gradient at the settled sites (valid
    at an EP fixed point) and takes one Rprop step (Hernandez-Lobato & Hernandez-Lobato (2016), App. A.6), the sites
    kept as they are (EP warm-starts from them). Binary or multiclass (``ClassKernels``, sites (n, 2C))."""

    layout = StateLayout(per_row=("nu", "mu"), flags=("settled", "cycle_halved"), counts=("sweeps", "reversals"))
    objective = "log Z_EP (EP estimate)"
    has_damping = True
    threaded_passes = True  # (gfitc.evaluate's two passes)
    max_sweeps = 100  # EP sweeps at most between two hyper-parameter steps
    # Parallel EP can fall into a two-cycle: each sweep undoes the last (the sites' step reverses, its cosine with
    # the step before near -1), as rows' cavities turn invalid and valid in turn. Sample weights of 1000 and 1e-4 on
    # 50 rows (scikit-learn's class-weight check) did: every inner loop then ran its 100 sweeps, the hyper-parameters
    # stepped at sites that had not settled and log Z fell from its best. A shorter step of the damped update
    # (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 25) makes it contract again: after ``cycle_sweeps`` reversed
    # steps in a row the guard halves the damping (counted, warned; doubled back once the loop has settled, ``grow``).
    # A slow drift, each step along the last (cosine near +1, the common way of a loop slow to settle), is left
    # alone: less damping would slow it.
    cycle_sweeps = 4
    reversed_cosine = -0.5

    def __init__(self, name, kernel, Z, *, n_total, minibatch, options, passes=None):
        refuse_passes(name, passes)
        refuse_minibatch(name, minibatch)
        if options.optimizer not in (None, "rprop"):
            raise ValueError(f"method='gfitc' steps with the batch adaptive steps ('rprop'), not {options.optimizer!r}")
        names = parameter_names(kernel, tuple(options.optimize))
        super().__init__(kernel, Z, names=names,
                         optimizer=Rprop(initial_steps=initial_steps(kernel, Z, names)) if names else None,
                         n_total=n_total, minibatch=False, jitter=options.jitter, block_rows=options.block_rows)
        self.name = name
        self.shared_lengthscales = options.shared_lengthscales
        self.damping = 0.5 if options.damping is None else options.damping
        self.nominal_damping = self.damping
        self.tol_ep = options.tol
        self.likelihood = engine_likelihood(kernel, options)
        # (state "site_step": the last sweep's damped step of the site precisions, to tell a two-cycle)
        self.state.update(nu=gfitc.zero_sites(n_total, Z), mu=gfitc.zero_sites(n_total, Z), factor=None,
                          site_step=gfitc.zero_sites(n_total, Z))
        self.settled = False
        self.sweeps = 0  # since the last hyper-parameter step
        self.reversals = 0  # sweeps in a row whose step reversed the one before
        self.cycle_halved = False  # damping halved for a two-cycle in this inner loop (``grow`` waits for its end)

    def schedule(self, settings, minibatch):
        """A run ends only once the sites settled at the last hyper-parameters (``settled``)."""
        return GFITCSchedule(self)

    def evaluate(self, X, y, lo, hi, *, stepping, weights=None):
        self._refuse_weights(weights)
        s = self.state
        hyper = stepping and self.settled
        out = gfitc.evaluate(s["kernel"], s["Z"], X, y, s["nu"], s["mu"], jitter=self.jitter, want_grad=hyper,
                             block_rows=self.block_rows, likelihood=self.likelihood, **self._weighted())
        return out["log_z"], (out, hyper)

    def sample_weight_refusal(self):
        """GFITC takes sample weights by power EP on the FITC prior (``gfitc.evaluate``; docs/weights.md)."""
        return None

    def snapshot(self):
        snap = super().snapshot()
        snap["sweeps"] = (self.settled, self.sweeps, self.reversals, self.cycle_halved)
        return snap

    def restore(self, snap):
        super().restore(snap)
        self.settled, self.sweeps, self.reversals, self.cycle_halved = snap["sweeps"]

    def apply(self, work, lo, hi, *, stepping, scalars=None):
        out, hyper = work
        s = self.state
        if hyper:
            s["kernel"], s["Z"] = hyper_step(self.optimizer, self.names, s["kernel"], s["Z"], out["grads"],
                                             self.shared_lengthscales)
            self.settled, self.sweeps, self.reversals, self.cycle_halved = False, 0, 0, False
            s["site_step"] = gfitc.zero_sites(self.n_total, s["Z"])
            return Outcome(change=None, stepped=True, record=True, n_invalid=int(out["n_invalid"]))
        rho, xp = self.damping, self.xp
        # (state "nu" / "mu": the site precision / shift, as in every EP engine)
        site_precision = rho * out["site_precision"] + (1.0 - rho) * s["nu"]
        site_shift = rho * out["site_shift"] + (1.0 - rho) * s["mu"]
        step, last = site_precision - s["nu"], s["site_step"]
        # one transfer: the sites' change and the step's cosine with the last one (its two parts)
        precision_change, shift_change, along, lengths = (float(v) for v in to_host_vector(xp.stack([
            relative_change_on_device(site_precision, s["nu"], xp), relative_change_on_device(site_shift, s["mu"], xp),
            xp.sum(step * last), xp.sqrt(xp.sum(step * step) * xp.sum(last * last))])))
        change = precision_change + shift_change
        reversed_step = along < self.reversed_cosine * lengths
        s["nu"], s["mu"], s["site_step"] = site_precision, site_shift, step
        self.sweeps += 1
        self.settled = change < self.tol_ep or self.sweeps >= self.max_sweeps
        self.reversals = self.reversals + 1 if reversed_step else 0
        guard = None
        if self.reversals >= self.cycle_sweeps and not self.settled:
            self.damping *= 0.5
            self.reversals, self.cycle_halved = 0, True
            guard = {"guard_halvings": 1, "cycles": 1}
        # with nothing to learn every sweep is an iteration; otherwise the steps on the hyper-parameters are
        return Outcome(change=change, stepped=False, record=not self.has_params, n_invalid=int(out["n_invalid"]),
                       guard=guard)

    def grow(self):
        """The guard's doubling back, except within an inner loop whose two-cycle halved the damping: there it
        stays halved until the sites have settled."""
        return not self.cycle_halved and super().grow()

    def posterior(self, X, y, want_log_z=True):
        s = self.state
        final = gfitc.evaluate(s["kernel"], s["Z"], X, y, s["nu"], s["mu"], jitter=self.jitter, want_grad=False,
                               block_rows=self.block_rows, likelihood=self.likelihood, **self._weighted())
        return final["posterior"], float(final["log_z"]) if want_log_z else None

    def validation_scores(self, post, X_val, y_val):
        s = self.state
        passes = ep_passes(s["kernel"])
        return passes.validation_scores(s["kernel"], s["Z"], post, X_val, y_val, likelihood=self.likelihood)

    def checkpoint_state(self, path, step):
        s = self.state
        return dict(self._common_checkpoint(), nu=s["nu"], mu=s["mu"], site_step=s["site_step"],
                    settled=bool(self.settled), sweeps=int(self.sweeps), reversals=int(self.reversals),
                    cycle_halved=bool(self.cycle_halved))

    def restore_checkpoint(self, saved, path):
        self._restore_common(saved)
        self.state["nu"], self.state["mu"] = saved["nu"], saved["mu"]
        self.settled, self.sweeps = bool(saved["settled"]), int(saved["sweeps"])
        # (a checkpoint from before the two-cycle rule has neither: its count starts afresh)
        self.reversals = int(saved.get("reversals", 0))
        self.cycle_halved = bool(saved.get("cycle_halved", False))
        if "site_step" in saved:
            self.state["site_step"] = saved["site_step"]


# -- the variational methods ------------------------------------------------------------------------

class SVIEngine(Engine):
    """SVI (Izmailov & Kropotov (2017), sec. 3.2): a step ascends eq. 11 in (q, kernel, Z) on the rows given, the
    data term scaled by n / |M| in minibatch mode (``variational.svi_step``), with Adam (default, learning rate 0.01)
    or Adadelta (the paper's choice, with a learning rate found by grid search). q is held whitened, as GPflow's
    SVGP holds it (``variational``): the state's ``whitened_mean`` and ``whitened_chol``. Adadelta at its
    default rate 1.0 can diverge in full-batch mode; Adam at 0.01 was steady on every problem in the tests.

    With ``kernel`` a ``ClassKernels`` and Z of shape (C, m, d) (y: class indices) this is the multiclass
    robust-max baseline of Villacampa-Calvo & Hernandez-Lobato (2017), sec. 3 (``multiclass_vi``): whitened_mean (C,
    m), whitened_chol (C, m, m).

    Checkpoints of the u-space form (``mean``, ``chol``: agpc before q was held whitened) resume: their q is
    whitened at their kernel (``variational.whitened_from_unwhitened``), and their optimiser state, which was
    kept in the same whitened coordinates, is taken as it is."""

    # q(v)'s covariance factor; the u-space form's checkpoint entries and the whitened ones (``restore_checkpoint``)
    objective = "ELBO"
    threaded_passes = True  # (variational.svi_elbo, multiclass_vi.svi_elbo_multiclass)
    layout = StateLayout(triangular=("whitened_chol",),
                         legacy={"mean": "whitened_mean", "chol": "whitened_chol"})

    @classmethod
    def round_refusal(cls, name, n_classes):
        return None

    def __init__(self, name, kernel, Z, *, n_total, minibatch, options, passes=None):
        refuse_passes(name, passes)
        chosen = options.optimizer or "adam"
        if chosen not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {chosen!r} for svi: use 'adadelta' or 'adam'")
        rate = options.learning_rate
        opt = OPTIMIZERS[chosen]() if rate is None else OPTIMIZERS[chosen](learning_rate=rate)
        names = parameter_names(kernel, tuple(options.optimize)) + ["whitened_mean", "whitened_chol"]
        super().__init__(kernel, Z, names=names, optimizer=opt, n_total=n_total, minibatch=minibatch,
                         jitter=options.jitter, block_rows=options.block_rows)
        self.name = name
        self.shared_lengthscales = options.shared_lengthscales
        self.multiclass = kernel.n_latent > 1
        self.likelihood = ROBUST_MAX if self.multiclass else likelihood_by_name(options.likelihood or PROBIT.name,
                                                                                  multiclass=False)
        self.n_quadrature = options.n_quadrature
        xp, device, m = self.xp, array_device(Z), Z.shape[-2]
        identity = xp.eye(m, dtype=Z.dtype, device=device)
        self.state.update(whitened_mean=xp.zeros(Z.shape[:-1], dtype=Z.dtype, device=device),  # q(v) = N(0, I):
                          whitened_chol=identity if Z.ndim == 2 else xp.stack([identity] * Z.shape[0]))  # the prior

    def _bound(self, X, y, *, want_grad, n_total=None, weights=None):
        s = self.state
        options = dict(n_quadrature=self.n_quadrature, jitter=self.jitter, n_total=n_total, want_grad=want_grad,
                       block_rows=self.block_rows, weights=weights)
        if self.multiclass:
            return multiclass_vi.svi_elbo_multiclass(s["kernel"], s["Z"], X, y, s["whitened_mean"], s["whitened_chol"],
                                                     **options)
        return variational.svi_elbo(s["kernel"], s["Z"], X, y, s["whitened_mean"], s["whitened_chol"],
                                    likelihood=self.likelihood, **options)

    def evaluate(self, X, y, lo, hi, *, stepping, weights=None):
        like = self.state["Z"]
        if (lo, hi) != (0, X.shape[0]):  # a minibatch: read (from disk, a cluster) and held whole
            X, y = read_rows(X, lo, hi, like), read_rows(y, lo, hi, like)
        # (all rows: the bound reads them a block at a time)
        if self.sample_weight is not None:  # the weighted bound (``sample_weight_refusal``): no padding here
            self._refuse_weights(weights)
            return self._weighted_bound(X, y, lo, hi)
        elbo, grads = self._bound(X, y, want_grad=True, n_total=self.n_total, weights=weights)
        return elbo, grads

    def sample_weight_refusal(self):
        """SVI takes sample weights: the weighted ELBO sum_i w_i E_q[log p(y_i | f_i)] - KL (its data term a sum
        over rows, each row's term times its weight; docs/weights.md)."""
        return None

    def _weighted_bound(self, X, y, lo, hi):
        """The weighted ELBO on rows lo:hi (X, y already those rows): all rows, exactly; a minibatch of b rows,
        its weighted data term scaled by n / b (an unbiased estimate of the full sum, as the unweighted steps')."""
        w = self.sample_weight[lo:hi]
        if not self.minibatch:
            return self._bound(X, y, want_grad=True, weights=w)
        # ``data_scale`` counts the rows by their weights (padding); n / b is wanted: n_total * sum(w) / b gives it
        n_total = self.n_total * self.xp.sum(w) / (hi - lo)
        return self._bound(X, y, want_grad=True, n_total=n_total, weights=w)

    def apply(self, grads, lo, hi, *, stepping, scalars=None):
        s = self.state
        with_prior, _ = with_log_prior(s["kernel"], grads)  # the ELBO plus the kernel's log prior
        # (Adam / Adadelta step entrywise: equal gradients keep tied lengthscales tied)
        grads = shared_scale_grads(grads, with_prior) if self.shared_lengthscales else with_prior
        s["kernel"], s["Z"], s["whitened_mean"], s["whitened_chol"] = variational.svi_step(
            self.optimizer, self.names, s["kernel"], s["Z"], s["whitened_mean"], s["whitened_chol"], grads)
        return Outcome(change=None, stepped=True, record=True)

    def posterior(self, X, y, want_log_z=True):
        """q(u) in EP form and, with ``want_log_z``, the bound on all rows (one pass)."""
        s = self.state
        post = variational.posterior_of(s["kernel"], s["Z"], s["whitened_mean"], s["whitened_chol"], jitter=self.jitter)
        if not want_log_z or X is None:
            return post, None
        value, _ = self._bound(X, y, want_grad=False, weights=self.sample_weight)
        return post, float(value)

    def validation_scores(self, post, X_val, y_val):
        s = self.state
        if self.multiclass:
            mean, var = multiclass_ep.predict_latent(s["kernel"], s["Z"], post, X_val)
            return ep.class_scores(multiclass_vi.predictive_log_proba(mean, var), y_val)
        return ep.validation_scores(s["kernel"], s["Z"], post, X_val, y_val, self.likelihood, self.n_quadrature)

    def checkpoint_state(self, path, step):
        return dict(self._common_checkpoint(), whitened_mean=self.state["whitened_mean"],
                    whitened_chol=self.state["whitened_chol"])

    def restore_checkpoint(self, saved, path):
        legacy = self.layout.legacy
        if saved.get("optimizer") is not None:  # a u-space checkpoint's moments: already in whitened coordinates
            saved = dict(saved, optimizer=_renamed_keys(saved["optimizer"], legacy))
        self._restore_common(saved)
        s = self.state
        if "mean" in saved:  # the u-space form: whitened at the checkpoint's kernel, Z and jitter
            s["whitened_mean"], s["whitened_chol"] = variational.whitened_from_unwhitened(
                s["kernel"], s["Z"], saved["mean"], saved["chol"], jitter=self.jitter)
        else:
            s["whitened_mean"], s["whitened_chol"] = saved["whitened_mean"], saved["whitened_chol"]


def _renamed_keys(tree, names):
    """``tree`` (an optimiser's snapshot: tuples, lists, dicts) with every dict key in ``names`` renamed."""
    if isinstance(tree, dict):
        return {names.get(k, k): _renamed_keys(v, names) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_renamed_keys(v, names) for v in tree)
    return tree


@dataclass(frozen=True)
class Bound:
    """What each quadratic-bound method does (Izmailov & Kropotov (2017), Alg. 1 and sec. 4; docs/methods/vi-jj.md):
    the ``kind`` of bound on the logistic (``variational``: "jj", Jaakkola & Jordan's, sec. 4.1; "taylor", sec. 4.2),
    whether stage 2's L-BFGS-B climbs xi with the hyper-parameters (``joint_xi``: -hybrid and -full), and whether xi
    is L-BFGS-B's alone, stage 1's analytic updates of (q, xi) skipped (``full_xi``: -full). Declared once a method,
    in ``QUADRATIC_BOUNDS``: the engine reads its entry in ``__init__`` and branches on the fields."""

    kind: str
    joint_xi: bool
    full_xi: bool


QUADRATIC_BOUNDS = MappingProxyType({
    "vi-jj": Bound("jj", joint_xi=False, full_xi=False),
    "vi-jj-hybrid": Bound("jj", joint_xi=True, full_xi=False),
    "vi-jj-full": Bound("jj", joint_xi=True, full_xi=True),
    "vi-taylor": Bound("taylor", joint_xi=False, full_xi=False),
})
"""``QuadraticEngine``'s methods by name (the keys are ``QUADRATIC_METHODS``)."""


class QuadraticEngine(Engine):
    """vi-JJ, vi-JJ-hybrid, vi-JJ-full and vi-Taylor (Izmailov & Kropotov (2017), Alg. 1 and sec. 4), batch only.

    One step is one outer iteration: stage 1, ``n_upd`` analytic updates of (q, xi) by eqs. 12-13 / 17-18 and
    15 (not for vi-JJ-full); stage 2, L-BFGS-B (scipy) with at most ``maxfun`` evaluations on the kernel
    parameters and inducing points (and on xi for -hybrid and -full), xi otherwise fixed. No learning rate,
    so nothing for the guard to halve. The step's log Z is the bound after the round.

    ``passes``: where the passes over the rows run: in memory (``variational``), or on a cluster (a
    ``dask_engine.DaskPasses``: a task a chunk, xi kept on the workers beside its rows). On a cluster
    only vi-JJ and vi-Taylor: -hybrid and -full hand one xi per row to the driver's L-BFGS-B."""

    objective = "variational bound"
    log_z_climbed = False  # (its log Z is the state's after the step: the kept snapshot, the one before, is not it)
    n_upd = 3  # analytic (q, xi) updates of stage 1
    likelihood = LOGISTIC  # (the bounds are the logistic's)
    maxfun = 5  # evaluations of stage 2's L-BFGS-B round
    threaded_passes = True  # (quadratic_site_sums and quadratic_row_terms)

    def __init__(self, name, kernel, Z, *, n_total, minibatch, options, passes=None):
        method = name
        if method not in QUADRATIC_METHODS:
            raise ValueError(f"unknown method {method!r}: use one of {QUADRATIC_METHODS}")
        refuse_minibatch(method, minibatch)
        bound = QUADRATIC_BOUNDS[method]  # (the one place the name is read: the steps branch on its fields)
        # (xi climbed by the driver's L-BFGS-B is one number a row there: not a cluster's, where xi stays per chunk)
        if passes is not None and bound.joint_xi:
            raise ValueError(f"method {method!r} optimises one xi per row with L-BFGS-B on the driver: it does not "
                             f"run its passes on a cluster; {CLUSTER_QUADRATIC_METHODS} do")
        if options.shared_lengthscales:
            raise ValueError(f"method={method!r} cannot learn one shared lengthscale scale (ard=False): L-BFGS-B "
                             "climbs the bound over every lengthscale")
        super().__init__(kernel, Z, names=parameter_names(kernel, tuple(options.optimize)), optimizer=None,
                         n_total=n_total, minibatch=False, jitter=options.jitter, block_rows=options.block_rows)
        self.method = self.name = method
        self.bound = bound
        self.kind, self.joint_xi = bound.kind, bound.joint_xi
        self.passes = variational if passes is None else passes
        self.state["xi"] = None  # set at the first step, from the rows (q = prior)

    @property
    def has_params(self):
        return bool(self.names) or self.joint_xi

    def _bound(self, kernel, Z, X, y, xi, **options):
        options.update(self._weighted())  # the weighted bound, in memory or a task a chunk on a cluster
        return self.passes.quadratic_bound(kernel, Z, X, y, xi, kind=self.kind, jitter=self.jitter,
                                           block_rows=self.block_rows, **options)

    def sample_weight_refusal(self):
        """None: the weighted bound, each row's quadratic bound term times its weight (Izmailov & Kropotov (2017),
        eqs. 14 / 19 with w_i in front of row i's terms; docs/weights.md), in memory and on a cluster alike (its
        chunks' sums weighted as the rows in memory)."""
        return None

    def _labels(self, y):
        """The labels as the passes take them: in memory, all of them on the compute device; on a cluster,
        the dask array itself (its chunks stay with their rows)."""
        return y if is_dask_array(y) else read_rows(y, 0, y.shape[0], self.state["Z"])

    def evaluate(self, X, y, lo, hi, *, stepping, weights=None):
        self._refuse_weights(weights)
        s = self.state
        kernel, Z, xi = s["kernel"], s["Z"], s["xi"]
        labels = self._labels(y)
        if xi is None:
            xi = self.passes.initial_xi(kernel, Z, X, self.kind, self.block_rows)
        if not self.bound.full_xi:  # stage 1: the analytic updates of (q, xi)
            for _ in range(self.n_upd):
                out = self._bound(kernel, Z, X, labels, xi, want_grad=False)
                xi = self.passes.update_xi(out["mean"], out["var"], self.kind)

        def split(params):
            params = dict(params)
            xi_new = params.pop("xi", xi)
            Z_new = params.pop("Z", Z)
            return kernel.with_params({**kernel.params, **params}), Z_new, xi_new

        def value_and_grads(params):
            kernel_at, Z_at, xi_at = split(params)
            res = self._bound(kernel_at, Z_at, X, labels, xi_at, want_xi_grad=self.joint_xi)
            grads, value = with_log_prior(kernel_at, res["grads"], res["value"])  # L-BFGS-B climbs bound + prior
            if self.joint_xi:
                grads["xi"] = res["xi_grad"]
            return value, grads

        variables = {k: (Z if k == "Z" else kernel.params[k]) for k in self.names}
        if self.joint_xi:
            variables["xi"] = xi
        if variables and stepping:
            units = None if self.inducing_unit is None else {"Z": self.inducing_unit}
            kernel, Z, xi = split(lbfgsb_ascent(variables, value_and_grads, self.maxfun, step_lower_bounds(kernel),
                                                units=units))
        value = self._bound(kernel, Z, X, labels, xi, want_grad=False)["value"]
        return value, (kernel, Z, xi)

    def apply(self, work, lo, hi, *, stepping, scalars=None):
        s = self.state
        old_xi = s["xi"]
        s["kernel"], s["Z"], s["xi"] = work
        change = None
        if not self.has_params:  # what tells the loop that q and xi have stopped moving
            change = float("inf") if old_xi is None else relative_change(s["xi"], old_xi, self.xp)
        return Outcome(change=change, stepped=stepping, record=True)

    def posterior(self, X, y, want_log_z=True):
        s = self.state
        if s["xi"] is None:
            s["xi"] = self.passes.initial_xi(s["kernel"], s["Z"], X, self.kind, self.block_rows)
        final = self._bound(s["kernel"], s["Z"], X, self._labels(y), s["xi"], want_grad=False)
        return final["posterior"], float(final["value"]) if want_log_z else None

    def validation_scores(self, post, X_val, y_val):
        s = self.state
        return ep.validation_scores(s["kernel"], s["Z"], post, X_val, y_val, self.likelihood)

    def checkpoint_state(self, path, step):
        return dict(self._common_checkpoint(), xi=self.state["xi"])

    def restore_checkpoint(self, saved, path):
        self._restore_common(saved)
        self.state["xi"] = saved["xi"]


ENGINES = MappingProxyType({
    **{name: EPEngine for name in EP_METHODS}, "svi": SVIEngine,
    **{name: QuadraticEngine for name in QUADRATIC_METHODS}, "gfitc": GFITCEngine,
})
"""The built-in engines by the name of the method they train: each is its own factory, called as
``ENGINES[name](name, kernel, Z, n_total=, minibatch=, options=EngineOptions(...), passes=None)``."""


def make_engine(method, kernel, Z, *, n_total, minibatch, passes=None, site_precision=None, site_shift=None,
                **options):
    """The built-in engine of ``method`` (one of ``ALL_METHODS``) at (kernel, Z), its options given by name (those
    of ``EngineOptions``); EP may start from given sites (``EPEngine.start_from_sites``)."""
    if method not in ENGINES:
        raise ValueError(f"unknown method {method!r}: use one of {ALL_METHODS}")
    engine = ENGINES[method](method, kernel, Z, n_total=n_total, minibatch=minibatch,
                             options=EngineOptions(**options), passes=passes)
    if site_precision is not None:
        engine.start_from_sites(site_precision, site_shift)
    return engine
