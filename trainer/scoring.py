"""Scoring stored trajectories under the learner's current weights: a confidence ℓ_θ per
trajectory, for a method's hooks (NexGRPO's refresh of a negative's confidence).

With several ranks, rank 0 scores inside :meth:`Scorer.session` and the other ranks take part in
its forward passes through :meth:`Scorer.serve` (DeepSpeed's ZeRO needs every rank in a forward).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .batch import pack_sequences
from .engine import TrainingEngine


class Scorer:
    def __init__(self, engine: TrainingEngine, *, world: int, micro_batch_size: int, temperature: float):
        self.engine, self.world = engine, world
        self.micro_batch_size, self.temperature = max(1, micro_batch_size), temperature

    def score(self, trajectories: Sequence[Any]) -> list[float]:
        """ℓ_θ of stored trajectories under the current weights (rank 0, inside :meth:`session`)."""
        payload = [(t.prompt_ids, t.response_ids, t.loss_mask) for t in trajectories]
        if self.world > 1:
            torch.distributed.broadcast_object_list([payload], src=0)
        return self.confidences(payload)

    @contextlib.contextmanager
    def session(self):
        """Rank 0's scoring session: on leaving, tells the other ranks that no more scoring comes."""
        try:
            yield
        finally:
            if self.world > 1:
                torch.distributed.broadcast_object_list([None], src=0)

    def serve(self) -> None:
        """Ranks other than 0: take part in rank 0's scoring forward passes until it is done."""
        while True:
            box = [None]
            torch.distributed.broadcast_object_list(box, src=0)
            if box[0] is None:
                return
            self.confidences(box[0])

    @torch.no_grad()
    def confidences(self, payload: list[tuple]) -> list[float]:
        """``exp(mean_t log π_θ(o_t))`` over each response's loss-masked tokens (a confidence ℓ_θ;
        in an episode the model's own tokens, as the stored confidence), temperature as sampled."""
        out: list[float] = []
        for start in range(0, len(payload), self.micro_batch_size):
            chunk = payload[start:start + self.micro_batch_size]
            ids, attn, P, T = pack_sequences([(p, r) for p, r, _ in chunk], self.engine.pad_id)
            lp, _ = self.engine.token_logprobs(ids, attn, P, T, temperature=self.temperature, grad=False)
            mask = torch.zeros(lp.shape, dtype=torch.float64)
            for i, (_, r, m) in enumerate(chunk):
                mask[i, :len(r)] = torch.as_tensor(np.ones(len(r), bool) if m is None else m, dtype=torch.float64)
            mask = mask.to(lp.device)
            mean = (lp.double() * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
            out.extend(torch.exp(mean).cpu().tolist())
        return out
