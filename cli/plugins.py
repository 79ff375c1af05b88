"""``reflexdb plugins``: the installed plug-ins (reflexdb's own parts included), what each declares,
and which are left out (``reflexdb -p no:NAME``, ``REFLEXDB_DISABLE_PLUGINS``)."""

from __future__ import annotations

import typer

from . import screen


def plugins() -> None:
    """List every ``reflexdb.plugins`` entry point: loaded or left out, and the parts of each
    package declared as one Plugin object (methods, workflows, loss families, migration branch,
    tables it archives)."""
    from reflexdb import plugins as registry

    registry.load_plugins()
    rows = []
    for name, (value, plugin, disabled) in sorted(registry.LOADED.items()):
        if plugin is None:
            parts = "-" if disabled else "(registers its parts on import)"
        else:
            said = [("methods", [m.name for m in plugin.methods]), ("workflows", list(plugin.workflows)),
                    ("losses", list(plugin.losses)), ("environments", list(plugin.environments)),
                    ("rewards", list(plugin.rewards)), ("migrations", [plugin.name] if plugin.migrations else []),
                    ("archives", [t for t, _, _ in plugin.archived])]
            parts = "; ".join(f"{k}: {', '.join(v)}" for k, v in said if v) or "-"
        rows.append((name, "left out" if disabled else "loaded", value, parts))
    typer.echo(screen.format_table(["plug-in", "status", "entry point", "declares"], rows))
