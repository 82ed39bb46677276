"""The full-GP limit of ordinal EP: agpc's inducing-point EP with m = n points at the rows against an independent
textbook full-GP ordinal EP (tests/reference_ordinal_ep.py)."""

import numpy as np

from agpc.inference import ep
from agpc.kernels import RBF, OrdinalKernel
from agpc.likelihoods import ORDINAL_LIKELIHOOD
from reference_ordinal_ep import ordinal_full_gp_ep
from test_ordinal import CUTS, ordinal_data


# -- the full-GP limit --------------------------------------------------------------------------------------

def test_full_gp_limit_matches_textbook_ep():
    """m = n inducing points at the rows, kernel and cut points fixed: agpc's batch EP at its fixed point is
    full-GP ordinal EP (Rasmussen & Williams (2006), Alg. 3.5 with Chu & Ghahramani (2005)'s moments), the
    independent reference in tests/reference_ordinal_ep.py: the same sites, posterior and log Z. Tolerances: the
    jitter 1e-10 on K(Z, Z) and the FITC variance it leaves (~1e-10) move the fixed point by about that much."""
    X, y = ordinal_data(30, 7, d=1)
    # no latent noise: agpc puts it in the likelihood's variance (a site on u), the reference on f's prior
    kernel = OrdinalKernel(RBF(lengthscales=[1.0], amplitude=2.0, noise=0.0), CUTS).for_inputs(X)
    Z = X.copy()
    nu = mu = np.zeros(30)
    for _ in range(400):
        out = ep.evaluate(kernel, Z, X, y.astype(float), nu, mu, jitter=1e-10, damping=0.7, want_grad=False,
                          likelihood=ORDINAL_LIKELIHOOD)
        nu, mu = out["site_precision"], out["site_shift"]
    out = ep.evaluate(kernel, Z, X, y.astype(float), nu, mu, jitter=1e-10, want_grad=False,
                      likelihood=ORDINAL_LIKELIHOOD)
    reference = ordinal_full_gp_ep(kernel.K(X), y, CUTS)
    np.testing.assert_allclose(nu, reference["site_precision"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(mu, reference["site_precision"] * reference["site_mean"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(out["log_z"]), reference["log_z"], rtol=1e-7)
    mean, var = ep.predict_latent(kernel, Z, out["posterior"], X)
    np.testing.assert_allclose(mean, reference["posterior_mean"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(var, np.diagonal(reference["posterior_cov"]), rtol=1e-5, atol=1e-7)
