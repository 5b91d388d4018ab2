"""What the accountant must report (task/privacy.py, docs/privacy.md): an (epsilon, delta) that is a sound upper
bound - never below the exact privacy curve of the mechanism pflower runs - and not looser than the classical
Rényi-DP bound; amplification only where clients are sampled; more rounds or less noise never lower epsilon.

Published formulas and values used:
- exact privacy curve of the Gaussian mechanism (Balle & Wang 2018, "Improving the Gaussian mechanism for
  differential privacy", Theorem 8): with mu = sensitivity / std, delta(eps) = Phi(mu/2 - eps/mu) - e^eps
  Phi(-mu/2 - eps/mu); r compositions with the same noise multiplier sigma are one Gaussian mechanism with
  mu = sqrt(r) / sigma (Dong, Roth & Su 2022, "Gaussian differential privacy", Corollary 3.3);
- classical RDP bound (Mironov 2017, "Rényi differential privacy", Propositions 3 and 7): the Gaussian mechanism is
  (alpha, alpha / (2 sigma^2))-RDP, so r rounds give eps <= rho + 2 sqrt(rho log(1/delta)) with rho = r / (2 sigma^2)
  at the best order;
- Abadi et al. 2016, "Deep learning with differential privacy", Section 3.1: the Poisson-sampled Gaussian with
  q = 0.01, sigma = 4, 10,000 steps, delta = 1e-5 is (1.26, 1e-5)-DP by their moments accountant.
"""

import itertools
import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from task.privacy import (
    Bound,
    PrivacyConfigError,
    calibrate_central,
    calibrate_local,
    central_bound,
    central_epsilon,
    local_bound,
    local_epsilon,
)

CASES = [(1.0, 1, 1e-5), (1.0, 10, 1e-5), (2.0, 50, 1e-5), (0.8, 3, 1e-3), (5.0, 100, 1e-6), (1.5, 200, 1e-5)]


def exact_gaussian_epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    """The exact epsilon of ``rounds`` Gaussian mechanisms of noise multiplier sigma (Balle & Wang 2018, Thm 8)."""
    mu = math.sqrt(rounds) / noise_multiplier

    def excess(eps):
        return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu) - delta

    high = 1.0
    while excess(high) > 0:
        high *= 2
    return brentq(excess, 0.0, high, xtol=1e-10)


def classical_rdp_epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    """Mironov 2017's bound at the best order: rho + 2 sqrt(rho log(1/delta)), rho = rounds / (2 sigma^2)."""
    rho = rounds / (2 * noise_multiplier**2)
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))


@pytest.mark.parametrize("sigma,rounds,delta", CASES)
def test_central_epsilon_with_every_client_is_that_of_the_gaussian_mechanism_of_sigma(sigma, rounds, delta):
    """Every client in every round: the mean moves by at most C/m when one client's data is added or removed,
    the noise has std sigma C/m, so it is the Gaussian mechanism with noise multiplier sigma."""
    eps = central_epsilon(sigma, rounds, delta)
    assert exact_gaussian_epsilon(sigma, rounds, delta) <= eps <= classical_rdp_epsilon(sigma, rounds, delta)


@pytest.mark.parametrize("sigma,rounds,delta", CASES)
def test_local_epsilon_is_that_of_the_gaussian_mechanism_of_half_sigma(sigma, rounds, delta):
    """One client's release against any other data set of that client: the clipped change moves by up to 2C and
    the noise has std sigma C, so the noise multiplier is sigma / 2 (which epsilon of sigma would understate)."""
    eps = local_epsilon(sigma, rounds, delta)
    assert exact_gaussian_epsilon(sigma / 2, rounds, delta) <= eps <= classical_rdp_epsilon(sigma / 2, rounds, delta)


def test_the_pinned_accountant_is_within_the_published_moments_accountant_value():
    """Abadi et al. 2016, Sec. 3.1: q = 0.01, sigma = 4, T = 10,000, delta = 1e-5 gives eps ~ 1.26 by the moments
    accountant.  The RDP accountant pflower uses (Flower's, on dp-accounting) is tighter, so at most that; and it
    stays above the central-limit value of the same mechanism (Bu et al. 2020, "Deep learning with Gaussian
    differential privacy": mu = q sqrt(T (e^{1/sigma^2} - 1))), which is asymptotically exact."""
    from flwr.serverapp import GaussianPrivacyEvent, NeighboringRelation, PrivacyConfig, RdpAccountant, SamplingMethod

    q, sigma, steps, delta, population = 0.01, 4.0, 10_000, 1e-5, 60_000
    accountant = RdpAccountant(
        PrivacyConfig(delta, population, NeighboringRelation.ADD_OR_REMOVE_ONE, SamplingMethod.POISSON)
    )
    accountant.compose(GaussianPrivacyEvent(sigma, int(q * population), population), count=steps)
    eps = accountant.get_epsilon(delta)
    mu_clt = q * math.sqrt(steps * (math.exp(1 / sigma**2) - 1))
    assert exact_gaussian_epsilon(1 / mu_clt, 1, delta) < eps <= 1.26


def sampled_round_lower_bound(noise_multiplier: float, rate: float, delta: float) -> float:
    """The exact epsilon of one round for one pair of neighbouring runs, so a lower bound on any sound epsilon.

    Replace-one neighbours with the cohort drawn without replacement at ``rate``: client i's clipped update is +C
    in one run and -C in the other, every other client's is 0.  Client i is in the cohort with probability
    ``rate``; the released sum is then N(0, (sigma C)^2) with probability 1 - rate and N(+-C, (sigma C)^2) otherwise
    (in units of C below).  delta(eps) = integral of max(0, p - e^eps q), solved for eps (Balle et al. 2018,
    "Privacy amplification by subsampling", the hockey-stick divergence of the two mixtures).
    """
    x = np.linspace(-40 * noise_multiplier - 2, 40 * noise_multiplier + 2, 400_001)
    rest = (1 - rate) * norm.pdf(x, 0, noise_multiplier)
    p, q = rest + rate * norm.pdf(x, 1, noise_multiplier), rest + rate * norm.pdf(x, -1, noise_multiplier)

    def excess(eps):
        return float(np.sum(np.maximum(0.0, p - math.exp(eps) * q)) * (x[1] - x[0])) - delta

    return 0.0 if excess(0.0) <= 0 else brentq(excess, 0.0, 200.0, xtol=1e-8)


@pytest.mark.parametrize(
    "sigma,population,cohort,delta",
    [(1.0, 10, 3, 1e-5), (0.5, 10, 5, 1e-5), (2.0, 100, 10, 1e-3), (1.0, 1000, 999, 1e-5)],
)
def test_a_sampled_round_is_never_reported_below_its_exact_privacy_loss(sigma, population, cohort, delta):
    """A cohort of 999 in 1,000 is barely amplified: its exact loss is close to the unsampled replace-one Gaussian
    (noise multiplier sigma / 2), which counting the run's sigma against replace-one neighbours would understate."""
    eps = central_epsilon(sigma, 1, delta, cohort / population, "fixed")
    assert eps >= sampled_round_lower_bound(sigma, cohort / population, delta)


def test_sampling_amplifies_and_a_fixed_size_cohort_amplifies_less_against_the_coalition():
    """Poisson sampling (add-or-remove-one) and fixed-size cohorts (replace-one, against the coalition that knows
    who was drawn): epsilon grows with the rate and never exceeds the same rounds without sampling; a fixed-size
    cohort still gains from the rounds a client was not drawn in, far less than Poisson sampling."""
    sigma, rounds, delta = 1.0, 20, 1e-5
    everyone = central_epsilon(sigma, rounds, delta)  # add-or-remove-one, every client every round
    replaced = local_epsilon(sigma, rounds, delta)  # the replace-one Gaussian without amplification
    rates = (0.01, 0.1, 0.6, 0.99)
    poisson = [central_epsilon(sigma, rounds, delta, q, "poisson") for q in rates]
    fixed = [central_epsilon(sigma, rounds, delta, q, "fixed") for q in rates]
    assert poisson == sorted(poisson) and poisson[-1] <= everyone + 1e-9
    assert fixed == sorted(fixed) and fixed[-1] <= replaced + 1e-9
    assert poisson[1] < everyone / 4 and fixed[1] < replaced / 2  # a tenth of the clients per round
    assert all(p < f for p, f in zip(poisson, fixed, strict=True))


@pytest.mark.parametrize(
    "sigma,rate,delta",
    [(1.0, 0.3, 1e-5), (0.5, 0.5, 1e-5), (2.0, 0.1, 1e-3), (1.0, 0.999, 1e-5)],
)
def test_a_poisson_round_is_never_reported_below_its_exact_privacy_loss(sigma, rate, delta):
    """One Poisson-sampled round, add-or-remove-one: the released sum is N(0, sigma^2) without the client and, with
    it, the mixture (1 - q) N(0, sigma^2) + q N(1, sigma^2) (in units of C); its exact epsilon (the larger of the two
    hockey-stick divergences, numerically) is a lower bound on any sound epsilon."""
    x = np.linspace(-40 * sigma - 2, 40 * sigma + 2, 400_001)
    without = norm.pdf(x, 0, sigma)
    with_it = (1 - rate) * without + rate * norm.pdf(x, 1, sigma)

    def exact(p, q):
        def excess(eps):
            return float(np.sum(np.maximum(0.0, p - math.exp(eps) * q)) * (x[1] - x[0])) - delta

        return 0.0 if excess(0.0) <= 0 else brentq(excess, 0.0, 200.0, xtol=1e-8)

    bound = central_bound(sigma, 1, delta, rate, "poisson")
    assert bound.epsilon >= max(exact(with_it, without), exact(without, with_it))
    assert bound.accountant in ("pld", "rdp") and bound.epsilon == min(bound.rdp, bound.pld)


def coalition_epsilon_from_first_principles(sigma: float, rounds: int, rate: float, delta: float) -> float:
    """Fixed-size cohorts against the coalition of the other clients, who know from their own draws whether the
    target was drawn: given the k rounds it was in (Binomial(rounds, rate), the same in both neighbouring runs), the
    releases are k replace-one Gaussian mechanisms (sensitivity 2C, noise sigma C), one Gaussian of mu = 2 sqrt(k) /
    sigma (Dong, Roth & Su 2022); the observed k is public, so the privacy curve is the mixture
    delta(eps) = sum_k P(k) delta_mu_k(eps), each delta_mu by Balle & Wang 2018, Theorem 8."""
    from scipy.stats import binom

    k = np.arange(1, rounds + 1)
    mu, weight = 2 * np.sqrt(k) / sigma, binom.pmf(k, rounds, rate)

    def curve(eps):
        gaussian = norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu)
        return float(np.dot(weight, gaussian)) - delta

    return brentq(curve, 0.0, 500.0, xtol=1e-10)


def test_the_bound_a_fixed_size_cohort_owes_the_coalition_at_the_old_target_10_is_15_97():
    """The old accountant calibrated 10 of 100 clients per round, 100 rounds, to epsilon 10 with Wang et al.'s
    amplification (dp-accounting's Rényi-DP accountant, sampling without replacement): sigma 2.59.  That bound
    assumes nobody knows who was drawn; the other 99 clients together do.  Against them the same run is at 15.97,
    and pflower reports that; its own calibration to 10 holds against them."""
    import dp_accounting

    wang = dp_accounting.calibrate_dp_mechanism(
        lambda: dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE),
        lambda s: dp_accounting.SelfComposedDpEvent(
            dp_accounting.SampledWithoutReplacementDpEvent(100, 10, dp_accounting.GaussianDpEvent(s / 2)), 100
        ),
        10.0,
        1e-5,
        dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
    )
    assert round(wang, 2) == 2.59
    coalition = coalition_epsilon_from_first_principles(wang, 100, 0.1, 1e-5)
    assert round(coalition, 2) == 15.97
    reported = central_bound(wang, 100, 1e-5, 0.1, "fixed")
    assert reported.accountant == "coalition" and coalition <= reported.epsilon <= coalition + 1e-6
    honest = calibrate_central(10.0, 1e-5, 100, 0.1, "fixed")
    assert coalition_epsilon_from_first_principles(honest, 100, 0.1, 1e-5) <= 10.0 + 1e-6 and honest > wang


@pytest.mark.parametrize("rate,sampling", [(1.0, "poisson"), (0.3, "poisson"), (0.3, "fixed")])
def test_epsilon_grows_with_rounds_and_shrinks_with_noise_and_delta(rate, sampling):
    by_rounds = [central_epsilon(1.0, r, 1e-5, rate, sampling) for r in (1, 5, 20)]
    assert all(a < b for a, b in itertools.pairwise(by_rounds))
    by_sigma = [central_epsilon(s, 10, 1e-5, rate, sampling) for s in (0.5, 1.0, 4.0)]
    assert all(a > b for a, b in itertools.pairwise(by_sigma))
    by_delta = [central_epsilon(1.0, 10, d, rate, sampling) for d in (1e-8, 1e-3)]
    assert all(a > b for a, b in itertools.pairwise(by_delta))
    by_releases = [local_epsilon(1.0, r, 1e-5) for r in (1, 3, 10)]
    assert all(a < b for a, b in itertools.pairwise(by_releases))


def test_no_rounds_cost_nothing_and_no_noise_gives_no_guarantee():
    assert central_epsilon(1.0, 0, 1e-5) == 0.0 and local_epsilon(1.0, 0, 1e-5) == 0.0
    assert central_epsilon(0.0, 3, 1e-5, 0.4) == math.inf and local_epsilon(0.0, 1, 1e-5) == math.inf
    # the whole bound, as the records report it (dp-accountant in the summary): neither accountant was asked, so
    # both of their columns carry the same 0 or infinity and the accountant is named "none"
    nothing, no_noise = Bound(0.0, "none", 0.0, 0.0), Bound(math.inf, "none", math.inf, math.inf)
    assert central_bound(1.0, 0, 1e-5, 0.4, "fixed") == central_bound(1.0, 0, 1e-5) == nothing
    assert local_bound(1.0, 0, 1e-5) == nothing
    assert central_bound(0.0, 3, 1e-5, 0.4, "fixed") == central_bound(0.0, 3, 1e-5, 0.4) == no_noise
    assert local_bound(0.0, 1, 1e-5) == no_noise


@pytest.mark.parametrize("count", ["rounds", "releases"])
def test_a_negative_count_is_refused_with_its_name(count):
    with pytest.raises(PrivacyConfigError) as refused:
        central_bound(1.0, -2, 1e-5) if count == "rounds" else local_bound(1.0, -2, 1e-5)
    assert str(refused.value) == f"{count} must be >= 0, got -2"


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"delta": 0.0}, "dp-delta"),
        ({"delta": 1.0}, "dp-delta"),
        ({"noise_multiplier": -1.0}, "dp-noise-multiplier"),
        ({"rounds": -1}, "rounds"),
        ({"rate": 1.1}, "rate"),
        ({"rate": 0.0}, "rate"),
        ({"sampling": "stratified"}, "dp-sampling"),
    ],
)
def test_impossible_accounting_settings_are_refused(kwargs, match):
    args = {"noise_multiplier": 1.0, "rounds": 3, "delta": 1e-5, "rate": 0.5, "sampling": "fixed", **kwargs}
    with pytest.raises(PrivacyConfigError, match=match):
        central_epsilon(**args)


def test_a_negative_number_of_releases_is_refused():
    with pytest.raises(PrivacyConfigError, match=r"^releases must be >= 0, got -1$"):
        local_epsilon(1.0, -1, 1e-5)


# ---------------------------------------------------------------------------------------------- PLD beside RDP
@pytest.mark.parametrize("sigma,rounds,delta", CASES[:4])
def test_without_sampling_the_pld_bound_is_the_exact_curve_and_is_reported_as_the_tighter(sigma, rounds, delta):
    """dp-accounting's privacy-loss-distribution accountant is pessimistic (an upper bound) and, for Gaussian
    compositions, within its discretization of the exact curve; Rényi DP is looser there, so PLD is reported."""
    exact = exact_gaussian_epsilon(sigma, rounds, delta)
    bound = central_bound(sigma, rounds, delta)
    assert exact <= bound.pld <= exact + max(2e-3, 2e-4 * exact)
    assert bound.accountant == "pld" and bound.epsilon == bound.pld < bound.rdp
    assert bound.rdp == pytest.approx(central_epsilon_rdp(sigma, rounds, delta))
    local = local_bound(sigma, rounds, delta)
    exact_local = exact_gaussian_epsilon(sigma / 2, rounds, delta)
    assert exact_local <= local.epsilon <= exact_local + max(2e-3, 2e-4 * exact_local) and local.accountant == "pld"


def central_epsilon_rdp(sigma, rounds, delta):
    """The Rényi-DP bound through Flower's accountant directly, as before PLD was added."""
    from flwr.serverapp import GaussianPrivacyEvent, NeighboringRelation, PrivacyConfig, RdpAccountant, SamplingMethod

    config = PrivacyConfig(delta, 8, NeighboringRelation.ADD_OR_REMOVE_ONE, SamplingMethod.NO_AMPLIFICATION)
    accountant = RdpAccountant(config)
    accountant.compose(GaussianPrivacyEvent(sigma, 8, 8), count=rounds)
    return accountant.get_epsilon(delta)


def test_poisson_sampling_is_accounted_by_pld_with_renyi_dp_beside_it():
    """Poisson sampling is what dp-accounting's PLD accountant handles exactly (add-or-remove-one): reported, the
    Rényi-DP bound beside it; a fixed-size cohort is reported against the coalition, both accountants' bounds beside
    it being those of the same rounds without amplification (valid, much looser)."""
    import dp_accounting

    bound = central_bound(1.0, 10, 1e-5, 0.1, "poisson")
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0)), 10)
    assert bound.accountant == "pld" and bound.pld < bound.rdp
    assert pld.get_epsilon(1e-5) <= bound.epsilon <= pld.get_epsilon(1e-5) + 2e-3
    fixed = central_bound(1.0, 10, 1e-5, 0.1, "fixed")
    assert fixed.accountant == "coalition" and fixed.pld == pytest.approx(local_bound(1.0, 10, 1e-5).pld)
    assert fixed.epsilon < fixed.pld / 2


# ---------------------------------------------------------------------------------------------- calibration
@pytest.mark.parametrize(
    "target,rounds,rate,sampling",
    [
        (4.0, 10, 1.0, "poisson"),
        (1.0, 5, 1.0, "poisson"),
        (16.0, 10, 1.0, "poisson"),
        (4.0, 20, 0.5, "poisson"),
        (4.0, 20, 0.5, "fixed"),
    ],
)
def test_the_calibrated_noise_reaches_the_target_epsilon_and_no_less_noise_would(target, rounds, rate, sampling):
    sigma = calibrate_central(target, 1e-5, rounds, rate, sampling)
    assert central_epsilon(sigma, rounds, 1e-5, rate, sampling) <= target
    assert central_epsilon(sigma * 0.999, rounds, 1e-5, rate, sampling) > target  # within 0.1 % of the optimum


def test_local_calibration_reaches_the_target_over_the_releases():
    sigma = calibrate_local(4.0, 1e-5, 11)
    assert local_epsilon(sigma, 11, 1e-5) <= 4.0 < local_epsilon(sigma * 0.999, 11, 1e-5)


@pytest.mark.parametrize("rounds,rate,sampling", [(1, 1.0, "poisson"), (1, 0.1, "fixed"), (3, 0.1, "poisson")])
def test_a_single_round_or_a_small_rate_can_be_calibrated(rounds, rate, sampling):
    """The smallest runs the accountant allows (one round, a tenth of the clients a round) are calibrated, not
    refused."""
    sigma = calibrate_central(2.0, 1e-5, rounds, rate, sampling)
    assert central_epsilon(sigma, rounds, 1e-5, rate, sampling) <= 2.0
    assert central_epsilon(sigma * 0.999, rounds, 1e-5, rate, sampling) > 2.0
    single = calibrate_local(2.0, 1e-5, 1)
    assert local_epsilon(single, 1, 1e-5) <= 2.0 < local_epsilon(single * 0.999, 1, 1e-5)


def test_a_candidate_whose_report_is_above_the_target_is_raised_to_the_smallest_multiplier_within_it():
    """Each accountant's calibration is a candidate; where the reported (tighter) bound of the smallest one still
    lies above the target, the multiplier is raised in steps of 0.01 % to the first whose report is within it."""
    from task.privacy import _smallest_within

    def report(sigma):  # a bound falling with the noise: within 0.5 from sigma 2 on
        return 1.0 / sigma

    raised = _smallest_within(report, 0.5, [1.3, 5.0])
    assert 2.0 <= raised <= 2.0 * 1.0001 and report(raised) <= 0.5
    assert _smallest_within(report, 0.5, [3.0, 2.5]) == 2.5  # already within: the smallest candidate, unchanged


@pytest.mark.parametrize("target", [0.0, -1.0, math.inf])
def test_an_impossible_target_is_refused(target):
    with pytest.raises(PrivacyConfigError, match=r"a target epsilon must be finite and > 0"):
        calibrate_central(target, 1e-5, 10)
    with pytest.raises(PrivacyConfigError, match=r"a target epsilon must be finite and > 0"):
        calibrate_local(target, 1e-5, 10)


def test_calibration_needs_a_round_and_a_rate_in_the_unit_interval():
    with pytest.raises(PrivacyConfigError, match=r"calibration needs rounds >= 1 and a rate in \(0, 1\]"):
        calibrate_central(4.0, 1e-5, 0)
    with pytest.raises(PrivacyConfigError, match=r"calibration needs rounds >= 1 and a rate in \(0, 1\]"):
        calibrate_central(4.0, 1e-5, 3, 1.1)
    with pytest.raises(PrivacyConfigError, match=r"calibration needs at least one release, got 0"):
        calibrate_local(4.0, 1e-5, 0)
