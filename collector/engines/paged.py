"""The ``fast`` engine's model runner: a decoder's forward pass over a paged KV cache.

Keys and values of every row live in one pool per layer, ``[slots + 1, kv_heads, head_dim]``
(``slots = blocks x block_size``; the last slot is scratch, where the writes of padding and of
rows that ended go). A row reaches its tokens through its block table: token ``t`` of a row is
in slot ``table[t // block_size] * block_size + t % block_size``. One function serves prefill
(``M`` new tokens a row, chunked by the scheduler) and decode (``M = 1``): write the new keys and
values into their slots, gather each row's slots in table order, attend with a causal mask.

The gather reads a row's whole table up to the batch's longest row, as a slot cache read its
whole context; what a paged pool changes is the memory: it follows the tokens rows hold, so the
``n`` samples of a prompt, kept conversations and long answers share one pool. (A kernel that
reads the blocks in place, flash-attention's paged decode, would also skip the gather: see
docs/collector-engines.md.)

Architectures: the Llama family's decoder layer (Llama, SmolLM2, Qwen2 with its q/k/v biases,
Mistral without a sliding window) and Qwen3's (a per-head RMSNorm on queries and keys before the
rotary embedding). Each reuses the model's own modules, so weights loaded in place reach it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reflexdb.errors import ModelUnavailable

#: Architectures whose decoder layers :class:`PagedModel` reproduces exactly.
SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM")


class UnsupportedModel(ModelUnavailable, ValueError):
    """The model's architecture is not one the ``fast`` engine's forward reproduces (exit 7, as a
    model that cannot be loaded)."""


@dataclass
class KVPool:
    """Per layer, keys and values ``[slots + 1, kv_heads, head_dim]``; slot ``slots`` is scratch."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    block_size: int

    @property
    def slots(self) -> int:
        return self.layers[0][0].shape[0] - 1

    @property
    def scratch(self) -> int:
        """The slot that takes the writes nobody reads (padding, rows that ended)."""
        return self.slots

    def copy_block(self, src: int, dst: int, tokens: int) -> None:
        """Copy the first ``tokens`` slots of block ``src`` into block ``dst`` (copy on write)."""
        a, b = src * self.block_size, dst * self.block_size
        for K, V in self.layers:
            K[b : b + tokens] = K[a : a + tokens]
            V[b : b + tokens] = V[a : a + tokens]


class PagedModel:
    """A causal LM's forward over a :class:`KVPool`; see the module docstring.

    Raises:
        UnsupportedModel: another architecture, or a sliding window (the way out named).
    """

    def __init__(self, model: torch.nn.Module):
        arch = type(model).__name__
        config = model.config
        if arch not in SUPPORTED:
            raise UnsupportedModel(f"the fast engine decodes {', '.join(SUPPORTED)}; this model is {arch}: use engine: hf")
        if (getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
                and arch != "LlamaForCausalLM"):
            raise UnsupportedModel(f"the fast engine has no sliding-window attention ({arch}): use engine: hf")
        self.model = model
        self.layers = list(model.model.layers)
        attn = self.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.kv_heads = int(config.num_key_value_heads)
        self.heads = int(config.num_attention_heads)
        self.scaling = float(attn.scaling)
        #: Qwen3: RMSNorm over each head of the queries and keys, before the rotary embedding
        self.qk_norm = hasattr(attn, "q_norm") and hasattr(attn, "k_norm")

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """KV bytes one token takes in every layer (keys and values)."""
        return 2 * len(self.layers) * self.kv_heads * self.head_dim * torch.empty((), dtype=dtype).element_size()

    def allocate(self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device) -> KVPool:
        """A pool of ``num_blocks`` blocks (uninitialised: a slot is read only after it is written,
        and masked otherwise)."""
        shape = (num_blocks * block_size + 1, self.kv_heads, self.head_dim)
        return KVPool([(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                       for _ in self.layers], block_size)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, write: torch.Tensor, table: torch.Tensor,
                pool: KVPool) -> torch.Tensor:
        """Feed ``ids`` `[R, M]` at positions ``pos`` `[R, M]`; write their keys and values into slots
        ``write`` `[R, M]` (the scratch slot for padding) and return the final-norm hidden states
        `[R, M, D]` (the model's dtype).

        Row ``r`` attends to its tokens ``0 .. pos[r, m]`` through ``table`` `[R, B]` (block numbers;
        entries past the row's blocks may be anything: they are masked). A padded query (written to
        scratch) sees token 0 only, so its output is finite and unused.
        """
        inner = self.model.model
        R, M = ids.shape
        bs = pool.block_size
        h = inner.embed_tokens(ids)  # [R, M, D]
        cos, sin = inner.rotary_emb(h, pos)  # [R, M, hd]
        cols = (table[:, :, None] * bs + torch.arange(bs, device=ids.device)).reshape(R, -1)  # [R, L]
        L = cols.shape[1]
        visible = torch.arange(L, device=ids.device)[None, None, :] <= pos[:, :, None]  # [R, M, L]
        visible = (visible | (write == pool.scratch)[:, :, None] & (torch.arange(L, device=ids.device) == 0))[:, None]
        flat = write.reshape(-1)
        for layer, (K, V) in zip(self.layers, pool.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(R, M, self.heads, self.head_dim)
            k = attn.k_proj(x).view(R, M, self.kv_heads, self.head_dim)
            v = attn.v_proj(x).view(R, M, self.kv_heads, self.head_dim)
            if self.qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = _rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [R, H, M, hd], [R, Hkv, M, hd]
            K[flat] = k.transpose(1, 2).reshape(R * M, self.kv_heads, self.head_dim).to(K.dtype)
            V[flat] = v.reshape(R * M, self.kv_heads, self.head_dim).to(V.dtype)
            keys = K[cols].transpose(1, 2)  # [R, Hkv, L, hd]
            values = V[cols].transpose(1, 2)
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, scale=self.scaling,
                                               enable_gqa=self.heads != self.kv_heads)  # [R, H, M, hd]
            h = h + attn.o_proj(o.transpose(1, 2).reshape(R, M, self.heads * self.head_dim))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return inner.norm(h)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 next-token logits of final-norm hidden states `[..., D]` -> `[..., V]`."""
        return self.model.lm_head(hidden).float()


def _rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    return apply_rotary_pos_emb(q, k, cos, sin)
