"""What ``reflexdb runs delete`` deletes besides the rows: what the run's learner recorded as published.

Only the run's ``policy_versions`` rows say where its versions lie: the URI collectors read (or
``meta.stored_at``, where it was uploaded when collectors read it by another URL) and the
learner state's directory (``meta.learner_state``). ``runs.config`` is never read for it: a login
that could insert a run could aim its config anywhere. A place is deleted only when it is the
run's own:

- ``<url>/<name>.r<id>/vK`` in storage and ``<dir>/<name>.r<id>/vK`` on disk (the run's prefix and
  directory, :func:`reflexdb.storage.run_prefix`; ``$REFLEXDB_HOME/checkpoints/<name>.r<id>`` too,
  where a learner that recorded nothing yet claimed it): only when the marker there
  (``reflexdb-run.json``) names the run: the directory whole (weights and learner states); the
  prefix's ``vK`` and its marker;
- ``$REFLEXDB_HOME/checkpoints/<name>/vK``: the directory of a run from before runs had one of their
  own, named after it: removed whole;
- any other ``…/vK`` (a version recorded before runs had places of their own, under a URL or a
  directory another run may share): only when its weights are still those the row records
  (:func:`reflexdb.storage.remove_if_recorded`). A learner state there is left, and named.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import runs, storage
from ..settings import home


@dataclass
class Plan:
    """The run's published places, read from its rows before they are deleted.

    ``dirs``: its own local directories; ``old_dirs``: ``$REFLEXDB_HOME/checkpoints/<name>``;
    ``prefixes``: its own prefixes in storage (URL -> storage options); ``versions``: versions
    recorded elsewhere, ``(version, URI, sha256, options)``; ``left``: what is not deleted, and why.
    """

    owner: storage.Owner
    dirs: list[Path] = field(default_factory=list)
    old_dirs: list[Path] = field(default_factory=list)
    prefixes: dict[str, dict[str, Any]] = field(default_factory=dict)
    versions: list[tuple[int, str, str | None, dict[str, Any]]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """``, DIR, its versions in URL, …``: what :func:`remove` will delete (for the question and the result)."""
        parts = [str(d) for d in self.dirs + self.old_dirs if d.exists()]
        parts += [f"its versions in {storage.mask(p)}" for p in self.prefixes]
        if self.versions:
            parts.append(f"{len(self.versions)} version(s) recorded before it had a place of its own (where their "
                         "weights are still its own)")
        return "".join(f", {p}" for p in parts)


def _options(uri: str, config: Any) -> dict[str, Any]:
    """The run's storage options for ``uri``'s scheme: how to reach storage (an endpoint, a region),
    never what to delete."""
    learner = config.get("learner") if isinstance(config, dict) else None
    if not isinstance(learner, dict) or not isinstance(learner.get("checkpoint_url"), str):
        return {}
    options = learner.get("checkpoint_storage_options")
    if not isinstance(options, dict):
        return {}
    try:  # stored by a learner that checked them; checked again: the row is the database's, not ours
        storage.check_options(options)
    except ValueError:
        return {}
    return storage.options_for(uri, learner["checkpoint_url"], options)


def _old_default(directory: Path, name: str) -> bool:
    """Whether ``directory`` is ``$REFLEXDB_HOME/checkpoints/<name>``, the run's own before runs had ``<name>.r<id>``."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        return False
    base = (home() / "checkpoints").resolve()
    mine = (base / name).resolve()
    return mine.parent == base and directory.resolve() == mine


def plan(store, run_id: int, name: str, created_at, config: Any = None) -> Plan:
    """What deleting run ``run_id`` deletes outside the database, from its ``policy_versions`` rows.
    ``config`` (``runs.config``) only lends the storage options to reach a URI the rows name."""
    p = Plan(storage.Owner.of(name, run_id, created_at))
    key = storage.run_key(run_id, name)
    states: list[tuple[int, Path]] = []
    for version, uri, sha, meta in runs.published(store, run_id):
        meta = meta if isinstance(meta, dict) else {}
        stored = meta["stored_at"] if isinstance(meta.get("stored_at"), str) else uri
        leaf = f"v{version}"
        if isinstance(meta.get("learner_state"), str) and isinstance(meta.get("state_tag"), str):
            state_dir = Path(meta["learner_state"])
            states.append((version, state_dir / meta["state_tag"]))
            if state_dir.is_absolute() and ".." not in state_dir.parts and state_dir.name == "states" \
                    and state_dir.parent.name == key and state_dir.parent not in p.dirs:
                p.dirs.append(state_dir.parent)  # the run's own directory (its local copies, with a checkpoint_url)
        if storage.is_remote(stored):
            parent, _, last = stored.rstrip("/").rpartition("/")
            if storage.scheme(stored) in storage.READ_ONLY:
                p.left.append(f"v{version} at {storage.mask(stored)}: {storage.scheme(stored)}:// cannot delete; "
                              "delete it where the learner uploaded it")
            elif last != leaf or not parent:
                p.left.append(f"v{version} at {storage.mask(stored)}: not a place reflexdb publishes to")
            elif parent.rpartition("/")[2] == key:
                p.prefixes.setdefault(parent, _options(stored, config))
            else:
                p.versions.append((version, stored, sha, _options(stored, config)))
            continue
        path = storage.local_path(stored)
        if not path.is_absolute() or ".." in path.parts or path.name != leaf:
            p.left.append(f"v{version} at {stored}: not a place reflexdb publishes to")
        elif path.parent.name == key:
            if path.parent not in p.dirs:
                p.dirs.append(path.parent)
        elif _old_default(path.parent, name):
            if path.parent not in p.old_dirs:
                p.old_dirs.append(path.parent)
        else:
            p.versions.append((version, stored, sha, {}))
    default = home() / "checkpoints" / key  # the default place, claimed at start even if nothing was recorded
    if default.is_dir() and default.resolve() not in [d.resolve() for d in p.dirs]:
        p.dirs.append(default)
    for version, state in states:
        if not any(state.is_relative_to(d) for d in p.dirs + p.old_dirs) and state.exists():
            p.left.append(f"the learner state of v{version} ({state}): recorded in a directory other runs may share")
    return p


def remove(p: Plan) -> tuple[int, list[str]]:
    """Delete what ``p`` names (the run's rows are gone by now); ``(versions deleted in storage,
    what was not deleted and why)``. Nothing raises: each failure is one line of the second."""
    removed, left = 0, list(p.left)
    for d in p.dirs:
        if not d.exists():
            continue
        try:
            storage.check_owner(str(d), None, p.owner, "not deleting")
            shutil.rmtree(d)
        except (storage.StorageError, OSError) as exc:
            left.append(str(exc) if isinstance(exc, storage.StorageError) else f"{d}: {storage.reason(exc)}")
    for d in p.old_dirs:
        try:
            if d.exists():
                shutil.rmtree(d)
        except OSError as exc:
            left.append(f"{d}: {storage.reason(exc)}")
    for prefix, options in p.prefixes.items():
        try:
            removed += len(storage.remove_versions(prefix, options, owner=p.owner))
        except storage.StorageError as exc:
            left.append(f"{exc}: remove the vK prefixes there yourself")
    for version, uri, sha, options in p.versions:
        try:
            if storage.remove_if_recorded(uri, sha, options):
                removed += 1 if storage.is_remote(uri) else 0
            elif storage.is_remote(uri) or storage.local_path(uri).exists():
                left.append(f"v{version} at {storage.mask(uri)}: its weights are not the ones this run recorded "
                            "(another run on the same place published over it?)")
        except Exception as exc:  # noqa: BLE001 - any storage error, named
            left.append(f"could not delete v{version} at {storage.mask(uri)}: {storage.reason(exc, uri)}")
    return removed, left


__all__ = ["Plan", "plan", "remove"]
