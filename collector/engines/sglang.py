"""The ``sglang`` engine: the engine interface over SGLang's offline ``sglang.Engine`` (GPU only).

SGLang is an optional dependency (``pip install -e '.[gpu]'`` in reflexdb's clone) and is imported only when this
engine is built. What maps onto what:

- ``generate`` → ``Engine.generate(input_ids=..., sampling_params=..., return_logprob=True,
  return_hidden_states=True)``; the ``n`` samples of a prompt are ``n`` requests with the same
  ids (SGLang's radix cache shares their prefill).
- behaviour log-probs ← ``meta_info["output_token_logprobs"]``. SGLang reports
  ``log_softmax(logits / temperature)`` of the sampled token, **before** top-p truncation. At
  ``top_p == 1`` that is exactly the ``hf`` engine's value; for ``top_p < 1`` it is lower by the
  log of the nucleus mass, and a warning is logged once.
- embedding ← ``meta_info["hidden_states"]``: SGLang returns the final-norm state of the prefill
  (last row: the last prompt token) and one per decode step (the states that produced
  ``o_2..o_T``), i.e. exactly the positions the ``hf`` engine averages.
- ``score`` → a prefill-only request (``max_new_tokens=0``) with ``logprob_start_len = P - 1``:
  ``input_token_logprobs`` (untempered) and the prefill hidden states.
- ``json_schema`` → SGLang's ``json_schema`` sampling parameter (constrained decoding by its grammar
  backend, xgrammar by default). SGLang masks the logits before its sampler computes log-probs, so
  they are the constrained distribution's, as in the ``hf`` engine.
- ``load_weights`` → ``Engine.update_weights_from_disk(model_path)`` (the radix cache is flushed).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelUnavailable
from reflexdb.models import model_display_name, resolve_model
from .base import Prompt, Sample, SamplingParams, ScoreResult, checkpoint_path, encode_prompt

log = logging.getLogger(__name__)


def _states(hidden: Any) -> list[np.ndarray]:
    """SGLang's per-request ``hidden_states`` list as float32 arrays, each `[rows, D]`."""
    return [np.atleast_2d(np.asarray(h, dtype=np.float32)) for h in hidden]


class SGLangEngine:
    """SGLang offline engine; see :class:`~reflexdb.collector.engines.base.Engine`.

    Args:
        model: as for :class:`~reflexdb.collector.engines.hf.HFEngine` (a directory, ``smollm2``,
            ``tiny``, or a hub id SGLang can load).
        **engine_kwargs: passed to ``sglang.Engine`` (``mem_fraction_static``, ``tp_size``,
            ``dtype``, ``random_seed``, ...).
    """

    kind = "sglang"

    def __init__(self, model: str | Path | None = None, *, cache_dir: Path | None = None, **engine_kwargs: Any):
        try:
            import sglang
        except ImportError as exc:
            raise ModelUnavailable(
                "the sglang engine needs SGLang and a CUDA GPU: pip install -e '.[gpu]' in reflexdb's clone"
            ) from exc
        from transformers import AutoConfig, AutoTokenizer

        location = resolve_model(model, cache_dir)
        kwargs = {"model_path": str(location), "enable_return_hidden_states": True, **engine_kwargs}
        try:
            self._engine = sglang.Engine(**kwargs)
        except TypeError:  # SGLang versions before the server flag existed
            kwargs.pop("enable_return_hidden_states")
            self._engine = sglang.Engine(**kwargs)
        self._tokenizer = AutoTokenizer.from_pretrained(location)
        self._hidden_size = int(AutoConfig.from_pretrained(location).hidden_size)
        self._model_name = model_display_name(location)
        self._warned_top_p = False
        self.checkpoint = str(location)

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def hidden_size(self) -> int:
        return self._hidden_size

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def _sampling_params(self, params: SamplingParams) -> dict[str, Any]:
        sp: dict[str, Any] = {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_new_tokens": params.max_new_tokens,
            "skip_special_tokens": True,
            "no_stop_trim": True,  # keep the stop string in the text, as the hf engine does
        }
        if params.stop:
            sp["stop"] = list(params.stop)
        if params.stop_token_ids:
            sp["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            sp["sampling_seed"] = params.seed
        if params.json_schema is not None:
            sp["json_schema"] = params.json_schema  # SGLang's grammar backend (xgrammar by default)
        return sp

    def generate(
        self, prompts: Sequence[Prompt], n: int = 1, params: SamplingParams = SamplingParams()
    ) -> list[list[Sample]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if params.top_p < 1 and not params.greedy and not self._warned_top_p:
            log.warning("sglang reports log-probs before top-p truncation; with top_p=%s they are "
                        "not the exact sampling distribution's", params.top_p)
            self._warned_top_p = True
        ids = [encode_prompt(self._tokenizer, p) for p in prompts]
        flat = [p for p in ids for _ in range(n)]
        outs = self._engine.generate(
            input_ids=flat,
            sampling_params=self._sampling_params(params),
            return_logprob=True,
            return_hidden_states=True,
        )
        samples = [self._sample(p, o, params) for p, o in zip(flat, outs)]
        return [samples[i * n : (i + 1) * n] for i in range(len(ids))]

    def _sample(self, prompt: list[int], out: dict[str, Any], params: SamplingParams) -> Sample:
        meta = out["meta_info"]
        reason = meta.get("finish_reason") or {}
        kind = reason.get("type") if isinstance(reason, dict) else str(reason)
        if kind not in ("stop", "length"):
            raise RuntimeError(f"sglang request ended with {reason!r}")
        entries = meta["output_token_logprobs"]  # [(logprob, token_id, text|None), ...]
        token_ids = np.asarray(out.get("output_ids") or [e[1] for e in entries], dtype=np.int32)
        logprobs = np.asarray([e[0] for e in entries], dtype=np.float32)
        T = len(token_ids)
        states = _states(meta["hidden_states"])
        # prefill's last row produced o_1; decode step k produced o_{k+1}.
        rows = [states[0][-1]] + [s[-1] for s in states[1:T]]
        embedding = np.mean(np.stack(rows), axis=0).astype(np.float32)
        matched = reason.get("matched") if isinstance(reason, dict) else None
        return Sample(
            prompt_ids=np.asarray(prompt, dtype=np.int32),
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=kind,  # type: ignore[arg-type]
            text=self._tokenizer.decode(token_ids.tolist(), skip_special_tokens=True),
            embedding=embedding,
            stop=matched if isinstance(matched, str) and matched in params.stop else None,
        )

    def score(
        self,
        prompt_ids: Sequence[Sequence[int]],
        response_ids: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
    ) -> list[ScoreResult]:
        """Untempered teacher-forced log-probs; SGLang's input log-probs ignore temperature, so
        only ``temperature=1`` is accepted."""
        if temperature != 1.0:
            raise ValueError("the sglang engine scores at temperature 1 only")
        if len(prompt_ids) != len(response_ids):
            raise ValueError("prompt_ids and response_ids must have the same length")
        prompts = [[int(t) for t in p] for p in prompt_ids]
        responses = [[int(t) for t in r] for r in response_ids]
        if any(not p or not r for p, r in zip(prompts, responses)):
            raise ValueError("score needs a non-empty prompt and response")
        outs = self._engine.generate(
            input_ids=[p + r for p, r in zip(prompts, responses)],
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            # Asking for input log-probs from P-1 on also keeps the radix cache from skipping
            # those positions, so their hidden states are computed and returned.
            logprob_start_len=[len(p) - 1 for p in prompts],
            return_hidden_states=True,
        )
        results = []
        for r, out in zip(responses, outs):
            T = len(r)
            meta = out["meta_info"]
            logprobs = np.asarray([e[0] for e in meta["input_token_logprobs"][-T:]], dtype=np.float32)
            prefill = _states(meta["hidden_states"])[0]  # rows up to the last input token
            if prefill.shape[0] < T + 1:
                raise RuntimeError("sglang returned fewer prefill hidden states than response tokens")
            embedding = prefill[-(T + 1) : -1].mean(axis=0).astype(np.float32)
            results.append(ScoreResult(logprobs=logprobs, embedding=embedding))
        return results

    def load_weights(self, path: str | Path) -> None:
        path = checkpoint_path(path)
        res = self._engine.update_weights_from_disk(model_path=str(path))
        ok, message = (res[0], res[1]) if isinstance(res, tuple) else (res.get("success"), res.get("message"))
        if not ok:
            raise ModelUnavailable(f"sglang could not load weights from {path}: {message}")
        self.checkpoint = str(path)

    def close(self) -> None:
        self._engine.shutdown()
