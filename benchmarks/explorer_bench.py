"""How fast the trajectory explorer opens its pages on a run of a million trajectories.

Fills a scratch database on a PostgreSQL server with one run shaped like a long GRPO run on
GSM8K: the real questions of ``../shared/data/gsm8k/train.jsonl`` as tasks, ``--groups`` groups of
8 (1,000,000 trajectories by default) over 250 policy versions, each row with a user and an
assistant turn (the answer's worked solution as the response text), 100 response tokens of
payload (ids, log-probs, versions, mask), about 40% correct; learner steps of 64 groups
consuming the first 80% of the groups, with their advantages. The rows are made by SQL
(``generate_series``), not through the store, so the fill takes minutes, not hours.

Then it starts the explorer as ``reflexdb ui`` does (``python -m reflexdb.explorer.serve``, its
own process, the read-only role) and times each page over HTTP: the first request (cold caches of
the server process) and the median of ``--repeats`` more, for the pages a person opens::

    python benchmarks/explorer_bench.py --url postgresql://postgres@127.0.0.1:5432/postgres
    python benchmarks/explorer_bench.py --url ... --groups 2000      # a quick check
    python benchmarks/explorer_bench.py --url ... --reuse            # time again without refilling

It creates the database ``reflexdb_explorer_bench`` on that server and leaves it for ``--reuse``
(``--drop`` drops it at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import date
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
DB = "reflexdb_explorer_bench"
RUN = "gsm8k-1m"
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "train.jsonl"
TOKENS = 100


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _db_url(url: str, name: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url.replace("postgresql+psycopg://", "postgresql://")).set(database=name).render_as_string(
        hide_password=False)


def fill(url: str, groups: int) -> None:
    from reflexdb.ops import admin
    from reflexdb.db import make_engine
    from reflexdb import roles

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB}"')
    target = _db_url(url, DB)
    admin.upgrade(target)
    engine = make_engine(target)
    roles.apply(engine)
    engine.dispose()
    questions = [json.loads(line) for line in GSM8K.read_text().splitlines() if line.strip()]
    t0 = time.monotonic()
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        run = conn.execute("INSERT INTO runs (name, algorithm, config) VALUES (%s, 'grpo', %s) RETURNING id",
                           (RUN, json.dumps({"model": "smollm2", "run": RUN}))).fetchone()[0]
        with conn.cursor().copy("COPY tasks (run_id, dataset, split, task_key, prompt, ground_truth) FROM STDIN") as cp:
            for i, q in enumerate(questions):
                cp.write_row((run, "gsm8k", "train", str(i), q["question"], q["answer"].split("####")[-1].strip()))
        conn.execute("CREATE TEMP TABLE sol AS SELECT k.id AS task_id, row_number() OVER (ORDER BY k.id) - 1 AS n "
                     "FROM tasks k WHERE k.run_id = %s", (run,))
        solutions = {i: q["answer"].replace("<<", "").replace(">>", "") for i, q in enumerate(questions)}
        conn.execute("CREATE TEMP TABLE answers (n int PRIMARY KEY, text text)")
        with conn.cursor().copy("COPY answers (n, text) FROM STDIN") as cp:
            for i, text in solutions.items():
                cp.write_row((i, text))
        versions = 250
        conn.execute("INSERT INTO policy_versions (run_id, version, checkpoint_uri, step) "
                     "SELECT %s, v, 'file:///bench/v' || v, v * 5 FROM generate_series(0, %s) v", (run, versions))
        n_tasks = len(questions)
        log(f"run {run}: {n_tasks} tasks; filling {groups} groups of 8")
        batch = 12_500
        for lo in range(0, groups, batch):
            hi = min(groups, lo + batch)
            conn.execute(
                """INSERT INTO groups (run_id, task_id, workflow, kind, policy_version, size, collector)
                   SELECT %(run)s, s.task_id, 'group', 'fresh', (g * %(versions)s / %(groups)s), 8, 'bench'
                   FROM generate_series(%(lo)s, %(hi)s - 1) g JOIN sol s ON s.n = g %% %(tasks)s
                   ORDER BY g""",
                dict(run=run, versions=versions, groups=groups, lo=lo, hi=hi, tasks=n_tasks))
            conn.execute(
                """WITH g AS (SELECT id, task_id, policy_version FROM groups WHERE run_id = %(run)s
                              ORDER BY id DESC LIMIT %(n)s),
                        r AS (SELECT g.*, i, random() AS u FROM g CROSS JOIN generate_series(0, 7) i)
                   INSERT INTO trajectories (group_id, run_id, task_id, index_in_group, origin, policy_version, reward,
                                             correct, extracted_answer, confidence, num_turns, response_length)
                   SELECT r.id, %(run)s, r.task_id, r.i, 'base', r.policy_version, (r.u < 0.4)::int::float, r.u < 0.4,
                          (r.u * 100)::int::text, 0.3 + 0.6 * r.u, 2, %(tokens)s
                   FROM r ORDER BY r.id, r.i""",
                dict(run=run, n=hi - lo, tokens=TOKENS))
            conn.execute(
                """WITH t AS (SELECT t.id, t.task_id FROM trajectories t WHERE t.run_id = %(run)s
                              AND t.group_id IN (SELECT id FROM groups WHERE run_id = %(run)s ORDER BY id DESC LIMIT %(n)s))
                   INSERT INTO turns (trajectory_id, run_id, turn_index, role, text, token_start, token_end, trainable)
                   SELECT t.id, %(run)s, 0, 'user', k.prompt, NULL, NULL, false FROM t JOIN tasks k ON k.id = t.task_id
                   UNION ALL
                   SELECT t.id, %(run)s, 1, 'assistant', a.text, 0, %(tokens)s, true
                   FROM t JOIN sol s ON s.task_id = t.task_id JOIN answers a ON a.n = s.n""",
                dict(run=run, n=hi - lo, tokens=TOKENS))
            conn.execute(
                """INSERT INTO token_bytes (trajectory_id, run_id, prompt_ids, response_ids, logprobs,
                                            token_policy_versions, loss_mask)
                   SELECT t.id, %(run)s, decode(repeat('10270000', 40), 'hex'),
                          decode(repeat('10270000', %(tokens)s), 'hex'), decode(repeat('cdcc4cbe', %(tokens)s), 'hex'),
                          decode(repeat('00000000', %(tokens)s), 'hex'), decode(repeat('01', %(tokens)s), 'hex')
                   FROM trajectories t WHERE t.run_id = %(run)s
                     AND t.group_id IN (SELECT id FROM groups WHERE run_id = %(run)s ORDER BY id DESC LIMIT %(n)s)""",
                dict(run=run, n=hi - lo, tokens=TOKENS))
            log(f"  {hi} groups, {8 * hi} trajectories ({time.monotonic() - t0:.0f} s)")
        trained = int(groups * 0.8) // 64
        conn.execute(
            """INSERT INTO learner_steps (run_id, step, policy_version, loss, metrics, advantage_stages)
               SELECT %(run)s, s, (s - 1) * 64 * %(versions)s / %(groups)s,
                      0.01 * sin(s), jsonb_build_object('loss/policy', 0.01 * sin(s), 'reward/mean', 0.4,
                                                        'loss/total', 0.01 * sin(s)),
                      ARRAY['group']
               FROM generate_series(1, %(steps)s) s""",
            dict(run=run, versions=versions, groups=groups, steps=trained))
        conn.execute(
            """WITH g AS (SELECT id, row_number() OVER (ORDER BY id) - 1 AS n FROM groups WHERE run_id = %(run)s)
               INSERT INTO consumption (step_id, trajectory_id, group_id, run_id, advantages)
               SELECT s.id, t.id, t.group_id, %(run)s, ARRAY[CASE WHEN t.correct THEN 1.2247 ELSE -0.8165 END]::real[]
               FROM g JOIN learner_steps s ON s.run_id = %(run)s AND s.step = g.n / 64 + 1
               JOIN trajectories t ON t.group_id = g.id AND t.run_id = %(run)s
               WHERE g.n < %(steps)s * 64""",
            dict(run=run, steps=trained))
        log(f"{trained} learner steps; ANALYZE")
        conn.execute("ANALYZE")
        size = conn.execute("SELECT pg_size_pretty(pg_database_size(current_database()))").fetchone()[0]
        log(f"filled in {time.monotonic() - t0:.0f} s; database {size}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=120) as resp:
            body = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        body, status = exc.read(), exc.code
    return (time.perf_counter() - t0) * 1000, status, len(body)


def pages(target: str) -> dict[str, str]:
    with psycopg.connect(target) as conn:
        run = conn.execute("SELECT id FROM runs WHERE name = %s", (RUN,)).fetchone()[0]
        tmax = conn.execute("SELECT max(id) FROM trajectories WHERE run_id = %s", (run,)).fetchone()[0]
        tmid = conn.execute("SELECT min(id) + (max(id) - min(id)) / 2 FROM trajectories WHERE run_id = %s",
                            (run,)).fetchone()[0]
        gmid = conn.execute("SELECT min(id) + (max(id) - min(id)) / 2 FROM groups WHERE run_id = %s", (run,)).fetchone()[0]
        step = conn.execute("SELECT max(step) / 2 FROM learner_steps WHERE run_id = %s", (run,)).fetchone()[0]
        task = conn.execute("SELECT task_id FROM trajectories WHERE id = %s AND run_id = %s", (tmid, run)).fetchone()[0]
    r = f"/runs/{RUN}"
    return {
        "runs (the first page)": "/",
        "a run: its learner steps": r,
        "trajectories, newest 50": f"{r}/trajectories",
        "trajectories, a page half-way down (before=)": f"{r}/trajectories?before={tmid}",
        "trajectories of a policy version": f"{r}/trajectories?version=125",
        "trajectories of a task": f"{r}/trajectories?task={task}",
        "trajectories: correct, reward >= 1": f"{r}/trajectories?correct=true&reward_min=1",
        "trajectories trained in a step": f"{r}/trajectories?step={step}",
        "trajectories: origin hinted (none: a full scan)": f"{r}/trajectories?origin=hinted",
        "trajectories: text in prompt or answer": f"{r}/trajectories?q=babysitting",
        "trajectories: text that matches nothing (a full scan)": f"{r}/trajectories?q=zz-no-such-text",
        "trajectories: text in the response": f"{r}/trajectories?response=babysitting",
        "trajectories: response text that matches nothing (a scan of 2M turns)":
            f"{r}/trajectories?response=zz-no-such-text",
        # the grid (explorer/tables.py): sorted by a column (keyset on (value, id)), its count, its downloads
        "trajectories sorted by reward, ascending": f"{r}/trajectories?sort=reward&dir=asc",
        "trajectories sorted by reward, descending, half-way down (after=, key=)":
            f"{r}/trajectories?sort=reward&dir=desc&after={tmid}&key=v1.0",
        "trajectories sorted by confidence": f"{r}/trajectories?sort=confidence&dir=desc",
        "trajectories sorted by answer": f"{r}/trajectories?sort=answer",
        "trajectories sorted by prompt": f"{r}/trajectories?sort=prompt",
        "trajectories sorted by advantage (a read of the run's consumption)": f"{r}/trajectories?sort=advantage&dir=desc",
        "trajectories sorted by completion (a scan of the assistant turns)": f"{r}/trajectories?sort=completion",
        "trajectories of a task, sorted by reward": f"{r}/trajectories?task={task}&sort=reward&dir=desc",
        "trajectories: correct, sorted by confidence": f"{r}/trajectories?correct=true&sort=confidence",
        "a task's trajectories as CSV": f"{r}/trajectories.csv?task={task}",
        "a policy version's trajectories as Parquet (4,000 rows, tokens)": f"{r}/trajectories.parquet?version=125",
        "groups, newest 50": f"{r}/groups",
        "a group": f"/groups/{gmid}",
        "a trajectory (per-token shading)": f"/trajectories/{tmid}",
        "a trajectory coloured by advantage (its token_signals row)": f"/trajectories/{tmid}?color=advantage",
        "a trajectory's trace": f"/trajectories/{tmid}/trace",
        "two rows of a group side by side": f"/trajectories/{tmid}/vs/{tmid + 1}",
        "a trajectory, raw JSON": f"/trajectories/{tmax}/raw",
        "a learner step (64 groups, 512 rows)": f"{r}/steps/{step}",
        "a task across versions (compare)": f"{r}/tasks/{task}",
    }


def measure(url: str, repeats: int) -> dict:
    target = _db_url(url, DB)
    port = _free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "reflexdb.explorer.serve", "--url", target, "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=2).read()
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the explorer did not start")
                time.sleep(0.3)
        # The first visit a person makes, at once after start-up: the run's page while the server
        # still reads the run's filter choices and warms its tokenizer and MLflow in the background.
        started = time.monotonic()
        cold, status, size = _get(f"{base}/runs/{RUN}")
        results = {"a run page, the first visit right after start-up": {
            "path": f"/runs/{RUN}", "status": status, "bytes": size, "first_ms": round(cold, 1),
            "median_ms": None, "max_ms": None}}
        log(f"first run page right after start: {status} {cold:8.1f} ms")
        time.sleep(max(0.0, 15 - (time.monotonic() - started)))  # the background warm-up done before timing
        with psycopg.connect(target) as conn:
            n = conn.execute("SELECT count(*) FROM trajectories").fetchone()[0]
        for name, path in pages(target).items():
            first, status, size = _get(base + path)
            times = [_get(base + path)[0] for _ in range(repeats)]
            results[name] = {"path": path, "status": status, "bytes": size, "first_ms": round(first, 1),
                             "median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}
            log(f"{name:48s} {status} first {first:8.1f} ms  median {statistics.median(times):8.1f} ms")
    finally:
        proc.terminate()
        proc.wait(30)
    return {"date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "trajectories": n, "repeats": repeats, "pages": results}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="a PostgreSQL server (its maintenance database) with CREATEDB")
    ap.add_argument("--groups", type=int, default=125_000, help="groups of 8 (default 125,000: 1M trajectories)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--reuse", action="store_true", help="time the database a previous run filled")
    ap.add_argument("--fill-only", action="store_true", help="fill the database, time nothing")
    ap.add_argument("--drop", action="store_true", help="drop the database at the end")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if not args.reuse:
        fill(args.url, args.groups)
    if args.fill_only:
        return
    out = measure(args.url, args.repeats)
    if args.json_out:
        args.json_out.write_text(json.dumps(out, indent=2))
    if args.drop:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


if __name__ == "__main__":
    main()
