"""The model's structure is declared, not read from types or names: a kernel says how many latent GPs it gives the
covariances of (``Kernel.n_latent``), their kernels and inducing points (``latent_kernels``, ``latent_parts``), its
covariance kernel without the likelihood's parameters (``covariance_kernel``) and its cut points; the engines pick
passes and the default likelihood from it. A method's GPU step model is its registry entry's (``Method.gpu_step``)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from agpc import batch_size
from agpc import methods as M
from agpc.inference import ep, exact_ep, multiclass_ep
from agpc.inference.contract import EngineOptions, engine_likelihood, ep_passes
from agpc.kernels import RBF, ClassKernels, Linear, OrdinalKernel
from agpc.likelihoods import LOGISTIC, MULTICLASS_PROBIT, PROBIT, probit_for

AGPC = Path(__file__).resolve().parents[1] / "agpc"
TYPE_TEST = re.compile(r"isinstance\([^)]*\b(ClassKernels|OrdinalKernel)\b")


def test_a_single_kernel_is_one_latent_gp():
    kernel = RBF(lengthscales=[1.0, 2.0])
    Z = np.zeros((3, 2))
    assert kernel.n_latent == 1 and kernel.cut_points is None
    assert kernel.latent_kernels() == (kernel,)
    ((part, Zc),) = kernel.latent_parts(Z)
    assert part is kernel and Zc is Z
    assert kernel.covariance_kernel is kernel
    combined = RBF() + Linear()
    assert combined.n_latent == 1 and combined.covariance_kernel is combined


def test_class_kernels_are_one_latent_gp_a_class():
    kernels = ClassKernels([RBF(), RBF(amplitude=2.0), Linear()])
    Z = np.arange(3 * 4 * 2, dtype=float).reshape(3, 4, 2)
    assert kernels.n_latent == 3 and kernels.cut_points is None
    assert kernels.latent_kernels() == kernels.kernels
    parts = kernels.latent_parts(Z)
    assert [k for k, _ in parts] == list(kernels.kernels)
    for c, (_, Zc) in enumerate(parts):
        np.testing.assert_array_equal(Zc, Z[c])
    assert kernels.covariance_kernel is kernels
    assert kernels.for_inputs(Z[0]).n_latent == 3


def test_class_kernels_need_two_classes():
    """One latent GP is a single kernel's model: ``n_latent > 1`` is what says "one a class"."""
    for few in ([], [RBF()]):
        with pytest.raises(ValueError, match="at least two classes"):
            ClassKernels(few)


def test_an_ordinal_kernel_is_one_latent_gp_with_cut_points():
    latent = RBF(lengthscales=[0.5, 1.5])
    kernel = OrdinalKernel(latent, [-1.0, 0.5])
    assert kernel.n_latent == 1
    assert kernel.latent_kernels() == (kernel,)  # (its passes take it whole: the cut points ride with it)
    assert kernel.covariance_kernel is latent
    np.testing.assert_allclose(kernel.cut_points, [-1.0, 0.5])
    with pytest.raises(TypeError, match="wraps an agpc kernel"):
        OrdinalKernel(kernel, [0.0])


def test_the_passes_and_the_default_likelihood_follow_the_latent_gps():
    binary, per_class = RBF(), ClassKernels([RBF(), RBF(), RBF()])
    assert ep_passes(binary) is ep and ep_passes(per_class) is multiclass_ep
    assert probit_for(binary) is PROBIT and probit_for(per_class) is MULTICLASS_PROBIT
    assert engine_likelihood(binary, EngineOptions()) is PROBIT
    assert engine_likelihood(per_class, EngineOptions()) is MULTICLASS_PROBIT
    assert engine_likelihood(binary, EngineOptions(likelihood="logistic")) is LOGISTIC
    with pytest.raises(ValueError, match="unknown likelihood 'logistic'"):  # (a binary one for one GP a class)
        engine_likelihood(per_class, EngineOptions(likelihood="logistic"))


def test_the_exact_passes_pick_the_multiclass_ones_by_the_latent_gps():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 2))
    y = rng.integers(0, 3, size=12).astype(float)
    kernels = ClassKernels([RBF(lengthscales=[1.0, 1.0], noise=0.05).for_inputs(X) for _ in range(3)])
    Z = np.stack([X] * 3)
    sites = exact_ep.zero_sites(12, Z)  # (n, 2C): multiclass EP's storage
    out = exact_ep.evaluate(kernels, Z, X, y, sites, sites, jitter=1e-6, want_grad=False, want_sites=False)
    assert len(out["posterior"]) == 3  # (one posterior a class: the multiclass passes ran)


def test_no_module_tests_a_kernel_type_for_the_structure():
    """``isinstance(..., ClassKernels | OrdinalKernel)`` nowhere but where a kernel's own algebra is (none today)."""
    found = {path.name for path in AGPC.rglob("*.py") if TYPE_TEST.search(path.read_text(encoding="utf-8"))}
    assert not found, sorted(found)


# -- the GPU step model, from the registry ----------------------------------------------------------------------

def test_the_built_in_step_models_are_the_registry_entries():
    assert M.gpu_step_model("ep") == M.DEFAULT_GPU_STEP
    assert M.gpu_step_model("sep") == M.gpu_step_model("adf") == {**M.DEFAULT_GPU_STEP, "launches": 345}
    assert M.gpu_step_model("svi")["launches"] == 322
    assert dict(batch_size.GPU_STEP_MODEL) == {name: M.get_method(name).gpu_step for name in ("ep", "sep", "adf",
                                                                                               "svi")}
    # (a batch-only method, and a name not registered: EP's, as before the model moved to the registry)
    assert M.gpu_step_model("gfitc") == M.gpu_step_model("no-such-method") == M.DEFAULT_GPU_STEP


def test_a_registered_method_steps_as_its_engine_unless_it_declares_a_step():
    own = {"launches": 100, "block_launches": 50, "flops_per_row_m2": 5.0, "elements_per_row_m": 10.0}
    on_adf = M.Method("toy-tied", family="ep", engine="adf", capabilities={"minibatch"})
    declared = M.Method("toy-declared", family="ep", engine="adf", capabilities={"minibatch"}, gpu_step=own)
    for method in (on_adf, declared):
        M.register_method(method)
    try:
        assert M.gpu_step_model("toy-tied") == M.gpu_step_model("adf")
        assert M.gpu_step_model("toy-declared") == own
        launches, _ = batch_size.gpu_step_seconds("toy-declared", 400, 200, _Throughput())
        assert launches == pytest.approx(100 * _Throughput.launch_seconds)
    finally:
        for method in (on_adf, declared):
            M.unregister_method(method.name)


def test_a_step_model_has_every_key():
    with pytest.raises(ValueError, match=r"gpu_step lacks \['elements_per_row_m'\]"):
        M.Method("toy-partial", family="ep", engine="ep",
                 gpu_step={"launches": 1, "block_launches": 1, "flops_per_row_m2": 1.0})


class _Throughput:
    """A device's throughput as ``backend.step_time`` reads it."""

    flops, bytes, launch_seconds = 1e13, 1e12, 1e-5
