"""Teacher-forced token log-probs from logits, ``log_softmax(logits / temperature)[o_t]``, written once.

Used by the training engine (the policy's and the reference model's log-probs) and by the
collector's ``hf`` engine (``Engine.score``). It imports torch, so nothing on the store's path
imports it: only the engines and the trainer do.

Temperature: the logits are divided by the sampling temperature before the softmax, so a token's
log-prob is the one of the distribution the collector sampled from (top-p truncation is not
applied; see ``collector/engines/base.py``). ``temperature <= 0`` (greedy sampling) and ``1``
leave the logits as they are: greedy decoding has no tempered distribution, so it is scored
under the model's own.
"""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(logits / temperature)`` at each target token, and optionally each entropy.

    Args:
        logits: `[B, T, V]`, ``logits[b, t]`` the prediction of ``targets[b, t]``; computed in
            float32 whatever their dtype.
        targets: `[B, T]` token ids.
        temperature: the sampling temperature (see the module docstring).
        with_entropy: also return the entropy of each position's distribution (no gradient).

    Returns:
        logprobs `[B, T]` float32, and entropies `[B, T]` float32 or None.
    """
    logits = logits.float()
    if temperature != 1.0 and temperature > 0:
        logits = logits / temperature
    logp_all = torch.nn.functional.log_softmax(logits, dim=-1)  # [B, T, V]
    logprobs = logp_all.gather(-1, targets[:, :, None]).squeeze(-1)  # [B, T]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)  # [B, T]
    return logprobs, entropy


def response_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, prompt_lengths: torch.Tensor,
                      response_lengths: torch.Tensor, *, temperature: float = 1.0,
                      with_entropy: bool = False, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the response tokens of a right-padded batch, from its logits.

    Row ``i`` of ``input_ids`` is prompt ⊕ response ⊕ padding; position ``P_i + t - 1`` of the
    logits predicts response token ``t`` (at position ``P_i + t``). Only the ``T`` positions that
    predict response tokens go through the softmax.

    Args:
        logits: `[B, L, V]` the model's output on ``input_ids`` (any float dtype, any device).
        input_ids: `[B, L]` prompt ⊕ response, right-padded.
        prompt_lengths: `[B]` ``P_i``.
        response_lengths: `[B]` ``T_i``; ``T = max_i T_i``.
        temperature: the sampling temperature (see the module docstring).
        with_entropy: also return each position's entropy (no gradient).
        offset: the position of ``logits[:, 0]`` when the model computed logits only from there
            on (``logits_to_keep``: no vocabulary projection for the prompt positions that
            predict nothing we score).

    Returns:
        logprobs `[B, T]` float32, 0 past each response's end, and entropies `[B, T]` (0 there
        too) or None. Both on ``logits.device``.
    """
    device = logits.device
    B, T = input_ids.shape[0], int(response_lengths.max())
    offs = torch.arange(T, device=device)
    pos = (prompt_lengths.to(device)[:, None] - 1 + offs[None, :]).clamp(max=offset + logits.shape[1] - 1)  # [B, T]
    picked = logits.gather(1, (pos - offset)[:, :, None].expand(B, T, logits.shape[-1]))  # [B, T, V]
    input_ids = input_ids.to(device)
    targets = input_ids.gather(1, (pos + 1).clamp(max=input_ids.shape[1] - 1))  # [B, T]
    logprobs, entropy = token_logprobs(picked, targets, temperature=temperature, with_entropy=with_entropy)
    valid = offs[None, :] < response_lengths.to(device)[:, None]  # [B, T]
    logprobs = logprobs * valid
    if entropy is not None:
        entropy = entropy * valid
    return logprobs, entropy


def _head_chunk(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, temperature: float,
                with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of positions: the vocabulary projection, ``log_softmax`` and the target's entry.
    The head is called as a module, so that ZeRO-3's hooks gather its partitioned weight (for
    the forward pass and the checkpoint's recomputation alike) and release it after."""
    logits = head(hidden)[None]  # [1, c, V]
    lp, ent = token_logprobs(logits, targets[None], temperature=temperature, with_entropy=with_entropy)
    return lp[0], (ent[0] if ent is not None else torch.zeros_like(lp[0]))


def hidden_response_logprobs(hidden: torch.Tensor, head: torch.nn.Module, input_ids: torch.Tensor,
                             prompt_lengths: torch.Tensor, response_lengths: torch.Tensor, *,
                             temperature: float = 1.0, with_entropy: bool = False, chunk_tokens: int = 1024,
                             starts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`response_logprobs` from the final hidden states, never holding the whole ``[B, T, V]``.

    The logits of a long batch are its largest tensors: 16 rows of 700 tokens against SmolLM2's
    49,152-way vocabulary are 2.2 GB in float32, and the softmax, its gradient and the entropy
    make several copies. Here only the positions that predict a real response token are
    projected, ``chunk_tokens`` at a time; with gradients on, each chunk is checkpointed
    (``torch.utils.checkpoint``), so the backward pass recomputes its logits instead of keeping
    them: what stays alive between forward and backward is the hidden states, ``[B, L, D]``.
    The values (and gradients) are those of :func:`response_logprobs` on the full logits.

    Packed rows (``starts`` given): the rows are concatenated without padding, row ``i`` from
    position ``starts[i]`` of one packed sequence (trainer/batch.py, :func:`concat_rows`); the
    result has the same `[B, T]` layout as for padded rows.

    Args:
        hidden: `[B, L, D]` the model's final (normed) hidden states on ``input_ids``; packed:
            `[1, N, D]`.
        head: the output embedding (``model.get_output_embeddings()``), a linear layer.
        input_ids: `[B, L]` prompt ⊕ response, right-padded; packed: `[1, N]`, the rows concatenated.
        prompt_lengths, response_lengths, temperature, with_entropy: as :func:`response_logprobs`.
        chunk_tokens: positions projected at once (memory ``chunk_tokens × V`` floats a copy).
        starts: `[B]` where each row begins in the packed ``input_ids``; None: right-padded rows.

    Returns:
        logprobs `[B, T]` float32, 0 past each response's end, and entropies `[B, T]` or None.
    """
    from torch.utils.checkpoint import checkpoint

    device = hidden.device
    B, T = prompt_lengths.shape[0], int(response_lengths.max())
    if starts is None:  # right-padded: row i begins at i·L of the flattened batch
        starts = torch.arange(B, device=device) * input_ids.shape[1]
    offs = torch.arange(T, device=device)
    valid = offs[None, :] < response_lengths.to(device)[:, None]  # [B, T]
    rows, cols = valid.nonzero(as_tuple=True)  # [n] each: the real response tokens
    at = starts.to(device)[rows] + prompt_lengths.to(device)[rows] - 1 + cols  # [n] the position that predicts each
    targets = input_ids.to(device).reshape(-1)[at + 1]  # [n]
    h = hidden.reshape(-1, hidden.shape[-1])[at]  # [n, D]
    lps, ents = [], []
    grad = torch.is_grad_enabled() and (h.requires_grad or head.weight.requires_grad)
    for s in range(0, h.shape[0], max(1, chunk_tokens)):
        args = (h[s:s + chunk_tokens], head, targets[s:s + chunk_tokens], temperature, with_entropy)
        lp, ent = checkpoint(_head_chunk, *args, use_reentrant=False) if grad else _head_chunk(*args)
        lps.append(lp)
        ents.append(ent.detach())
    flat = torch.cat(lps) if lps else hidden.new_zeros(0, dtype=torch.float32)
    logprobs = torch.zeros((B, T), dtype=torch.float32, device=device).index_put((rows, cols), flat)
    entropy = None
    if with_entropy:
        flat_e = torch.cat(ents) if ents else hidden.new_zeros(0, dtype=torch.float32)
        entropy = torch.zeros((B, T), dtype=torch.float32, device=device).index_put((rows, cols), flat_e)
    return logprobs, entropy
