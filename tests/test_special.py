"""gpc._special (the one copy of the special functions in gpc/_special.pxd) against references in
60-digit decimal arithmetic that share no code with it: Φ by the Taylor series of erf for |x| < 3,
and by Laplace's continued fraction for the Mills ratio R(t) = Φ(−t)/φ(t) beyond."""

from decimal import Decimal, getcontext

import numpy as np
import pytest

from gpc._special import LOG_SQRT_2PI, inverse_mills, softplus, z_plus_inverse_mills

_PREC = 60
_PI = Decimal("3.14159265358979323846264338327950288419716939937510582097494")


def _pdf(x):
    return (-(x * x) / 2).exp() / (2 * _PI).sqrt()


def _mills(t, depth):
    """R(t) = 1/(t + 1/(t + 2/(t + 3/(t + ...)))), evaluated backwards from ``depth``."""
    k = Decimal(0)
    for j in range(depth, 0, -1):
        k = j / (t + k)
    return 1 / (t + k)


def _cdf_series(x):
    """Φ(x) = (1 + erf(x/√2))/2 by erf's Taylor series (|x| < 3: no term above e^4.5)."""
    z = x / Decimal(2).sqrt()
    term = total = z
    n = 0
    while abs(term) > Decimal(10) ** -(_PREC - 5):
        n += 1
        term = -term * z * z / n
        total += term / (2 * n + 1)
    return (1 + 2 / _PI.sqrt() * total) / 2


def _reference(x, depth=4000):
    """(r(x), x + r(x)) with r = φ/Φ, in decimal arithmetic, rounded to float."""
    getcontext().prec = _PREC
    x = Decimal(repr(float(x)))
    if x <= -3:
        r = 1 / _mills(-x, depth)
    elif x < 3:
        r = _pdf(x) / _cdf_series(x)
    else:
        r = _pdf(x) / (1 - _pdf(x) * _mills(x, depth))
    return float(r), float(x + r)


XS = np.concatenate([np.linspace(-40.0, 40.0, 321),
                     [-5.0001, -4.9999, -3.0001, -2.9999, 2.9999, 3.0001, -1e-8, 1e-8]])


def test_the_reference_has_converged():
    """The continued fraction at depth 4000 equals depth 8000's to the reference's own precision:
    the reference is not the limit of the comparison below."""
    for x in (-40.0, -3.0001, 3.0001, 12.0):
        assert _reference(x, 4000) == _reference(x, 8000)


def test_inverse_mills_ratio_matches_the_decimal_reference():
    ref = np.array([_reference(x) for x in XS])
    r = inverse_mills(XS)
    zr = z_plus_inverse_mills(XS)
    rel_r = np.abs(r - ref[:, 0]) / np.maximum(ref[:, 0], 1e-300)
    # x ≤ 5: erfcx is good to a few units of rounding (measured ≤ 3.6e-15)
    assert np.max(rel_r[XS <= 5]) < 1e-14
    # 5 < x ≤ 37: r ≈ φ(x), and e^(−x²/2) carries the rounding of x²/2 ≈ 685, each half-ulp a
    # relative 7.6e-14 of the result (measured up to 2.3e-13, three of them); that is the
    # conditioning of any double formula here, not erfcx's
    mid = (XS > 5) & (XS <= 37)
    assert np.max(rel_r[mid]) < 5e-13
    # above x ≈ 37.5 the true r(x) < 1.5e-310 is below double's normal range: 0 is returned
    assert np.all(np.abs(r[XS > 37.5] - ref[XS > 37.5, 0]) < 1e-300)
    # z + r(z) by the continued fraction below −5 has no cancellation (measured ≤ 7e-15 anywhere)
    np.testing.assert_allclose(zr, ref[:, 1], rtol=2e-14)
    # the tail asymptotics the continued fraction exists for: r(z) ≈ −z − 1/z for z ≪ 0
    np.testing.assert_allclose(r[XS == -40.0], 40.0 + 1.0 / 40.0, rtol=1e-6)


def test_inverse_mills_keeps_shape_and_scalars():
    assert inverse_mills(0.0).shape == ()
    assert inverse_mills(0.0) == pytest.approx(np.sqrt(2.0 / np.pi), rel=1e-15)
    assert inverse_mills(np.zeros((2, 3))).shape == (2, 3)


def test_softplus_matches_logaddexp_and_does_not_overflow():
    x = np.concatenate([np.linspace(-50, 50, 1001), [-800.0, 800.0, 0.0]])
    # both are log(1 + e^x) with one rounding of log1p and one of exp: a few ulps
    np.testing.assert_allclose(softplus(x), np.logaddexp(0.0, x), rtol=4e-16, atol=1e-300)
    assert softplus(800.0) == 800.0 and softplus(-800.0) == 0.0


def test_log_sqrt_2pi():
    getcontext().prec = _PREC
    assert LOG_SQRT_2PI == float((2 * _PI).ln() / 2)      # correctly rounded
