"""CPU float batches reuse their memory only when nothing holds it: a batch the
caller keeps, a view of one, or one autograd saved for backward stays intact."""

from __future__ import annotations

import torch

import fastdata


def _batches(n=8):
    torch.manual_seed(0)
    x = torch.randint(0, 256, (n, 4, 6, 6, 3), dtype=torch.uint8)
    return [b.permute(0, 3, 1, 2) for b in x]          # channels-last, as fastdata gives


def _expected(b, mean, std):
    m = torch.tensor(mean).view(1, 3, 1, 1)
    s = torch.tensor(std).view(1, 3, 1, 1)
    return (b.float() / 255 - m) / s


def test_kept_batches_views_and_saved_tensors_are_never_written_over():
    raw = _batches()
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    prefetcher = fastdata.CUDAPrefetcher(raw, "cpu", mean=mean, std=std)
    kept, views, saved = [], [], []
    weight = torch.ones(1, 3, 1, 1, requires_grad=True)
    for k, batch in enumerate(prefetcher):
        if k % 3 == 0:
            kept.append((k, batch))
        elif k % 3 == 1:
            views.append((k, batch[1]))
        else:
            saved.append((k, (batch * weight).sum()))  # autograd keeps batch for backward
    for k, batch in kept:
        assert torch.allclose(batch, _expected(raw[k], mean, std), atol=1e-5)
    for k, view in views:
        assert torch.allclose(view, _expected(raw[k], mean, std)[1], atol=1e-5)
    for k, loss in saved:
        loss.backward()
        want = _expected(raw[k], mean, std).sum(dim=(0, 2, 3)).view(1, 3, 1, 1)
        assert torch.allclose(weight.grad, want, atol=1e-3)
        weight.grad = None


def test_dropped_batches_memory_is_reused_and_values_are_right():
    raw = _batches()
    prefetcher = fastdata.CUDAPrefetcher(raw, "cpu")
    pointers = set()
    for k, batch in enumerate(prefetcher):
        assert torch.allclose(batch, raw[k].float() / 255)
        pointers.add(batch.data_ptr())
        del batch
    assert len(pointers) < len(raw)
