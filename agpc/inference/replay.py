"""The evaluate half of a minibatch step at fixed shapes, replayed from a CUDA graph where it can be (issue 17).

On a GPU a minibatch step is a few hundred small kernels, each launched from Python: the step is bound by
launch overhead, not arithmetic. A CUDA graph records the launches of one ``evaluate`` (``engines``: the pass
over the minibatch and the gradient, device work only, ending in the step's summary) and replays them with one
``graph.launch()``. A graph reads and writes the memory it was captured with, so everything that differs from
one step to the next must sit in *device buffers updated in place*, never in Python values frozen at capture::

  the minibatch    rows, labels, and per-row weights: every minibatch is padded to the batch size (the last one
                   is shorter) with rows of weight 0, which change nothing (``ep.block_pass``,
                   ``variational.svi_elbo``: the padded step equals the step on the rows alone);
  the state        the kernel's parameters, Z, SEP / ADF / minibatch EP's likelihood factor and the minibatch's
                   own sites (EP), SVI's whitened q (whitened_mean, whitened_chol): copied into buffers before each step;
  damping          read by SEP / ADF's factor update in ``evaluate``: a 0-d buffer (the guard halves it);
  the rest         jitter (raised by the guard) and n_total (``partial_fit``) enter ``evaluate`` as host numbers:
                   a change of either captures a new graph rather than replaying a stale one.

The optimiser's step count (Adam's bias correction, ``optim.Adam``) and its learning rate enter only the
``apply`` half, which runs eagerly every step (it holds the host-side decisions of the step: the guard, minibatch
EP's rebuild), so they are read fresh at each step and are not captured.

``ReplayedEvaluation.evaluate`` has the engine's ``evaluate`` signature; ``training.Trainer`` calls it in place of
the engine's when ``step_replay`` is on (off by default until a GPU run of
``gpu_tests/test_step_replay.py`` is recorded in docs/results.md). The buffer path runs on any namespace (the
eager form: the same buffers, the same closure each step, no graph); the graph is captured only on CuPy with a
CUDA device, and capture that fails (CuPy refuses some cuBLAS / cuSOLVER calls while a stream captures) falls
back to the eager form, saying why (``mode``).
"""

from __future__ import annotations

from ..backend import array_device, read_rows
from . import ep
from .engines import EPEngine, SVIEngine

__all__ = ["ReplayedEvaluation", "GRAPH_REPLAY"]

GRAPH_REPLAY = "CUDA graph replay"


def no_capture_reason(xp):
    """The reason a graph cannot be captured on namespace ``xp``, or None when it can (CuPy with a device)."""
    if "cupy" not in xp.__name__:
        return f"not CuPy (namespace {xp.__name__})"
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as exc:  # (no driver, no runtime: CuPy raises its own error types)
        return f"no CUDA device ({type(exc).__name__}: {exc})"
    return None


def _unsupported(engine):
    """Why ``engine``'s evaluation cannot take the fixed-shape form, or None when it can."""
    if not engine.minibatch:
        return "not a minibatch step"
    if isinstance(engine, SVIEngine):
        return None
    if isinstance(engine, EPEngine):
        if engine.passes is not ep:
            return "the multiclass EP pass takes no row weights" if getattr(engine.passes, "__name__", "").endswith(
                "multiclass_ep") else "passes on a cluster"
        return None
    return f"{type(engine).__name__} has no minibatch step"


class ReplayedEvaluation:
    """``engine.evaluate`` for minibatches of at most ``batch_size`` rows, through device buffers at fixed shapes;
    on CuPy with CUDA (and ``capture``), captured once into a CUDA graph and replayed at every later step.

    ``mode``: ``GRAPH_REPLAY``, or "eager (reason)" once the choice is made (at the capture, the second step: the
    first runs eagerly to compile what it launches; capture may fail);
    ``report(line)`` is called once with "step: <mode>" (the estimator prints it with ``verbose``)."""

    def __init__(self, engine, batch_size, *, capture=True, report=None):
        self.engine = engine
        self.batch_size = int(batch_size)
        self.xp = engine.xp
        self.report = report
        self.unsupported = _unsupported(engine)
        reason = self.unsupported or (None if capture else "capture turned off") or no_capture_reason(self.xp)
        self.mode = None if reason is None else f"eager ({reason})"  # decided at the first capture otherwise
        self.buffers = None if self.unsupported else self._make_buffers()
        self.rows = None  # the real rows of the minibatch in the buffers (the weights' ones)
        self.graph = None  # (key, graph, stream, private memory pool, captured outputs)
        self.warmed_up = False  # an eager step has run (compiled the kernels): capture may follow
        if self.mode is not None:
            self._announce()

    # -- buffers -------------------------------------------------------------------------------------

    def _make_buffers(self):
        xp, state = self.xp, self.engine.state
        Z = state["Z"]
        device, dtype, b = array_device(Z), Z.dtype, self.batch_size
        zeros = lambda shape: xp.zeros(shape, dtype=dtype, device=device)  # noqa: E731
        buffers = {
            "rows": zeros((b, Z.shape[-1])), "labels": zeros((b,)), "weights": zeros((b,)), "damping": zeros(()),
            "params": {name: xp.asarray(value, copy=True) for name, value in state["kernel"].params.items()},
            "Z": xp.asarray(Z, copy=True),
        }
        if isinstance(self.engine, EPEngine):
            factor = state["factor"]
            buffers["factor"] = (xp.asarray(factor.precision, copy=True), xp.asarray(factor.shift, copy=True))
            if self.engine.per_row_sites:
                buffers["sites"] = (zeros((b,)), zeros((b,)))
        else:
            buffers["q"] = (xp.asarray(state["whitened_mean"], copy=True),
                            xp.asarray(state["whitened_chol"], copy=True))
        return buffers

    def fill_buffers(self, X, y, lo, hi):
        """Copy the minibatch rows lo:hi and the engine's current state into the buffers, in place."""
        engine, buffers, state = self.engine, self.buffers, self.engine.state
        rows = hi - lo
        like = buffers["Z"]
        buffers["rows"][:rows, ...] = read_rows(X, lo, hi, like)
        buffers["labels"][:rows] = read_rows(y, lo, hi, like)
        if rows < self.batch_size:
            # padding: copies of the first row (finite, valid labels), weighed 0 below
            buffers["rows"][rows:, ...] = buffers["rows"][:1, ...]
            buffers["labels"][rows:] = buffers["labels"][:1]
        if rows != self.rows:  # (the host knows the count: no transfer when it does not change)
            buffers["weights"][:rows] = 1.0
            buffers["weights"][rows:] = 0.0
            self.rows = rows
        for name, buffer in buffers["params"].items():
            buffer[...] = state["kernel"].params[name]
        buffers["Z"][...] = state["Z"]
        if "factor" in buffers:
            buffers["factor"][0][...] = state["factor"].precision
            buffers["factor"][1][...] = state["factor"].shift
            buffers["damping"][...] = engine.damping
        if "sites" in buffers:  # minibatch EP: the rows' own sites (padding: no site)
            for buffer, store in zip(buffers["sites"], (state["nu"], state["mu"])):
                buffer[:rows] = store[lo:hi]
                if rows < self.batch_size:
                    buffer[rows:] = 0.0
        if "q" in buffers:
            buffers["q"][0][...] = state["whitened_mean"]
            buffers["q"][1][...] = state["whitened_chol"]

    def _state_on_buffers(self):
        """The engine's state with every array a buffer. New objects each time: a kernel caches its constrained
        parameters (``kernels.Stationary.lengthscales``), which must be computed from the buffers' contents."""
        buffers, state = self.buffers, dict(self.engine.state)
        state["kernel"] = state["kernel"].with_params(dict(buffers["params"]))
        state["Z"] = buffers["Z"]
        if "factor" in buffers:
            state["factor"] = ep.Factor(*buffers["factor"])
        if "sites" in buffers:
            state["nu"], state["mu"] = buffers["sites"]
        if "q" in buffers:
            state["whitened_mean"], state["whitened_chol"] = buffers["q"]
        return state

    def evaluate_buffers(self, stepping):
        """The engine's ``evaluate`` on the buffers: the closure a graph captures. The engine reads its state and
        damping from attributes; they point at the buffers for the call and are put back after it."""
        engine, buffers = self.engine, self.buffers
        state, damping = engine.state, engine.damping
        engine.state = self._state_on_buffers()
        if "factor" in buffers:
            engine.damping = buffers["damping"]
        try:
            return engine.evaluate(buffers["rows"], buffers["labels"], 0, self.batch_size, stepping=stepping,
                                   weights=buffers["weights"])
        finally:
            engine.state, engine.damping = state, damping

    def _real_rows(self, work, rows, copy):
        """The evaluation's work as ``engine.apply`` takes it: minibatch EP's new sites cut to the real rows;
        ``copy``: every array ``apply`` reads copied out of the graph's memory (the next launch rewrites it,
        and ``apply`` keeps some of them: SEP's new factor, the optimiser's gradients)."""
        xp = self.xp
        own = (lambda a: xp.asarray(a, copy=True)) if copy else (lambda a: a)
        if isinstance(self.engine, SVIEngine):
            return {name: own(g) for name, g in work.items()}
        result, new_factor = work
        result = dict(result, grads={name: own(g) for name, g in result["grads"].items()},
                      site_delta=ep.Factor(own(result["site_delta"].precision), own(result["site_delta"].shift)))
        if self.engine.per_row_sites:
            result["site_precision"] = own(result["site_precision"][:rows])
            result["site_shift"] = own(result["site_shift"][:rows])
        if new_factor is not None:
            new_factor = ep.Factor(own(new_factor.precision), own(new_factor.shift))
        return result, new_factor

    # -- the step ------------------------------------------------------------------------------------

    def evaluate(self, X, y, lo, hi, *, stepping, weights=None):
        """As the engine's ``evaluate``. Rows already weighted by the caller, or an engine without the
        fixed-shape form: the engine's own evaluation."""
        if self.unsupported is not None or weights is not None:
            return self.engine.evaluate(X, y, lo, hi, stepping=stepping, weights=weights)
        rows = hi - lo
        if rows > self.batch_size:
            raise ValueError(f"a minibatch of {rows} rows does not fit the replayed step's {self.batch_size}")
        # The first step runs eagerly even where a graph will be captured: it compiles every kernel the step
        # launches and sets up the CUDA libraries' handles and workspaces, none of which belongs in a graph.
        if self.mode == GRAPH_REPLAY or (self.mode is None and self.warmed_up):
            replayed = self._replay(X, y, lo, hi, stepping)
            if replayed is not None:
                summary, work = replayed
                return summary, self._real_rows(work, rows, copy=True)
        self.fill_buffers(X, y, lo, hi)
        summary, work = self.evaluate_buffers(stepping)
        self.warmed_up = True
        return summary, self._real_rows(work, rows, copy=False)

    def _replay(self, X, y, lo, hi, stepping):
        """Fill the buffers and launch the graph (captured first when none fits the engine's host numbers) on a
        stream of its own, ordered after the work before it and before the work after it by events (no host
        synchronisation). Returns the graph's outputs (its own memory), or None when capture failed: ``mode``
        then says why, and the eager form runs."""
        import cupy

        engine = self.engine
        key = (bool(stepping), float(engine.jitter), int(engine.n_total))
        caller = cupy.cuda.get_current_stream()
        stream = self.graph[2] if self.graph is not None else cupy.cuda.Stream(non_blocking=True)
        stream.wait_event(caller.record())  # the state the last ``apply`` wrote, on the caller's stream
        with stream:
            self.fill_buffers(X, y, lo, hi)
            if self.graph is None or self.graph[0] != key:
                if not self._capture(key, stream, stepping):
                    caller.wait_event(stream.record())
                    return None
            self.graph[1].launch(stream=stream)
        # the caller's stream reads the outputs (the summary's transfer, the copies ``apply`` takes) after the
        # launch; the next launch waits for that stream again, so the summary needs no copy of its own
        caller.wait_event(stream.record())
        return self.graph[4]

    def _capture(self, key, stream, stepping):
        """Capture ``evaluate_buffers`` on ``stream``; its memory comes from a pool of its own, kept with the
        graph (a block the graph freed and reused during capture must never be handed to other arrays, which the
        next launch would overwrite). False, with ``mode`` saying why, when CuPy cannot capture the step."""
        import cupy

        pool = cupy.cuda.MemoryPool()
        refused = None
        with cupy.cuda.using_allocator(pool.malloc):
            try:
                stream.begin_capture()
                try:
                    outputs = self.evaluate_buffers(stepping)
                except Exception as exc:  # CuPy refuses e.g. cuSOLVER's factorisations during capture
                    refused = exc
                # ended whatever happened (a stream left capturing would refuse all later work); ending an
                # invalidated capture raises too, but the first refusal is the one that says why
                graph = stream.end_capture()
            except Exception as exc:
                refused = refused or exc
        if refused is not None:
            self.graph = None
            self.mode = f"eager (capture failed: {type(refused).__name__}: {refused})"
            self._announce()
            return False
        self.graph = (key, graph, stream, pool, outputs)
        if self.mode is None:
            self.mode = GRAPH_REPLAY
            self._announce()
        return True

    def _announce(self):
        if self.report is not None:
            self.report(f"step: {self.mode}")
