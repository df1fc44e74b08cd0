"""A step's draws on the device: the verdicts on sampled drafts are the host rule's, and their replacements come
from the residual distribution."""

import torch

from wedlm_hf.modeling.decoding_state import Fill
from wedlm_hf.modeling.draft_verification import ArPredictions
from wedlm_hf.modeling.step_draws import draft_verdicts
from wedlm_hf.modeling.window_filling import FillSampler

VOCAB = 6


def drafts_and_distributions(seed: int):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(9, VOCAB, generator=g) * 2, dim=-1)
    q = torch.softmax(torch.randn(9, VOCAB, generator=g) * 2, dim=-1)
    drafts = []
    for i in range(9):
        token = int(torch.randint(0, VOCAB, (), generator=g))
        kind = i % 4
        if kind == 0:
            drafts.append(Fill(token, q=q[i]))  # a sampled fill: judged against its q
        elif kind == 1:
            drafts.append(Fill(token, source="context"))  # a copy: q is a point mass
        elif kind == 2:
            drafts.append(Fill(token, q=q[i], guess=True))  # a grammar's guess: a point mass too
        else:
            drafts.append(None)  # a position without a judged draft
    return p, q, drafts


def test_the_device_keeps_exactly_the_drafts_the_host_rule_keeps():
    """Same uniforms, same verdicts: u * q(x) < p(x) for a drawn draft, u < p(x) for a point-mass one."""
    for seed in range(20):
        p, _, drafts = drafts_and_distributions(seed)
        kept, _ = draft_verdicts(FillSampler(True, generator=torch.Generator().manual_seed(seed)), p, drafts)
        judged = [i for i, d in enumerate(drafts) if d is not None]
        uniforms = torch.rand(len(judged), generator=torch.Generator().manual_seed(seed)).tolist()
        host = ArPredictions(FillSampler(True), [0] * len(p), p, [0.0] * len(p))
        for k, i in enumerate(judged):
            host.uniforms[i] = uniforms[k]
            assert bool(kept[i]) == (host.judge(i, drafts[i]) is None), (seed, i)
        assert all(kept[i] == 0 for i, d in enumerate(drafts) if d is None)


def test_a_replacement_comes_from_the_residual_distribution():
    """Where p - q is positive only at some tokens, every replacement is one of them; a point-mass draft's token
    is never its own replacement; the draws' frequencies follow max(0, p - q) normalised."""
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0, 0.0, 0.0]] * 2, dtype=torch.float64)
    q = torch.tensor([0.1, 0.6, 0.3, 0.0, 0.0, 0.0], dtype=torch.float64)
    drafts = [Fill(1, q=q), Fill(0, source="context")]
    counts = torch.zeros(2, VOCAB)
    sampler = FillSampler(True, generator=torch.Generator().manual_seed(0))
    for _ in range(4000):
        _, residual = draft_verdicts(sampler, p, drafts)
        counts[0, residual[0]] += 1
        counts[1, residual[1]] += 1
    assert counts[0, 1:].sum() == 0  # max(0, p - q) = (0.4, 0, 0, ...)
    assert counts[1, 0] == 0 and counts[1, 3:].sum() == 0
    assert abs(counts[1, 1] / counts[1].sum() - 0.6) < 0.03  # (0.3, 0.2) normalised
