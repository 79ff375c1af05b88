"""``reflexdb runs``: the runs a database holds — list, show one, delete one."""

from __future__ import annotations

import typer

from . import screen

URL_OPTION = typer.Option(None, "--url", envvar="REFLEXDB_DATABASE_URL", help="PostgreSQL URL (default: config.toml, then embedded).")

app = typer.Typer(help="The runs in the experience database: list (the default), show NAME, delete NAME --yes.",
                  invoke_without_command=True)


def _size(n: int | None) -> str:
    n = float(n or 0)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""  # pragma: no cover


def _pass(version, value) -> str:
    return "-" if value is None else f"{float(value):.3f} (v{version})"


def _rows(store, name: str | None) -> list[dict]:
    from reflexdb import runs

    return runs.list_runs(store, name)


def _one(store, name: str) -> dict:
    from reflexdb.errors import NotFound

    rows = _rows(store, name)
    if not rows:
        names = [r["name"] for r in _rows(store, None)]
        import difflib

        close = difflib.get_close_matches(name, names, n=1)
        raise NotFound(f"no run named {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                       + ("; `reflexdb runs` lists them" if names else "; the database holds no run"))
    return rows[0]


@app.callback()
def runs(ctx: typer.Context, url: str = URL_OPTION) -> None:
    """List the runs: name, method, learner steps, latest policy version, trajectories, their
    estimated size, and held-out pass@1 at the first and the last version evaluated."""
    if ctx.invoked_subcommand is not None:
        return
    from reflexdb import Store

    with Store.open(url) as store:
        rows = _rows(store, None)
    if not rows:
        typer.echo("no runs yet: `reflexdb run examples/arithmetic-grpo.yaml` makes one")
        return
    table = [(r["name"], r["algorithm"] or "-", r["steps"] if r["steps"] is not None else "-",
              f"v{r['latest_version']}" if r["latest_version"] is not None else "-", f"{r['trajectories']:,}",
              _size(r["size_bytes"]), _pass(r["first_version"], r["first_pass_at_1"]),
              _pass(r["last_version"], r["last_pass_at_1"])) for r in rows]
    typer.echo(screen.format_table(["run", "method", "steps", "latest", "trajectories", "size ≈",
                                    "held-out pass@1 first", "last"], table))


@app.command()
def show(name: str = typer.Argument(..., help="The run's name."), url: str = URL_OPTION) -> None:
    """One run: its config's main keys, what it holds by origin, and every held-out evaluation."""
    from reflexdb import Store, runs

    with Store.open(url) as store:
        r = _one(store, name)
        evals, origins, live = runs.evals(store, r["id"]), runs.origins(store, r["id"]), runs.processes(store, name)
    cfg = r["config"] or {}
    fields = {
        "run": f"{r['name']} (id {r['id']}), created {r['created_at']:%Y-%m-%d %H:%M:%S %Z}",
        "method": f"{r['algorithm']}; model {cfg.get('model', '?')}; environment "
                  f"{(cfg.get('environment') or {}).get('name', '?')}; tasks {(cfg.get('tasks') or {}).get('source', '?')}",
        "learner": f"{r['steps'] if r['steps'] is not None else 0} steps, latest version "
                   + (f"v{r['latest_version']}" if r["latest_version"] is not None else "none"),
        "data": f"{r['trajectories']:,} trajectories in {r['groups']:,} training groups, ≈ {_size(r['size_bytes'])}"
                + (f"; last written {r['last_write']:%Y-%m-%d %H:%M:%S %Z}" if r["last_write"] else ""),
        "running now": ", ".join(f"{who} (pid {pid})" for _, who, _, pid in live) or "nothing",
    }
    width = max(map(len, fields))
    for k, v in fields.items():
        typer.echo(f"{k + ':':<{width + 1}} {v}")
    if origins:
        typer.echo("\n" + screen.format_table(["group kind", "origin", "trajectories", "mean reward"],
                                              [(k, o, f"{n:,}", "-" if m is None else f"{float(m):.3f}")
                                               for k, o, n, m in origins]))
    typer.echo("\n" + (screen.format_table(["version", "attempts", "held-out pass@1", "samples", "tasks", "evaluated at"],
                                           [(f"v{v}", a, f"{float(p):.3f}", n, t, f"{at:%Y-%m-%d %H:%M}")
                                            for v, a, p, n, t, at, _ in evals])
                       if evals else f"no held-out evaluation yet: `reflexdb eval -c CONFIG` (run {name!r})"))


@app.command()
def delete(
    name: str = typer.Argument(..., help="The run's name."),
    yes: bool = typer.Option(False, "--yes", help="Delete without asking (required when stdin is not a terminal)."),
    keep_files: bool = typer.Option(False, "--keep-files", help="Delete the rows only; keep checkpoints (local and in "
                                    "storage) and the FAISS index."),
    url: str = URL_OPTION,
) -> None:
    """Delete a run: every row of it (tasks, groups, trajectories, steps, versions, ...), the
    checkpoints its learner recorded as published (its own directory ``<name>.r<id>``, and in object
    storage its prefix's ``vK`` versions, with the credentials of this environment; never what the
    run's config names) and its FAISS index. Refused while a process of the run (collect, learn,
    eval, import) is connected or a collector of it reported in the last 2 minutes."""
    from reflexdb import Store
    from reflexdb.errors import ReflexdbError
    from reflexdb.ops import admin, published
    from reflexdb.index import default_directory
    from reflexdb import runs

    with Store.open(url) as store:
        r = _one(store, name)
        live = admin.run_processes(store, name)
        if live:
            raise ReflexdbError(f"run {name!r} is in use: {', '.join(live)}; stop it first (Ctrl-C or SIGTERM stops "
                                "cleanly)")
        plan = published.plan(store, r["id"], name, r["created_at"], r["config"])  # from its rows, before they go
        index_files = sorted(default_directory(store).glob(f"run-{r['id']}.*"))
        what = (f"run {name!r}: {r['trajectories']:,} trajectories, {r['steps'] or 0} steps"
                + ("" if keep_files else plan.describe()))
        if not yes:
            typer.confirm(f"delete {what}?", abort=True)
        runs.delete(store, r["id"])
    said, left = "", []
    if not keep_files:
        for f in index_files:
            f.unlink(missing_ok=True)
        # the rows are gone already: storage that fails now leaves objects no row names, said
        removed, left = published.remove(plan)
        said = f" ({removed} there)" if plan.prefixes or removed else ""
    typer.echo(f"deleted {what}" + ("; files kept" if keep_files else said))
    for line in left:
        typer.echo(f"not deleted: {line}")
