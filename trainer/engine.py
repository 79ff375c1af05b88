"""The training engine: a Hugging Face causal LM under DeepSpeed (ZeRO), on CPU or GPU.

On CPU DeepSpeed runs with the gloo backend; the same code path runs multi-GPU and multi-node
when started by ``deepspeed`` or ``torchrun`` (which set RANK / WORLD_SIZE / MASTER_ADDR). Single
process runs set those variables themselves.

What the learner needs from it:
- :meth:`TrainingEngine.token_logprobs`: ``log π(o_t | prompt, o_<t)`` of every response token
  (logits divided by the sampling temperature, as the collector sampled), and the entropy of
  each position's distribution; the micro-batch's rows padded or packed (:func:`hidden_logprobs`);
- ``backward`` / ``step`` with gradient accumulation over micro-batches;
- :meth:`export_hf`: an HF-loadable safetensors directory and its sha256 (the published policy);
- :meth:`save_state` / :meth:`load_state`: DeepSpeed checkpoints (weights + optimizer) for
  lossless resume.

Both kinds of checkpoint directory are written under a temporary name, flushed to disk and
renamed into place when complete, so a directory with its final name is always whole and is
never written again (:func:`clean_partial_files` removes what a killed or failed write left).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import socket
import sys
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Callable, Literal

import torch

from reflexdb.errors import ReflexdbError
from reflexdb.logprobs import hidden_response_logprobs
from reflexdb.storage import weights_sha256 as _weights_sha256
from reflexdb.storage import write_manifest

from .batch import concat_rows
from .fit import FitCheck, check_start

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def init_distributed(device: str, say: Callable[[str], None] = _to_stderr, *, timeout_s: float | None = None) -> None:
    """Initialise torch.distributed through DeepSpeed (gloo on CPU, nccl on CUDA).

    DeepSpeed builds (or checks) its shared-memory op here, under torch's build lock; a lock left
    by a killed process is detected and removed, and a wait on a live one is announced
    (:mod:`reflexdb.trainer.buildlock`).

    Args:
        timeout_s: how long a collective waits for the other ranks before it fails
            (``learner.dist_timeout_s``; None: DeepSpeed's default, 10 minutes or ``DEEPSPEED_TIMEOUT``).
    """
    import deepspeed

    from .buildlock import BuildLockWatch

    if torch.distributed.is_initialized():
        return
    with BuildLockWatch(say):
        _init_process_group(device, deepspeed, timeout_s)


def _init_process_group(device: str, deepspeed, timeout_s: float | None = None) -> None:
    # Under torchrun / deepspeed the launcher owns the rendezvous. A single process picks its own
    # port, even if it inherited MASTER_PORT from a parent that uses it (that port is taken).
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    backend = "gloo" if device == "cpu" else "nccl"
    kw = {} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}
    for attempt in range(5):
        if not launched:
            os.environ["MASTER_PORT"] = str(_free_port())
        try:
            # DeepSpeed print()s "DeepSpeed deepspeed_shm_comm_op built successfully" here: not for people
            with contextlib.redirect_stdout(io.StringIO()):
                deepspeed.init_distributed(dist_backend=backend, **kw)
            return
        except Exception as exc:  # torch.distributed.DistNetworkError on a port taken meanwhile
            if launched or "EADDRINUSE" not in str(exc) or attempt == 4:
                raise
            log.warning("rendezvous port %s was taken; trying another", os.environ["MASTER_PORT"])


@dataclass(frozen=True)
class EngineSettings:
    device: str = "cpu"
    zero_stage: int = 0
    micro_batch_size: int = 8
    accumulation_steps: int = 1
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    dtype: Literal["auto", "float32", "bfloat16"] = "float32"  # auto: resolve_settings
    fsync: bool = True  # flush checkpoint files to disk before renaming them into place
    head_chunk_tokens: int = 1024  # response positions projected onto the vocabulary at once
    activation_checkpointing: bool = False  # recompute each layer's activations in the backward pass
    packing: Literal["auto", "on", "off"] = "off"  # a micro-batch's rows concatenated, no padding (hidden_logprobs)
    offload_optimizer: bool = False  # AdamW's state and step in host memory (ZeRO >= 1, DeepSpeedCPUAdam)
    offload_params: bool = False  # the weights in host memory between their uses (ZeRO-3)
    publish_shard_bytes: int = 1 << 30  # the largest safetensors shard export_hf writes (learner.publish_shard_mb)
    dist_timeout_s: float | None = None  # a collective's wait for the other ranks (None: DeepSpeed's 10 minutes)


def resolve_settings(settings: EngineSettings) -> EngineSettings:
    """The settings with ``auto`` made concrete for the device (``learner.dtype``, ``learner.packing``).

    The one place that decides: on CUDA, bfloat16 where the card supports it (DeepSpeed's bf16, its
    optimizer keeping float32 master weights; as the collector's ``hf`` engine); on CPU, float32.
    Packing ``auto`` is off on every device (measured; see the comment below).

    Raises:
        ValueError: ``packing: on`` with ZeRO-3; an offload its ZeRO stage does not allow.
    """
    cuda = torch.device(settings.device).type == "cuda"
    dtype, packing = settings.dtype, settings.packing
    if dtype == "auto":
        dtype = "bfloat16" if cuda and torch.cuda.is_bf16_supported() else "float32"
    if packing == "auto":
        # Padded on every device. Packed passes go through SDPA with transformers' dense [N, N]
        # block-diagonal mask: on an H200 they took 2-4x the time and 2-3x the memory of padded,
        # length-sorted ones (docs/benchmarks.md, "GPU: the learner"); a varlen kernel would pay off.
        packing = "off"
    if packing == "on" and settings.zero_stage == 3:
        raise ValueError("packing 'on' needs ZeRO stage 0-2: ZeRO-3 takes padded rows")
    if settings.offload_optimizer and settings.zero_stage < 1:
        raise ValueError("offload_optimizer needs ZeRO stage 1-3 (DeepSpeed offloads the optimizer's partition)")
    if settings.offload_params and settings.zero_stage != 3:
        raise ValueError("offload_params needs ZeRO stage 3 (only ZeRO-3 partitions the weights)")
    return replace(settings, dtype=dtype, packing=packing)


def hidden_logprobs(model, head: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    prompt_lengths: torch.Tensor, response_lengths: torch.Tensor, *, packed: bool,
                    device: torch.device | str, temperature: float = 1.0, with_entropy: bool = False,
                    chunk_tokens: int = 1024) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The model's final hidden states on a micro-batch, then the log-probs (and entropies) of its
    response tokens through the vocabulary head in chunks (:func:`reflexdb.logprobs.hidden_response_logprobs`).

    Padded: the `[B, L]` rows with their attention mask, as built. Packed: the rows concatenated
    into one sequence of ``N = Σ (P_i + T_i)`` tokens (:func:`reflexdb.trainer.batch.concat_rows`),
    position ids restarting at 0 for each row and no attention mask: transformers then builds a
    causal mask that stays inside each row (``masking_utils.find_packed_sequence_indices``), so a
    row sees exactly what it sees padded, and no padding token is computed. The caller bounds
    ``N`` (``learner.micro_batch_tokens``, trainer/update.py).

    Args:
        model: a Hugging Face causal LM (or DeepSpeed's engine around one).
        head: its output embedding (``get_output_embeddings()``).
        input_ids, attention_mask: `[B, L]` prompt ⊕ response, right-padded.
        prompt_lengths, response_lengths: `[B]`.

    Returns:
        logprobs `[B, T]` and entropies `[B, T]` or None, the same layout either way.
    """
    # No KV cache: transformers looks for packed rows only without one (a model loaded for
    # generation, as the reference model, would make one, and packed rows would see each other).
    starts = None
    if packed:
        ids, positions, starts = concat_rows(input_ids, prompt_lengths + response_lengths)  # [1, N] each
        out = model(input_ids=ids.to(device), position_ids=positions.to(device), output_hidden_states=True,
                    logits_to_keep=1, use_cache=False)
    else:
        ids = input_ids
        out = model(input_ids=ids.to(device), attention_mask=attention_mask.to(device), output_hidden_states=True,
                    logits_to_keep=1, use_cache=False)
    return hidden_response_logprobs(out.hidden_states[-1], head, ids, prompt_lengths, response_lengths,
                                    temperature=temperature, with_entropy=with_entropy, chunk_tokens=chunk_tokens,
                                    starts=starts)


class StateUnreadable(Exception):
    """A DeepSpeed state directory exists but cannot be loaded (truncated or damaged files)."""


#: Temporary names of checkpoint directories being written (see :func:`clean_partial_files`).
PARTIAL_STATE_PREFIX = ".partial-"
PARTIAL_WEIGHTS_MARK = ".tmp-"


def clean_partial_files(ckpt_dir: str | Path) -> list[Path]:
    """Remove the temporary directories of checkpoint writes that did not finish; return them.

    ``vK.tmp-PID`` (weights) and ``states/.partial-vK`` (learner state) exist only while a publish
    writes them; one left behind was killed or failed, and no ``policy_versions`` row names it.
    """
    ckpt_dir = Path(ckpt_dir)
    found = [p for p in ckpt_dir.glob(f"v*{PARTIAL_WEIGHTS_MARK}*") if p.is_dir()]
    found += [p for p in (ckpt_dir / "states").glob(f"{PARTIAL_STATE_PREFIX}*") if p.is_dir()]
    for p in found:
        shutil.rmtree(p, ignore_errors=True)
    return found


def fsync_tree(root: Path) -> None:
    """Flush every file under ``root`` and the directories themselves to disk (before a rename
    publishes them: after a power loss a renamed directory must not hold empty files)."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TrainingEngine:
    """A model and its optimizer under DeepSpeed."""

    def __init__(self, model_path: str | Path, settings: EngineSettings, *, say: Callable[[str], None] = _to_stderr,
                 fit: FitCheck | None = None):
        """Load the model and start DeepSpeed; with ``fit``, first refuse a config whose estimated
        memory passes the device's (:func:`reflexdb.trainer.fit.check_start`, raising
        :class:`~reflexdb.trainer.fit.LearnerDoesNotFit`)."""
        import deepspeed
        from transformers import AutoModelForCausalLM, AutoTokenizer

        settings = resolve_settings(settings)
        init_distributed(settings.device, say, timeout_s=settings.dist_timeout_s)
        if fit is not None:  # before the model is loaded and DeepSpeed starts
            world = torch.distributed.get_world_size()
            check_start(str(model_path), settings, fit, world_size=world, say=say,
                        ranks_per_host=int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        self.settings = settings
        self.model_path = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        dtype = torch.bfloat16 if settings.dtype == "bfloat16" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)
        model.config.use_cache = False
        if settings.activation_checkpointing:
            # Each decoder layer keeps only its input for the backward pass and recomputes the rest
            # (about a third more compute): the activations of long multi-turn rows dominate the
            # learner's memory (docs/benchmarks.md, "Memory").
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        optimizer = _optimizer(model, settings, say)
        ds_config = {
            "train_micro_batch_size_per_gpu": settings.micro_batch_size,
            "gradient_accumulation_steps": settings.accumulation_steps,
            "gradient_clipping": settings.grad_clip,
            "zero_optimization": _zero_config(settings),
            "zero_allow_untested_optimizer": True,  # torch AdamW: DeepSpeed's fused Adam needs CUDA
            "bf16": {"enabled": settings.dtype == "bfloat16"},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        self.ds, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        self.device = self.ds.device
        self.rank = torch.distributed.get_rank()
        self.world_size = torch.distributed.get_world_size()

    @property
    def packed(self) -> bool:
        """Whether micro-batches reach the model packed (:func:`hidden_logprobs`)."""
        return self.settings.packing == "on"

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)

    # ------------------------------------------------------------------ forward

    def token_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_lengths: torch.Tensor,
                       response_lengths: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = False,
                       grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of the response tokens of a right-padded micro-batch.

        The model's forward pass on the rows, padded or packed (``settings.packing``,
        :func:`hidden_logprobs`; ZeRO-3 padded), then the vocabulary head in chunks of
        ``settings.head_chunk_tokens`` positions: no ``[tokens, vocabulary]`` logits for the whole
        micro-batch on any ZeRO stage.

        Args:
            input_ids: `[B, L]` prompt ⊕ response, right-padded.
            attention_mask: `[B, L]`.
            prompt_lengths, response_lengths: `[B]`.

        Returns:
            logprobs `[B, T]` (T = max response length; 0 on padding) and entropies `[B, T]` or None.
        """
        ctx = torch.enable_grad() if grad else torch.no_grad()
        module = self.ds if grad else self.ds.module
        with ctx:
            # The final hidden states, then the vocabulary projection a chunk of response positions
            # at a time (reflexdb.logprobs.hidden_response_logprobs): the [B, T, V] logits of long
            # rows were the learner's largest tensors (docs/benchmarks.md, "Memory"). Under ZeRO-3
            # the head is called as a module, whose hooks gather its partitioned weight.
            return hidden_logprobs(module, self.ds.module.get_output_embeddings(), input_ids, attention_mask,
                                   prompt_lengths, response_lengths, packed=self.packed, device=self.device,
                                   temperature=temperature, with_entropy=with_entropy,
                                   chunk_tokens=self.settings.head_chunk_tokens)

    def backward(self, loss: torch.Tensor) -> None:
        # Our losses are already weighted for their share of the step; no 1/GAS scaling on top.
        self.ds.backward(loss, scale_wrt_gas=False)

    def step(self) -> float | None:
        """Advance one micro-step; at the accumulation boundary this is the optimizer step.

        Returns the global gradient norm at a boundary (before clipping), else None.
        """
        boundary = self.ds.is_gradient_accumulation_boundary()
        own = None
        if boundary and self.settings.zero_stage == 0:
            # ZeRO-0 with a client optimizer records no norm in DeepSpeed: take it here, after the
            # boundary backward averaged the gradients over ranks and before the step clips them.
            grads = [p.grad for p in self.ds.module.parameters() if p.grad is not None]
            if grads:
                own = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))
        self.ds.step()
        if not boundary:
            return None
        norm = self.ds.get_global_grad_norm()
        return float(norm) if norm is not None else own

    def zero_grad(self) -> None:
        self.ds.zero_grad()

    # ------------------------------------------------------------------ checkpoints

    def snapshot_weights(self) -> dict[str, torch.Tensor]:
        """The module's weights copied to host memory (tied weights stay one tensor), for
        :meth:`export_hf` to write while training goes on. ZeRO stage 0-2 only (every rank holds
        the whole model)."""
        if self.settings.zero_stage == 3:
            raise ValueError("a weight snapshot needs ZeRO stage 0-2: ZeRO-3 gathers the weights collectively")
        copies: dict[int, torch.Tensor] = {}
        out: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name, t in self.ds.module.state_dict().items():
                key = t.data_ptr()
                if key not in copies:
                    copies[key] = t.detach().to("cpu", copy=True)
                out[name] = copies[key]
        return out

    def export_hf(self, out_dir: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> str:
        """Write an HF-loadable safetensors directory atomically; return the sha256 of its weights.

        The weights in the module's dtype (bfloat16 on a GPU: what collectors load, half of float32),
        in shards of at most ``publish_shard_bytes`` with ``save_pretrained``'s index, and a
        ``manifest.json`` of every file's size and sha256 (:func:`reflexdb.storage.write_manifest`).
        Runs on every rank (ZeRO-3 gathers parameters collectively); rank 0 writes. With
        ``state_dict`` (a :meth:`snapshot_weights`), those weights are written instead of the
        module's live ones: rank 0 alone, from any thread.
        """
        import deepspeed

        out = Path(out_dir)
        tmp = out.with_name(out.name + f"{PARTIAL_WEIGHTS_MARK}{os.getpid()}")
        module = self.ds.module
        params = list(module.parameters())
        gather = deepspeed.zero.GatheredParameters(params, modifier_rank=None) if self.settings.zero_stage == 3 \
            else _Null()
        with gather:
            if self.rank == 0:
                if tmp.exists():
                    shutil.rmtree(tmp)
                module.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict,
                                       max_shard_size=self.settings.publish_shard_bytes)
                self.tokenizer.save_pretrained(tmp)
        digest = ""
        if self.rank == 0:
            digest, _ = write_manifest(tmp)  # each file's sha256 and the weights', in one read
            if self.settings.fsync:
                fsync_tree(tmp)
            if out.exists():  # a directory no row names: left by a publish that never recorded it
                shutil.rmtree(out)
            os.replace(tmp, out)
            _fsync_dir(out.parent)
        return digest

    def save_state(self, directory: str | Path, tag: str, client_state: dict) -> None:
        """DeepSpeed checkpoint (module, optimizer, scheduler, client state) as ``directory/tag``.

        DeepSpeed writes it into ``directory/.partial-<tag>/<tag>`` (every rank its own files); rank
        0 flushes it and renames it to ``directory/<tag>`` once all ranks are done.
        """
        directory = Path(directory)
        final, partial = directory / tag, directory / f"{PARTIAL_STATE_PREFIX}{tag}"
        if self.rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)
        self._barrier()
        self.ds.save_checkpoint(str(partial), tag=tag, client_state=client_state)
        self._barrier()
        if self.rank == 0:
            if self.settings.fsync:
                fsync_tree(partial / tag)
            if final.exists():  # a directory no row names: left by a publish that never recorded it
                shutil.rmtree(final)
            os.rename(partial / tag, final)
            _fsync_dir(directory)
            shutil.rmtree(partial, ignore_errors=True)
        self._barrier()

    def _barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier()

    def load_state(self, directory: str | Path, tag: str) -> dict:
        """Load ``directory/tag``; raises :class:`StateUnreadable` if its files cannot be read."""
        try:
            path, client_state = self.ds.load_checkpoint(str(directory), tag=tag, load_optimizer_states=True,
                                                         load_lr_scheduler_states=True)
        except Exception as exc:
            # torch.load of a truncated file raises EOFError ("Ran out of input"), which the command
            # line would otherwise turn into a bare "Aborted."
            raise StateUnreadable(f"{Path(directory) / tag}: {type(exc).__name__}: {exc}") from None
        if path is None:
            raise StateUnreadable(f"no DeepSpeed checkpoint {tag!r} in {directory}")
        return client_state or {}


def _zero_config(settings: EngineSettings) -> dict:
    """DeepSpeed's ``zero_optimization``: the stage, and the offloads to host memory (pinned with a GPU)."""
    zero: dict = {"stage": settings.zero_stage}
    pin = torch.device(settings.device).type == "cuda"
    if settings.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if settings.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    return zero


class OffloadUnavailable(ReflexdbError):
    """``learner.offload_optimizer`` needs DeepSpeed's CPU Adam op, which could not be built or loaded here."""

    exit_code = 2


def _optimizer(model, settings: EngineSettings, say: Callable[[str], None]) -> torch.optim.Optimizer:
    """AdamW: torch's; with the optimizer offloaded, DeepSpeed's CPU Adam (the same update, in
    AdamW mode: ZeRO-Offload steps the float32 partition in host memory and refuses other
    optimizers there), whose C++ op is JIT-built once per machine (about a minute, under torch's
    build lock, watched as the communication op's is)."""
    if not settings.offload_optimizer:
        return torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=settings.betas,
                                 weight_decay=settings.weight_decay)
    from .buildlock import BuildLockWatch

    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        with BuildLockWatch(say, builder="CPUAdamBuilder"):
            return DeepSpeedCPUAdam(model.parameters(), lr=settings.lr, betas=settings.betas,
                                    weight_decay=settings.weight_decay, adamw_mode=True)
    except Exception as exc:  # noqa: BLE001 - a failed JIT build raises RuntimeError, ImportError, CalledProcessError
        raise OffloadUnavailable(f"learner.offload_optimizer needs DeepSpeed's CPU Adam op, which could not be built "
                                 f"or loaded here ({type(exc).__name__}: {str(exc)[:300]}); it needs a C++ compiler "
                                 "and ninja (or DeepSpeed installed with DS_BUILD_CPU_ADAM=1): install them, or set "
                                 "learner.offload_optimizer: false") from None


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


#: sha256 over a directory's ``*.safetensors`` files, in name order (reflexdb/storage.py: collectors
#: verify fetched versions with it, without importing the trainer)
weights_sha256 = _weights_sha256
