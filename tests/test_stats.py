"""Exact Student-t quantiles (against published tables) and the mean +- 95% CI of compare."""

import math
import statistics

import pytest

from podsrl.experiments.stats import mean_ci, regularized_incomplete_beta, t_cdf, t_quantile

# two-sided 95% (p = 0.975) and 99% (p = 0.995) quantiles to 6 significant digits: the
# standard t table (NIST/SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.2, lists them
# to 3 decimals; these agree with it and with an independent mpmath computation)
T975 = {1: 12.7062, 2: 4.30265, 3: 3.18245, 4: 2.77645, 5: 2.57058, 6: 2.44691, 7: 2.36462, 8: 2.30600,
        9: 2.26216, 10: 2.22814, 11: 2.20099, 12: 2.17881, 13: 2.16037, 14: 2.14479, 15: 2.13145, 19: 2.09302,
        20: 2.08596, 25: 2.05954, 30: 2.04227, 40: 2.02108, 60: 2.00030, 100: 1.98397, 1000: 1.96234}
T995 = {1: 63.6567, 2: 9.92484, 3: 5.84091, 5: 4.03214, 10: 3.16927, 30: 2.74999}


@pytest.mark.parametrize("dof, expected", sorted(T975.items()))
def test_t_quantile_975_matches_the_table(dof, expected):
    assert t_quantile(0.975, dof) == pytest.approx(expected, abs=6e-5 * expected)


@pytest.mark.parametrize("dof, expected", sorted(T995.items()))
def test_t_quantile_995_matches_the_table(dof, expected):
    assert t_quantile(0.995, dof) == pytest.approx(expected, rel=6e-5)


def test_closed_forms_and_symmetry():
    # dof 1 is the Cauchy distribution, dof 2 has a closed form too
    for p in (0.6, 0.9, 0.975, 0.999):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p))), rel=1e-10)
        assert t_quantile(1 - p, 7) == pytest.approx(-t_quantile(p, 7), rel=1e-12)
        assert t_cdf(t_quantile(p, 7), 7) == pytest.approx(p, abs=1e-12)
    assert t_cdf(0.0, 5) == 0.5
    # many degrees of freedom: the normal distribution
    assert t_quantile(0.975, 10**7) == pytest.approx(statistics.NormalDist().inv_cdf(0.975), rel=1e-6)


def test_incomplete_beta_against_closed_forms():
    for x in (0.0, 0.1, 0.5, 0.93, 1.0):
        assert regularized_incomplete_beta(1, 1, x) == pytest.approx(x, abs=1e-14)  # uniform
        assert regularized_incomplete_beta(2, 1, x) == pytest.approx(x * x, abs=1e-14)
        assert regularized_incomplete_beta(1, 3, x) == pytest.approx(1 - (1 - x) ** 3, abs=1e-14)


def test_bad_arguments():
    for p, dof in ((0.0, 3), (1.0, 3), (0.5, 0)):
        with pytest.raises(ValueError):
            t_quantile(p, dof)


def test_mean_ci_uses_the_exact_quantile():
    values = [1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0, 89.0, 144.0, 233.0]  # 11 degrees of freedom
    mean, half = mean_ci(values)
    assert mean == pytest.approx(statistics.fmean(values))
    assert half == pytest.approx(2.20099 * statistics.stdev(values) / math.sqrt(12), rel=1e-5)
    assert math.isnan(mean_ci([3.0])[1])
