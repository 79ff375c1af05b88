"""Which system calls tool code makes: the measurement behind the sandbox's allow list (issue 50).

Runs tool calls in the real jail (nsjail, namespaces, mounts, cgroup, rlimits) with the seccomp
filter replaced by one that allows everything, under ``strace -f``, and records every system call
the interpreter and its children made after ``execve`` of Python, with the arguments the filter
looks at (``ioctl`` requests, ``prctl`` options, ``socket`` families, ``clone`` flags,
``personality`` values). Two sources, kept apart in the results:

- ``corpus``: the ordinary tool calls of ``tests/sandbox_corpus.py`` and the sandbox's time-per-call
  program: what the allow list must let through;
- ``tests``: every tool call the given test files make (by default the sandbox's, the tool
  environment's, CLEANER's and the hostile tests), run in process with pytest: hostile code
  deliberately attempts what the filter refuses, so these are reviewed, not allowed wholesale.

Then it compares with ``collector/sandbox.kafel``: calls the corpus makes that the filter refuses
(each one breaks ordinary code: allow it or say why not; ``clone3`` is answered ENOSYS on purpose),
and calls only the tests make. The tests that check a refusal fail under the allow-everything
filter: that is expected, and their calls are what is recorded.

    python benchmarks/sandbox_syscalls.py --json-out benchmarks/results/sandbox_syscalls.json

Needs ``strace`` (Debian's package) and what the sandbox needs (root or a delegated cgroup).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reflexdb.collector import sandbox as sandbox_module  # noqa: E402
from reflexdb.collector.sandbox import POLICY, PythonSandbox, SandboxLimits  # noqa: E402

TESTS = ["tests/store/test_sandbox.py", "tests/store/test_tool_python.py", "tests/store/test_hostile_output.py",
         "tests/methods/cleaner/store/test_cleaner.py"]
#: The filter that lets everything through: what code *tries* is what strace sees.
LOG_POLICY = "POLICY log_everything { ALLOW { read } }\nUSE log_everything DEFAULT ALLOW\n"
#: The arguments the allow list filters on: syscall → index of the argument recorded.
ARGS = {"ioctl": 1, "prctl": 0, "socket": 0, "socketpair": 0, "clone": 0, "personality": 0}
_PYTHON = re.compile(r'"[^"]*/python[0-9.]*"')  # execve of the interpreter (nsjail's own path may hold "python")
_LINE = re.compile(r"^(\d+)\s+(?:<\.\.\. (\w+) resumed>|(\w+)\((.*))")

_ARGV = PythonSandbox.argv  # the real command line, before install() wraps it
_traces: list[tuple[str, Path]] = []  # (source, trace file)
_counter = itertools.count()


def traced_argv(box: PythonSandbox, source: str, work: Path) -> list[str]:
    """``box``'s nsjail command line under strace, with the allow-everything filter."""
    argv = _ARGV(box)
    i = argv.index("--seccomp_policy")
    argv[i + 1] = str(work / "log_everything.kafel")
    trace = work / f"trace.{next(_counter)}"
    _traces.append((source, trace))
    return ["/usr/bin/strace", "-f", "-qq", "-X", "raw", "-s", "0", "-o", str(trace), *argv]


def install(source: str, work: Path) -> None:
    """Make every PythonSandbox of this process trace its calls as ``source``."""
    (work / "log_everything.kafel").write_text(LOG_POLICY)
    sandbox_module.PythonSandbox.argv = lambda self: traced_argv(self, source, work)
    sandbox_module.PythonSandbox.check = lambda self: None  # the probe would refuse the allow-all filter


def parse(trace: Path) -> tuple[Counter, dict[str, set]]:
    """Syscalls made after Python's execve by Python and the processes it started."""
    calls: Counter = Counter()
    args: dict[str, set] = defaultdict(set)
    started, python, before = False, None, set()
    for line in trace.read_text(errors="replace").splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        pid, resumed, name, rest = m.groups()
        if not started:
            if name == "execve" and _PYTHON.match(rest or ""):
                started, python = True, pid
            else:
                before.add(pid)
            continue
        if resumed or (pid in before and pid != python):
            continue  # nsjail's own process, before and after
        calls[name] += 1
        if name in ARGS:
            flags = re.search(r"flags=(\w+)", rest or "")
            parts = [p.strip() for p in (rest or "").split(",")]
            if flags:
                args[name].add(flags.group(1))
            elif len(parts) > ARGS[name]:
                args[name].add(parts[ARGS[name]].split(")")[0].split(" ")[0])
    return calls, args


#: Calls the policy answers ENOSYS on purpose: the C library then falls back (clone3 to clone).
ANSWERED_ENOSYS = {"clone3"}
#: kafel names the kernel's entry points; strace names the calls.
KAFEL_NAMES = {"newuname": "uname", "newstat": "stat", "newfstat": "fstat", "newlstat": "lstat",
               "sendfile64": "sendfile"}


def allowed_by_policy(text: str) -> set[str]:
    """The syscall names the ALLOW blocks name, as strace names them (argument filters ignored)."""
    body = re.sub(r"//[^\n]*|#define[^\n]*", "", text)
    body = re.sub(r"\([^()]*\)", "", body)  # declared argument names
    while re.search(r"\{[^{}]*[=&|][^{}]*\}", body):  # argument expressions, innermost first
        body = re.sub(r"\{[^{}]*[=&|][^{}]*\}", "", body)
    names: set[str] = set()
    for block in re.finditer(r"ALLOW\s*\{([^{}]*)\}", body):
        names |= {KAFEL_NAMES.get(n, n) for n in re.findall(r"\b([a-z_][a-z0-9_]*)\b", block.group(1))}
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests", nargs="*", default=TESTS, help="test files whose tool calls are traced too")
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()
    if not shutil.which("strace"):
        sys.exit("needs strace (apt-get install strace)")
    from tests.sandbox_corpus import SNIPPETS

    from benchmarks.sandbox_bench import CODE

    work = Path(tempfile.mkdtemp(prefix="reflexdb-syscalls-"))
    install("corpus", work)
    box = PythonSandbox(SandboxLimits(timeout_s=30, cpu_s=30))
    for name, code in {**SNIPPETS, "time-per-call program": CODE}.items():
        res = box.run(code)
        print(f"corpus: {name}: {res.status}", file=sys.stderr)
    if a.tests:
        import pytest

        install("tests", work)
        pytest.main(["-q", "-n", "0", "-p", "no:cacheprovider", *a.tests])

    by_source: dict[str, Counter] = {"corpus": Counter(), "tests": Counter()}
    args: dict[str, dict[str, set]] = {"corpus": defaultdict(set), "tests": defaultdict(set)}
    for source, trace in _traces:
        if trace.exists():
            calls, seen = parse(trace)
            by_source[source].update(calls)
            for k, v in seen.items():
                args[source][k] |= v
    allowed = allowed_by_policy(POLICY.read_text())
    corpus_refused = sorted(set(by_source["corpus"]) - allowed - ANSWERED_ENOSYS)
    tests_only = sorted(set(by_source["tests"]) - set(by_source["corpus"]))
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{subprocess.run(['uname', '-srm'], capture_output=True, text=True).stdout.strip()}",
        "python": subprocess.run(["/usr/bin/python3", "-V"], capture_output=True, text=True).stdout.strip(),
        "calls_traced": {s: sum(1 for src, _ in _traces if src == s) for s in by_source},
        "syscalls": {name: {s: by_source[s][name] for s in by_source}
                     for name in sorted(set(by_source["corpus"]) | set(by_source["tests"]))},
        "arguments": {s: {k: sorted(v) for k, v in args[s].items()} for s in args},
        "corpus_calls_the_policy_refuses": corpus_refused,
        "answered_enosys_on_purpose": sorted(ANSWERED_ENOSYS),
        "calls_only_the_tests_make": {n: n in allowed for n in tests_only},
    }
    print(f"{len(result['syscalls'])} distinct system calls; corpus {len(by_source['corpus'])}, "
          f"tests {len(by_source['tests'])}")
    print(f"the corpus makes and the policy refuses: {', '.join(corpus_refused) or 'none'}")
    only = [n if ok else f"{n} (refused)" for n, ok in result["calls_only_the_tests_make"].items()]
    print(f"only the tests make: {', '.join(only)}")
    for s in args:
        for k, v in sorted(args[s].items()):
            print(f"{s} {k}: {' '.join(sorted(v))}")
    if a.json_out:
        a.json_out.write_text(json.dumps(result, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
