"""What both local engines share about the model itself: loading it with its tokenizer, the facts
a decode loop needs (EOS tokens, padding, the context, the vocabulary), scoring given responses
teacher-forced, and new weights copied in place.

:class:`LoadedModel` is composed into :class:`~.hf.HFEngine` and :class:`~.fast.FastEngine`
(neither inherits the other): the two differ only in how they generate.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reflexdb.logprobs import token_logprobs
from reflexdb.models import model_display_name, resolve_model

from ..errors import CheckpointMismatch, ModelUnavailable
from .base import ScoreResult, checkpoint_path

log = logging.getLogger(__name__)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on a GPU that supports it, float32 otherwise; else the named torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return getattr(torch, dtype)


def _shards(path: Path) -> list[Path]:
    """The safetensors files of checkpoint directory ``path``: those its index names (a sharded
    ``save_pretrained``), else its ``*.safetensors``.

    Raises:
        ModelUnavailable: the index is unreadable or names a shard that is not there.
    """
    import json

    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return sorted(path.glob("*.safetensors"))
    try:
        names = sorted({str(v) for v in json.loads(index.read_text())["weight_map"].values()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelUnavailable(f"checkpoint {path}: {index.name} is not an index of shards "
                               f"({type(exc).__name__})") from None
    gone = [n for n in names if "/" in n or not (path / n).is_file()]
    if gone:
        raise ModelUnavailable(f"checkpoint {path}: {gone[0]} is missing ({index.name} names it)")
    return [path / n for n in names]


class LoadedModel:
    """A transformers causal LM and its tokenizer on one device, in eval mode.

    Args:
        model: a model directory, ``"smollm2"`` or ``"tiny"`` (:func:`~reflexdb.models.resolve_model`);
            :meth:`from_module` wraps a model already in memory.
        device: ``cpu``, ``cuda``, ``cuda:1``...; default CUDA when available.
        dtype: ``auto`` or a torch dtype name (log-probs are always float32 from the logits).
        cache_dir: model cache for the built-in models.
    """

    def __init__(self, model: str | Path | None = None, *, device: str | None = None,
                 dtype: str | torch.dtype = "auto", cache_dir: Path | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        location = resolve_model(model, cache_dir)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = resolve_dtype(dtype, self.device)
        try:
            self.model = AutoModelForCausalLM.from_pretrained(location, dtype=self.dtype)
            self.tokenizer = AutoTokenizer.from_pretrained(location)
        except OSError as exc:
            raise ModelUnavailable(f"cannot load model {location}: {exc}") from exc
        self.model.to(self.device).eval()
        self.name = model_display_name(location)
        #: the checkpoint the current weights came from
        self.checkpoint = str(location)
        self._facts()

    @classmethod
    def of(cls, model: Any, **kwargs: Any) -> LoadedModel:
        """``model`` when it is a :class:`LoadedModel` already (an engine built around a model in
        memory), else one loaded from it."""
        return model if isinstance(model, LoadedModel) else cls(model, **kwargs)

    @classmethod
    def from_module(cls, module: torch.nn.Module, tokenizer: Any, name: str | None = None) -> LoadedModel:
        """A model already in memory (e.g. random weights of a real architecture's shapes, built on
        the device for a benchmark), on its own device and dtype, with ``tokenizer``."""
        self = cls.__new__(cls)
        param = next(module.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.model, self.tokenizer = module.eval(), tokenizer
        self.name = name or type(module).__name__
        self.checkpoint = "(in memory)"
        self._facts()
        return self

    def _facts(self) -> None:
        config = self.model.config
        eos = getattr(self.model.generation_config, "eos_token_id", None) if self.model.generation_config else None
        eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos])
        eos_ids.add(self.tokenizer.eos_token_id)
        #: the tokens that end a row like EOS (the model's and the tokenizer's)
        self.eos_ids = sorted(int(t) for t in eos_ids if t is not None)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_ids[0] if self.eos_ids else 0)
        #: the context: no row may hold more tokens (prompt and response)
        self.max_positions = int(getattr(config, "max_position_embeddings", 1 << 30))

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        """``V``: the width of the logits (what a grammar's bitmask must cover)."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    def left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """input_ids, attention_mask and position_ids `[B, P]` with every row's last token in the last column."""
        P = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), P), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), P), dtype=torch.long)
        for i, p in enumerate(prompts):
            if p:
                input_ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
                mask[i, P - len(p) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        return input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)

    # -- scoring -------------------------------------------------------------------------------

    def score(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], *,
              temperature: float = 1.0, max_rows: int = 32, token_budget: int = 2048) -> list[ScoreResult]:
        """Teacher-forced log-probs and embeddings (:class:`~.base.Engine`'s ``score``):
        ``log_softmax(logits / temperature)`` of each response token, no top-p truncation; rows of
        similar lengths together, at most ``max_rows`` rows and ``token_budget`` padded tokens a pass."""
        if len(prompt_ids) != len(response_ids):
            raise ValueError("prompt_ids and response_ids must have the same length")
        if temperature <= 0:
            raise ValueError("score temperature must be > 0")
        pairs = [([int(t) for t in p], [int(t) for t in r]) for p, r in zip(prompt_ids, response_ids)]
        for p, r in pairs:
            if not p or not r:
                raise ValueError("score needs a non-empty prompt and response")
            if len(p) + len(r) > self.max_positions:
                raise ValueError(f"sequence of {len(p) + len(r)} tokens exceeds the context of {self.max_positions}")
        # Similar lengths together: less padding. Results go back in input order.
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
        results: list[ScoreResult | None] = [None] * len(pairs)
        chunk: list[int] = []
        for i in order:
            cand = chunk + [i]
            P = max(len(pairs[j][0]) for j in cand)
            T = max(len(pairs[j][1]) for j in cand)
            if chunk and (len(cand) > max_rows or len(cand) * (P + T) > token_budget):
                self._score_chunk([pairs[j] for j in chunk], chunk, temperature, results)
                chunk = [i]
            else:
                chunk = cand
        if chunk:
            self._score_chunk([pairs[j] for j in chunk], chunk, temperature, results)
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def _score_chunk(self, pairs: list[tuple[list[int], list[int]]], index: list[int], temperature: float,
                     results: list[ScoreResult | None]) -> None:
        # Prompts left-padded to P, responses right-padded to T: response token t of every row
        # sits in column P + t and is predicted from column P + t - 1.
        P = max(len(p) for p, _ in pairs)
        T = max(len(r) for _, r in pairs)
        b = len(pairs)
        input_ids = torch.full((b, P + T), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, P + T), dtype=torch.long)
        for i, (p, r) in enumerate(pairs):
            input_ids[i, P - len(p) : P + len(r)] = torch.tensor(p + r, dtype=torch.long)
            mask[i, P - len(p) : P + len(r)] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=False,
            output_hidden_states=True,
            logits_to_keep=T + 1,  # columns P-1 .. P+T-1; the last one predicts nothing we need
        )
        # out.logits[:, t] (column P-1+t) predicts response token t (column P+t).
        token_lp, _ = token_logprobs(out.logits[:, :T], input_ids[:, P : P + T], temperature=temperature)
        token_lp = token_lp.cpu().numpy()  # [b, T]
        hidden = out.hidden_states[-1][:, P - 1 : P - 1 + T].float().cpu().numpy()  # [b, T, D]
        for i, (_, r) in enumerate(pairs):
            t = len(r)
            results[index[i]] = ScoreResult(
                logprobs=token_lp[i, :t].astype(np.float32),
                embedding=hidden[i, :t].mean(axis=0).astype(np.float32),
            )

    # -- weights -------------------------------------------------------------------------------

    def load_weights(self, path: str | Path) -> None:
        """Copy the weights of a safetensors checkpoint (a directory written by
        ``save_pretrained``, sharded or not, or one ``.safetensors`` file) into the model in place.

        A sharded directory is read by its index (``model.safetensors.index.json``: the shards it
        names), any other by its ``*.safetensors`` files. Every file is opened (safetensors maps it:
        from a tmpfs, memory) and every parameter checked present with its shape (tied weights count
        once) before the first is copied; otherwise :class:`~reflexdb.collector.errors.CheckpointMismatch`
        (or :class:`~reflexdb.errors.ModelUnavailable` for a file that cannot be opened) is raised and
        the model is unchanged. The parameters stay the same tensors, so CUDA graphs captured over
        them (the ``fast`` engine) read the new weights with no rebuild or recapture.
        """
        from contextlib import ExitStack

        from safetensors import safe_open

        path = checkpoint_path(path)
        files = [path] if path.is_file() else _shards(path)
        if not files:
            raise ModelUnavailable(f"no .safetensors files in checkpoint {path}")
        params = dict(self.model.named_parameters(remove_duplicate=False))
        with ExitStack() as stack:
            handles = []
            for f in files:
                try:
                    handles.append(stack.enter_context(safe_open(str(f), framework="pt", device="cpu")))
                except Exception as exc:  # noqa: BLE001 - safetensors' own error type: a torn or foreign file
                    raise ModelUnavailable(f"checkpoint {path}: cannot open {f.name} "
                                           f"({type(exc).__name__}: {str(exc)[:200]})") from None
            shapes = {key: tuple(fh.get_slice(key).get_shape()) for fh in handles for key in fh.keys()}
            unexpected = sorted(k for k in shapes if k not in params)
            covered = {id(params[k]) for k in shapes if k in params}
            missing = sorted(k for k, v in self.model.named_parameters() if id(v) not in covered)
            wrong = sorted(k for k, s in shapes.items() if k in params and tuple(params[k].shape) != s)
            if unexpected or missing or wrong:
                raise CheckpointMismatch(
                    f"checkpoint {path} does not fit the model: missing {missing[:5]}, "
                    f"unexpected {unexpected[:5]}, wrong shape {wrong[:5]}"
                )
            with torch.no_grad():
                for fh in handles:
                    for key in fh.keys():
                        params[key].copy_(fh.get_tensor(key))
        self.checkpoint = str(path)
        log.info("loaded weights from %s", path)

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


class ModelFacade:
    """The parts of the :class:`~.base.Engine` interface that are the model's, for an engine that
    holds a :class:`LoadedModel` as ``self.lm`` (delegation, one line each)."""

    lm: LoadedModel
    score_token_budget: int
    max_batch_size: int

    @property
    def model_name(self) -> str:
        return self.lm.name

    @property
    def hidden_size(self) -> int:
        return self.lm.hidden_size

    @property
    def tokenizer(self) -> Any:
        return self.lm.tokenizer

    @property
    def model(self) -> torch.nn.Module:
        """The underlying transformers model (for tests and tools; do not keep references)."""
        return self.lm.model

    @property
    def device(self) -> torch.device:
        return self.lm.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm.dtype

    @property
    def checkpoint(self) -> str:
        """The checkpoint the current weights came from."""
        return self.lm.checkpoint

    def score(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], *,
              temperature: float = 1.0) -> list[ScoreResult]:
        """Teacher-forced log-probs and embeddings; see :class:`~reflexdb.collector.engines.base.Engine`.

        ``temperature`` divides the logits before the softmax (1 = the model's own distribution);
        no top-p truncation is applied.
        """
        return self.lm.score(prompt_ids, response_ids, temperature=temperature, max_rows=self.max_batch_size,
                             token_budget=self.score_token_budget)

    def load_weights(self, path: str | Path) -> None:
        """Copy a published checkpoint's weights into the model in place (:meth:`LoadedModel.load_weights`)."""
        self.lm.load_weights(path)

    def close(self) -> None:
        self.lm.close()
