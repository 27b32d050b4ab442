"""Chi-square goodness of fit of counts over cells, for the sampling and verifier tests."""

import torch
from scipy.stats import chisquare


def chi_square_pvalue(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Goodness of fit of counts to a law over the same cells.

    A count in a cell the law forbids (probability 0) is an outright failure (p-value 0).
    Cells expecting fewer than 5 draws are pooled so the chi-square approximation holds.
    """
    observed = observed.double()
    expected = expected_probs.double() / expected_probs.double().sum() * observed.sum()
    forbidden = expected == 0
    if observed[forbidden].sum() > 0:
        return 0.0
    small = (expected < 5) & ~forbidden
    large = ~small & ~forbidden
    obs = observed[large].tolist()
    exp = expected[large].tolist()
    if small.any():
        obs.append(observed[small].sum().item())
        exp.append(expected[small].sum().item())
    if len(obs) < 2:
        return 1.0
    return float(chisquare(obs, exp).pvalue)
