"""One learner step's computation: the method's loss terms over a packed batch, this rank's share
of its rows in micro-batches with gradient accumulation, and one optimizer step (the learner's
``loss`` line, trainer/learner.py).

π_old per row comes from the table of origins (:meth:`PolicyUpdate.old_logprobs`); each term's
micro-batch values are weighted by their share of the term's normaliser over the whole step, so
the accumulated gradient equals the full batch's whatever ``micro_batch_size``
(trainer/losses/accumulate.py).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from reflexdb.records import TokenSignals
from reflexdb.timing import PhaseTimer

from .batch import AUXILIARY, Batch
from .engine import TrainingEngine, hidden_logprobs


def token_slices(lengths: torch.Tensor, n_micro: int, max_tokens: int | None, *, packed: bool = False) -> list[slice]:
    """``n_micro`` contiguous slices of ``len(lengths)`` rows, of equal row count (the last may be
    shorter or empty), each cut greedily so that the tokens its pass feeds the model stay within
    ``max_tokens``: rows × the longest row's length for padded rows, the sum of the rows' lengths
    for packed ones (``packed``). None: no cut; a single row longer than the budget is a slice of
    its own."""
    n = int(lengths.shape[0])
    size = math.ceil(n / n_micro) if n else 0
    out: list[slice] = []
    for i in range(n_micro):
        lo, hi = min(i * size, n), min((i + 1) * size, n)
        if max_tokens is None or hi - lo <= 1:
            out.append(slice(lo, hi))
            continue
        start, longest, total = lo, 0, 0
        for j in range(lo, hi):
            length = int(lengths[j])
            fed = total + length if packed else (j + 1 - start) * max(longest, length)
            if j > start and fed > max_tokens:
                out.append(slice(start, j))
                start, longest, total = j, 0, 0
            longest, total = max(longest, length), total + length
        out.append(slice(start, hi))
    return out


class StepSignals(NamedTuple):
    """The per-token learner signals of a step's rows (``TokenSignals`` of every term, merged;
    trainer/losses/signals.py) and the entropy of the policy at each token, ``[B, T]`` on the host."""

    advantage: torch.Tensor  # float32, NaN where no term gave the token an advantage
    log_ratio: torch.Tensor  # float32, NaN where no term has a ratio
    clipped: torch.Tensor  # bool
    entropy: torch.Tensor  # float32 (nats)


class SignalRecorder:
    """Collects a step's :class:`StepSignals` micro-batch by micro-batch, on the device (no host
    synchronisation inside the loop); a token covered by several terms keeps the first term's."""

    def __init__(self, n_rows: int, n_tokens: int, device):
        shape = (n_rows, n_tokens)
        self.device = device
        self.advantage = torch.full(shape, float("nan"), device=device)
        self.log_ratio = torch.full(shape, float("nan"), device=device)
        self.clipped = torch.zeros(shape, dtype=torch.bool, device=device)
        self.entropy = torch.full(shape, float("nan"), device=device)
        self.covered = torch.zeros(shape, dtype=torch.bool, device=device)

    def add_entropy(self, sl: slice, entropy: torch.Tensor) -> None:
        """The entropies ``[n, T]`` of rows ``sl`` (every response token, whatever the terms)."""
        self.entropy[sl, :entropy.shape[1]] = entropy.detach().float()

    def add(self, sl: slice, idx: torch.Tensor, signals: TokenSignals, mask: torch.Tensor) -> None:
        """A term's signals on rows ``idx`` of the micro-batch ``sl``, where ``mask`` (its loss tokens,
        ``[len(idx), T]``) holds a token no earlier term did."""
        rows = (idx.to(self.device) + sl.start)  # [n]
        T = mask.shape[1]
        new = mask.to(self.device) & ~self.covered[rows, :T]  # [n, T]
        for buf, value in ((self.advantage, signals.advantage), (self.log_ratio, signals.log_ratio),
                           (self.clipped, signals.clipped)):
            buf[rows, :T] = torch.where(new, value.to(self.device), buf[rows, :T])
        self.covered[rows, :T] |= new

    def result(self) -> StepSignals:
        return StepSignals(self.advantage.cpu(), self.log_ratio.cpu(), self.clipped.cpu(), self.entropy.cpu())


def signal_rows(batch: Batch, signals: StepSignals) -> list[tuple[int, bool, TokenSignals]]:
    """Each row of ``batch`` (the rows ``signals`` holds) as ``(trajectory id, auxiliary,
    TokenSignals)``: its response tokens' values; an advantage or ratio that is NaN at every token
    is ``None`` (the loss gave the row none)."""
    kinds = [batch.group_kinds[g] for g in batch.group_index.tolist()]
    out = []
    for i, (tid, n) in enumerate(zip(batch.trajectory_ids, batch.response_lengths.tolist())):
        adv, ratio = signals.advantage[i, :n].numpy(), signals.log_ratio[i, :n].numpy()
        out.append((int(tid), kinds[i] == AUXILIARY, TokenSignals(
            advantage=None if np.isnan(adv).all() else adv, log_ratio=None if np.isnan(ratio).all() else ratio,
            clipped=signals.clipped[i, :n].numpy(), entropy=signals.entropy[i, :n].numpy())))
    return out


class PolicyUpdate:
    """The step computation of one rank: ``run(batch, adv)`` → ``(stats, grad_norm, entropy)``.

    With ``record_signals`` (``learner.record_token_signals``), :attr:`signals` holds the last
    step's per-token learner signals of this rank's rows (:class:`StepSignals`, rows as
    :attr:`rows_of_step`), else None.
    """

    def __init__(self, engine: TrainingEngine, terms: list, specs: list, *, ref, rank: int, world: int,
                 n_micro: int, lr: float, pi_old: str, temperature: float, max_tokens: int | None = None,
                 packed: bool = False, timer: PhaseTimer | None = None, record_signals: bool = False):
        self.engine, self.terms, self.specs, self.ref = engine, terms, specs, ref
        self.rank, self.world, self.n_micro, self.max_tokens = rank, world, n_micro, max_tokens
        self.packed = packed  # the engine feeds rows packed (TrainingEngine.packed): budget by their sum
        self.lr, self.pi_old, self.temperature = lr, pi_old, temperature
        self.timer = timer or PhaseTimer()  # the optimizer step is phase "optimizer" (the learner's timer)
        self.record_signals = record_signals
        self.signals: StepSignals | None = None
        self.rows_of_step: Batch | None = None  # this rank's rows of the last step (run())

    def run(self, batch: Batch, adv: torch.Tensor):
        """The step on ``batch`` (all ranks' rows; ``adv`` ``[B]``): each term's rows and tokens,
        this rank's share, π_old, the reference log-probs, the losses and one optimizer step."""
        rows = self.term_rows(batch)                                                  # each term's rows
        masks = [t.mask(batch) if t.mask is not None else None for t in self.terms]   # ... and tokens
        mine = self.shard(batch.size)                                                 # this rank's rows
        part = batch.rows(mine)
        self.rows_of_step = part
        old, fresh = self.old_logprobs(part)                                          # π_old
        ref = self.ref_logprobs(part)
        return self.optimize(part, old, ref, adv[mine], full=batch, rows=rows, mine=mine, fresh=fresh, masks=masks)

    def term_rows(self, batch: Batch) -> list[torch.Tensor]:
        """Each term's rows (``[B]`` bool). A family whose normaliser is the constant ``B`` (Dr.GRPO's
        ``seq-mean-token-sum-norm``, docs/losses.md) keeps the rows with a NULL reward among the
        default term's rows: their advantage is exactly 0, so they add nothing to the loss, but they
        are among the B rows it divides by. Leaving them out made the gradient B/B_valid times the
        full batch's (12/10 with 2 NULL rewards in 12 rows)."""
        from .method_api.base import valid_rows

        out = []
        for term, spec in zip(self.terms, self.specs):
            r = term.rows(batch)
            if term.rows is valid_rows and spec.counts_every_row(term.params):
                r = torch.ones_like(r)
            out.append(r)
        return out

    def shard(self, n_rows: int) -> slice:
        """This rank's contiguous share of a step's rows."""
        per = math.ceil(n_rows / self.world)
        return slice(min(self.rank * per, n_rows), min((self.rank + 1) * per, n_rows))

    def all_reduce(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.engine.device)  # NCCL reduces CUDA tensors only
        torch.distributed.all_reduce(t)
        return t.cpu().tolist()

    def slices(self, batch: Batch) -> list[slice]:
        """Contiguous row slices, one forward/backward pass each: ``n_micro`` slices of equal row
        count (groups may differ in size: replay, a collector with another G), each cut further
        where the tokens it feeds the model pass ``max_tokens`` (``learner.micro_batch_tokens``):
        rows × its longest row padded, the sum of its rows' lengths packed (``learner.packing``).
        A long multi-turn batch then takes more, smaller passes;
        the loss weights (each slice's share of the step's normaliser) keep the accumulated
        gradient the full batch's, and the optimizer steps once, after the last slice."""
        return token_slices(batch.prompt_lengths + batch.response_lengths, self.n_micro, self.max_tokens,
                            packed=self.packed)

    def old_logprobs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The ratio denominator per token: ``(old [B, T], fresh [B])``.

        The table of origins (reflexdb/origins.py) says what π_old is for each row: ``old`` holds
        the stored behaviour log-probs π_beh, used for every row whose origin's π_old is
        ``stored`` (tokens sampled in another context or earlier) and, with ``learner.pi_old:
        behaviour``, for the policy's own rows too. ``fresh`` marks the rows whose π_old is the policy at the
        step's start (``pi_old: recompute``): a step takes exactly one optimizer step, after all
        its micro-batches, so the weights at the step's start are the weights of the training
        forward, and :meth:`optimize` takes those rows' π_old from that forward (detached) instead
        of running a second, no-grad forward over the batch. The values are the same; the
        forward pass is saved (docs/benchmarks.md, "reflexdb against TRL").

        Rows whose origin's π_old is ``learner`` (imported: no behaviour log-probs) always take the
        policy at the step's start.
        """
        stored = batch.where_origin(pi_old="stored")  # π_beh (each method's paper says so for its rows)
        learner = batch.where_origin(pi_old="learner")  # no behaviour log-probs (imported)
        fresh = learner if self.pi_old == "behaviour" else ~stored
        return batch.behaviour_logprobs, fresh

    @torch.no_grad()
    def ref_logprobs(self, batch: Batch) -> torch.Tensor | None:
        if self.ref is None:
            return None
        out = torch.zeros_like(batch.behaviour_logprobs)
        for sl in self.slices(batch):
            if sl.start >= sl.stop:
                continue
            mb = batch.rows(sl)
            lp, _ = hidden_logprobs(self.ref, self.ref.get_output_embeddings(), mb.input_ids, mb.attention_mask,
                                    mb.prompt_lengths, mb.response_lengths, packed=self.packed,
                                    device=self.engine.device, temperature=self.temperature)
            out[sl, :lp.shape[1]] = lp.cpu()
        return out

    def optimize(self, batch: Batch, old: torch.Tensor, ref: torch.Tensor | None, adv: torch.Tensor, *,
                 full: Batch, rows: list[torch.Tensor], mine: slice, fresh: torch.Tensor | None = None,
                 masks: list[torch.Tensor | None] | None = None):
        """The method's loss terms over this rank's micro-batches with gradient accumulation; one
        optimizer step.

        ``fresh`` (``[B]`` bool, :meth:`old_logprobs`): rows whose π_old is this forward's own
        log-probs, detached (the weights move only at the step's end); the others use ``old``.

        Term ``k`` applies its loss to its rows (``rows[k]``, ``[B_full]`` bool) only, and to the
        loss tokens its ``masks[k]`` (``[B_full, T]`` bool, or None: all) keeps of them. Each
        micro-batch's value of a term is weighted by its share of that term's normaliser over the
        whole step (``LossSpec.normaliser``: loss tokens, rows with loss tokens, or rows, after the
        family's own filters; ``full`` is the step's batch over all ranks), so the accumulated
        gradient equals the full batch's whatever ``micro_batch_size`` (trainer/losses/accumulate.py);
        DeepSpeed averages gradients over ranks, so the weight carries a factor ``world``. A
        non-finite loss on any rank skips every backward after it and turns the optimizer step into
        a no-op (zero gradients, learning rate 0): the weights do not move.

        The optimizer step is timed as phase ``optimizer`` (:attr:`timer`), after the loop: the
        micro-batches run without a synchronize between them.
        """
        masks = masks or [None] * len(self.terms)
        full_masks = [full.response_mask if m is None else full.response_mask & m for m in masks]  # [B_full, T]
        totals = [spec.normaliser(fm[r], t.params, truncated=full.truncated[r])
                  for spec, t, r, fm in zip(self.specs, self.terms, rows, full_masks)]
        mine_rows = [r[mine] for r in rows]
        mine_masks = [fm[mine] for fm in full_masks]
        total_tokens = float(full.response_mask.sum().clamp(min=1))
        # The step's metrics stay on the device until the loop ends: a float() of each per
        # micro-batch would make the host wait for the GPU that many times (issue 51). The one wait
        # left in the loop is the finiteness of each micro-batch's loss, which decides its backward.
        sums: dict[str, torch.Tensor] = {}
        entropy_sum: torch.Tensor | float = 0.0
        bad = False
        slices = self.slices(batch)
        record = SignalRecorder(batch.size, batch.response_mask.shape[1], self.engine.device) \
            if self.record_signals else None
        for i, sl in enumerate(slices):
            last = i == len(slices) - 1
            # The slice count varies with the rows' lengths: tell DeepSpeed which pass ends the step.
            self.engine.ds.set_gradient_accumulation_boundary(last)
            if sl.start < sl.stop:
                mb = batch.rows(sl)
                T = mb.response_mask.shape[1]
                logprobs, entropy = self.engine.token_logprobs(
                    mb.input_ids, mb.attention_mask, mb.prompt_lengths, mb.response_lengths,
                    temperature=self.temperature, with_entropy=True)
                if record is not None:
                    record.add_entropy(sl, entropy)
                loss = logprobs.sum() * 0.0  # a micro-batch without rows of any term still joins the accumulation
                mb_old = old[sl][:, :T].to(logprobs.device)
                if fresh is not None:  # π_old = π_θ at the step's start = this forward, no gradient
                    mb_old = torch.where(fresh[sl].to(logprobs.device)[:, None], logprobs.detach(), mb_old)
                for k, (spec, term, total) in enumerate(zip(self.specs, self.terms, totals)):
                    idx = mine_rows[k][sl].nonzero().flatten()
                    if idx.numel() == 0 or total == 0:
                        continue
                    mask, truncated = mine_masks[k][sl][idx, :T], mb.truncated[idx]
                    dev = logprobs.device
                    out = spec.call(logprobs[idx.to(dev)], mb_old[idx.to(dev)], adv[sl][idx].to(dev),
                                    mask.to(dev), term.params, truncated=truncated.to(dev),
                                    ref_logprobs=ref[sl][idx, :T].to(dev) if ref is not None else None)
                    if record is not None:  # what this term's loss used per token (trainer/losses/signals.py)
                        record.add(sl, idx, spec.token_signals(
                            logprobs[idx.to(dev)], mb_old[idx.to(dev)], adv[sl][idx].to(dev), mask.to(dev),
                            term.params, truncated=truncated.to(dev)),
                            spec.effective_mask(mask.to(dev), term.params, truncated=truncated.to(dev)))
                    share = spec.normaliser(mask, term.params, truncated=truncated) / total
                    loss = loss + out.loss * (term.weight * share)
                    for name, value in out._asdict().items():
                        if value.numel() == 1 and (name != "loss" or k > 0):
                            key = name if k == 0 else f"{term.name}/{name}"
                            sums[key] = sums.get(key, 0.0) + value.detach().double() * share
                sums["loss"] = sums.get("loss", 0.0) + loss.detach().double()
                if not bool(torch.isfinite(loss)):
                    bad = True
                elif not bad:
                    self.engine.backward(loss * self.world)
                entropy_sum = entropy_sum + entropy.detach().double().sum()
            if not last:
                self.engine.step()  # a micro-step: DeepSpeed's bookkeeping, no optimizer step
        bad = self.all_reduce([float(bad)])[0] > 0
        if bad:
            # Finite (zero) gradients for the boundary step, and a learning rate of 0: AdamW then
            # leaves every weight exactly where it was.
            self.engine.backward(sum(p.sum() for p in self.engine.ds.module.parameters()) * 0.0)
            self.set_lr(0.0)
        with self.timer("optimizer"):
            grad_norm = self.engine.step()  # the accumulation boundary (the last pass): the optimizer step
        names = sorted(sums)
        reduced = self.all_reduce([float(sums[k]) for k in names] + [float(entropy_sum)])  # the step's one read
        sums, entropy_sum = dict(zip(names, reduced[:-1])), reduced[-1]
        sums.setdefault("loss", 0.0)
        if bad:
            self.set_lr(self.lr)
            sums["loss"] = float("nan")
        self.signals = record.result() if record is not None else None
        return sums, grad_norm, entropy_sum / total_tokens

    def set_lr(self, lr: float) -> None:
        for g in self.engine.optimizer.param_groups:
            g["lr"] = lr
