"""Covariance functions: values, diagonals and gradients given adjoints (no autodiff).

Inference code computes the adjoints of its objective L with respect to the three kernel matrices it
uses -- dL/dKmm (m x m), dL/dKnm (n x m) and dL/dKdiag (n) -- and the kernel turns them into gradients
for its own parameters and for the inducing inputs Z (GPy's ``update_gradients_full`` idea). A new
kernel therefore needs no change to any inference code.

Parameters are stored unconstrained (logs). ``amplitude`` is the signal variance, ``noise`` the variance
of additive latent noise at the data points: it enters ``Kdiag`` (the prior variance of f at a data
point) but never a cross-covariance, so ``K(Z, Z)`` and ``K(X, Z)`` do not see it (DESIGN.md).
"""

from __future__ import annotations

import math
from functools import cached_property

from .backend import array_device, array_namespace, asarray_like, host_array

__all__ = ["Stationary", "RBF", "Matern52", "KERNELS", "kernel_from_spec"]

PARAM_NAMES = ("log_lengthscales", "log_amplitude", "log_noise")


class Stationary:
    """Base of stationary kernels k(x, z) = amplitude * kappa(r^2), r^2 = sum_j ((x_j - z_j)/l_j)^2.

    A subclass defines only ``kappa(r2)`` and ``dkappa_dr2(r2)``; the base owns the parameters, the
    scaled distances and the chain rule to lengthscales and inputs (one matrix product of O(n m d) for
    all d lengthscales, no n x m x d temporary).

    Parameters
    ----------
    lengthscales : float or sequence of float
        One per input dimension (ARD), or a single value broadcast to every dimension at first use.
    amplitude : float
        Signal variance.
    noise : float
        Variance of additive latent noise at the data points (0 for none).
    """

    name = "Stationary"

    def __init__(self, lengthscales=1.0, amplitude=1.0, noise=0.0):
        ls = [float(v) for v in (lengthscales if hasattr(lengthscales, "__len__") else [lengthscales])]
        amplitude, noise = float(amplitude), float(noise)
        if not ls or not all(math.isfinite(v) and v > 0 for v in ls):
            raise ValueError(f"lengthscales must be positive and finite, got {lengthscales!r}")
        if not (math.isfinite(amplitude) and amplitude > 0):
            raise ValueError(f"amplitude must be a positive finite variance, got {amplitude!r}")
        if not (math.isfinite(noise) and noise >= 0):
            raise ValueError(f"noise must be a non-negative finite variance, got {noise!r}")
        # Built on the host from Python numbers; moved to the data's namespace by ``for_inputs``.
        self.params = {
            "log_lengthscales": host_array([math.log(v) for v in ls]),
            "log_amplitude": host_array(math.log(amplitude)),
            "log_noise": host_array(math.log(noise) if noise > 0 else -math.inf),  # -inf: no noise, gradient 0
        }

    # -- parameters ------------------------------------------------------------------------------

    @classmethod
    def from_params(cls, params):
        """A kernel holding the given unconstrained parameters (arrays of any namespace)."""
        kernel = cls.__new__(cls)
        kernel.params = dict(params)
        return kernel

    def with_params(self, params):
        return type(self).from_params(params)

    def for_inputs(self, X):
        """This kernel with its parameters in X's namespace and device, lengthscales broadcast to X's width."""
        xp = array_namespace(X)
        device = array_device(X)
        d = X.shape[1]
        out = {k: asarray_like(v, xp, device=device, dtype=X.dtype) for k, v in self.params.items()}
        ls = out["log_lengthscales"]
        if ls.shape[0] == 1 and d != 1:
            out["log_lengthscales"] = xp.broadcast_to(ls, (d,)) + xp.zeros((d,), dtype=X.dtype, device=device)
        elif ls.shape[0] != d:
            raise ValueError(f"kernel has {ls.shape[0]} lengthscales but the data have {d} features")
        return self.with_params(out)

    # A kernel's parameters never change in place (``with_params`` makes a new kernel), so their
    # constrained values are computed once per kernel, not once per use (one operation each on a device).
    @cached_property
    def lengthscales(self):
        return array_namespace(self.params["log_lengthscales"]).exp(self.params["log_lengthscales"])

    @cached_property
    def amplitude(self):
        return array_namespace(self.params["log_amplitude"]).exp(self.params["log_amplitude"])

    @cached_property
    def noise(self):
        return array_namespace(self.params["log_noise"]).exp(self.params["log_noise"])

    def spec(self):
        """JSON-able description (type name); the parameter arrays are saved beside it."""
        return {"type": self.name}

    def __repr__(self):
        from .backend import to_numpy

        ls = to_numpy(self.lengthscales)
        return (
            f"{self.name}(lengthscales={[float(v) for v in ls]!r}, "
            f"amplitude={float(to_numpy(self.amplitude)):.6g}, noise={float(to_numpy(self.noise)):.6g})"
        )

    # -- the radial profile (subclasses) ---------------------------------------------------------

    def kappa(self, r2):
        raise NotImplementedError

    def dkappa_dr2(self, r2):
        raise NotImplementedError

    # -- values ----------------------------------------------------------------------------------

    def _scaled(self, X):
        return X / self.lengthscales

    def _r2(self, Xs, Zs):
        """Squared distances from one matrix product: |x|^2 + |z|^2 - 2 x.z, with both sets centred on the
        mean of Zs first, so that a large common offset (x + 1e7) does not cancel catastrophically. The
        round-off that can still make an entry slightly negative is cut with ``maximum``, not ``clip``
        (array-api-compat's clip copies to the host on CuPy)."""
        xp = array_namespace(Xs, Zs)
        centre = xp.mean(Zs, axis=0)
        Xc = Xs - centre
        Zc = Xc if Zs is Xs else Zs - centre
        gram = Xc @ Zc.mT
        if Zc is Xc:
            # K(Z, Z): the norms taken from the Gram matrix's own diagonal make r^2_jj = 0 exactly and keep
            # r^2 consistent with one rounded Gram matrix (float32: Kmm's diagonal was 1 - 1e-4 at
            # lengthscales of 0.1 standard deviations, where |z|^2 ~ 10^3 and eps |z|^2 ~ 10^-4).
            x2 = z2 = xp.linalg.diagonal(gram)
        else:
            x2 = xp.vecdot(Xc, Xc, axis=-1)
            z2 = xp.vecdot(Zc, Zc, axis=-1)
        return xp.maximum(x2[:, None] + z2[None, :] - 2.0 * gram, 0.0)

    def K(self, X, Z=None):
        """Cross-covariance K(X, Z) (no noise term), shape (n, m); ``Z=None`` means K(X, X) without noise."""
        Xs = self._scaled(X)
        Zs = Xs if Z is None else self._scaled(Z)
        return self.amplitude * self.kappa(self._r2(Xs, Zs))

    def Kdiag(self, X):
        """Prior variances of f at the data points, amplitude + noise, shape (n,)."""
        xp = array_namespace(X)
        return xp.full((X.shape[0],), 1.0, dtype=X.dtype, device=array_device(X)) * (
            self.amplitude + self.noise
        )

    # -- gradients -------------------------------------------------------------------------------

    def _distance_grads(self, G, Xs, Zs):
        """Chain rule through r^2 for a block whose adjoint w.r.t. r^2 is G (shape (n, m)).

        Returns (gradient w.r.t. log lengthscales (d,), gradient w.r.t. X (n, d), w.r.t. Z (m, d)).
        r2_nm = sum_j (xs_nj - zs_mj)^2 with xs = x / l, so d r2 / d log l_j = -2 (xs_nj - zs_mj)^2.
        """
        xp = array_namespace(G, Xs, Zs)
        # Every term is a function of xs_n - zs_m: centring both on the mean of Zs changes nothing but the
        # round-off (the expanded squares would cancel catastrophically for inputs far from the origin).
        centre = xp.mean(Zs, axis=0)
        Xs, Zs = Xs - centre, (Xs - centre if Zs is Xs else Zs - centre)
        row = xp.sum(G, axis=1)  # (n,)
        col = xp.sum(G, axis=0)  # (m,)
        GZ = G @ Zs  # (n, d)
        GtX = G.mT @ Xs  # (m, d)
        cross = xp.sum(Xs * GZ, axis=0)  # sum_nm G_nm xs_nj zs_mj
        d_log_l = -2.0 * (
            xp.sum((Xs * Xs) * row[:, None], axis=0) + xp.sum((Zs * Zs) * col[:, None], axis=0) - 2.0 * cross
        )
        inv_l = 1.0 / self.lengthscales
        dX = 2.0 * (Xs * row[:, None] - GZ) * inv_l
        dZ = 2.0 * (Zs * col[:, None] - GtX) * inv_l
        return d_log_l, dX, dZ

    def _dK_dr2(self, K, Xs, Zs):
        """dK/d(r^2) for a block whose values K are known (subclasses may use K to skip the distances)."""
        return self.amplitude * self.dkappa_dr2(self._r2(Xs, Zs))

    def grads(self, dKmm, dKnm, dKdiag, X, Z, Knm=None):
        """Gradients of L from its adjoints w.r.t. K(Z, Z), K(X, Z) and Kdiag(X).

        Any adjoint may be ``None``. Returns a dict with one entry per parameter in ``self.params``
        (same shapes) and ``"Z"`` (m, d). The adjoints are read entry-wise: dL = sum_jk dKmm_jk dKmm_jk,
        so a non-symmetric dKmm is fine. ``Knm``, if the caller already has K(X, Z), saves recomputing it.
        """
        xp = array_namespace(Z)
        amp = self.amplitude
        Zs = self._scaled(Z)
        zero = xp.zeros((), dtype=Z.dtype, device=array_device(Z))
        d_log_l = xp.zeros(Z.shape[1], dtype=Z.dtype, device=array_device(Z))
        dZ = xp.zeros(Z.shape, dtype=Z.dtype, device=array_device(Z))
        d_log_amp = zero
        d_log_noise = zero
        if dKmm is not None:
            r2 = self._r2(Zs, Zs)
            d_log_amp = d_log_amp + xp.sum(dKmm * (amp * self.kappa(r2)))
            G = dKmm * (amp * self.dkappa_dr2(r2))
            g_l, g_first, g_second = self._distance_grads(G, Zs, Zs)
            d_log_l = d_log_l + g_l
            dZ = dZ + g_first + g_second
        if dKnm is not None:
            Xs = self._scaled(X)
            if Knm is None:
                Knm = amp * self.kappa(self._r2(Xs, Zs))
            d_log_amp = d_log_amp + xp.sum(dKnm * Knm)
            G = dKnm * self._dK_dr2(Knm, Xs, Zs)
            g_l, _, g_Z = self._distance_grads(G, Xs, Zs)
            d_log_l = d_log_l + g_l
            dZ = dZ + g_Z
        if dKdiag is not None:
            total = xp.sum(dKdiag)
            d_log_amp = d_log_amp + total * amp
            d_log_noise = d_log_noise + total * self.noise
        return {"log_lengthscales": d_log_l, "log_amplitude": d_log_amp, "log_noise": d_log_noise, "Z": dZ}


class RBF(Stationary):
    """ARD squared exponential: kappa = exp(-r^2 / 2)."""

    name = "RBF"

    def kappa(self, r2):
        return array_namespace(r2).exp(-0.5 * r2)

    def dkappa_dr2(self, r2):
        return -0.5 * array_namespace(r2).exp(-0.5 * r2)

    def _dK_dr2(self, K, Xs, Zs):
        return -0.5 * K  # no distances, no exponentials: the block's values suffice


class Matern52(Stationary):
    """ARD Matern 5/2: kappa = (1 + sqrt5 r + 5 r^2 / 3) exp(-sqrt5 r)."""

    name = "Matern52"

    def kappa(self, r2):
        xp = array_namespace(r2)
        r = xp.sqrt(r2)
        return (1.0 + math.sqrt(5.0) * r + (5.0 / 3.0) * r2) * xp.exp(-math.sqrt(5.0) * r)

    def dkappa_dr2(self, r2):
        # d kappa / d r = -(5/3) r (1 + sqrt5 r) exp(-sqrt5 r); divided by dr2/dr = 2r (finite at r = 0)
        xp = array_namespace(r2)
        r = xp.sqrt(r2)
        return -(5.0 / 6.0) * (1.0 + math.sqrt(5.0) * r) * xp.exp(-math.sqrt(5.0) * r)


KERNELS = {cls.name: cls for cls in (RBF, Matern52)}


def kernel_from_spec(spec, params):
    """Rebuild a kernel from ``spec()`` and its parameter arrays (used by model loading)."""
    try:
        cls = KERNELS[spec["type"]]
    except (KeyError, TypeError):
        raise ValueError(f"unknown kernel specification {spec!r}; known kernels: {sorted(KERNELS)}") from None
    missing = [name for name in PARAM_NAMES if name not in params]
    if missing:
        raise ValueError(f"kernel parameters missing: {missing}")
    return cls.from_params({name: params[name] for name in PARAM_NAMES})


class ClassKernels:
    """One kernel per class (multiclass models: one latent GP per class, seed 001 sec. 2.1).

    ``params`` is one flat dict ("<class>:<name>" -> array) so that the optimisers, which step dicts
    of arrays, need to know nothing about classes; ``kernels[c]`` is class c's own kernel.
    """

    def __init__(self, kernels):
        self.kernels = tuple(kernels)
        if not self.kernels:
            raise ValueError("ClassKernels needs at least one kernel")

    def __len__(self):
        return len(self.kernels)

    def __getitem__(self, c):
        return self.kernels[c]

    @property
    def params(self):
        return {f"{c}:{name}": value for c, k in enumerate(self.kernels) for name, value in k.params.items()}

    def with_params(self, params):
        return ClassKernels(
            k.with_params({name: params[f"{c}:{name}"] for name in k.params}) for c, k in enumerate(self.kernels)
        )

    def for_inputs(self, X):
        return ClassKernels(k.for_inputs(X) for k in self.kernels)

    def __repr__(self):
        return f"ClassKernels({list(self.kernels)!r})"
