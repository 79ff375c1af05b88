"""The API reference of a method's author (docs/api.md), generated from the code.

    python tools/apidoc.py > docs/api.md

It renders, in the order of :data:`SECTIONS`, each object a method package uses: its import path,
its signature (fields or parameters with their types and defaults, as the source writes them), its
docstring (Google style, turned into markdown) and its public members; then the tables a method
reads, from ``reflexdb.schema.metadata`` (columns, types, defaults, keys, checks, and the comments
beside them in ``reflexdb/schema.py``), and reflexdb's views with the first line of their SQL file.

Why not Sphinx or mkdocstrings (docs/design.md, "Methods as plug-ins"): no new dependency in CI,
markdown that GitHub renders beside the other docs, and the same regenerate-and-compare test as
docs/configuration.md (``tests/unit/test_api_doc.py``). Types are printed as the source writes
them: the modules use ``from __future__ import annotations`` and import what their annotations
name under ``TYPE_CHECKING`` (torch stays unimported by ``reflexdb check``), so resolving them with
``typing.get_type_hints`` would fail or print long qualified names; pydantic models' fields, which
pydantic resolves itself, are printed from the resolved types.

Nothing here is imported by reflexdb: it is a tool of the repository, like the tests.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import io
import re
import textwrap
import tokenize
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ForwardRef

from pydantic import BaseModel

COMMAND = "python tools/apidoc.py > docs/api.md"

#: ``(title, what the section is for, entries)``. An entry is ``"module:Name"`` (the object and its
#: own public members), ``"module:Name(a, b)"`` (those members only, and no constructor), or
#: ``"table:name"`` (a table of ``reflexdb.schema.metadata``); ``"views"`` lists reflexdb's views.
SECTIONS: list[tuple[str, str, list[str]]] = [
    ("The plug-in", "What a package declares, once: its entry point (group `reflexdb.plugins`) names this object.",
     ["reflexdb.plugins:Plugin", "reflexdb.plugins:PluginError"]),
    ("Methods", "What `algorithm: NAME` runs on the learner's side: a `Method` of plain functions, its loss "
                "terms, the batch they see, and optional stateful hooks.",
     ["reflexdb.trainer.method_api:Method", "reflexdb.trainer.method_api:WorkflowUse", "reflexdb.trainer.method_api:LossTerm",
      "reflexdb.trainer.method_api:valid_rows", "reflexdb.trainer.method_api:best_of_group",
      "reflexdb.trainer.method_api:Hooks", "reflexdb.trainer.method_api:LearnerContext",
      "reflexdb.trainer.batch:Selection", "reflexdb.trainer.batch:eligible_group_ids",
      "reflexdb.trainer.batch:Batch",
      "reflexdb.trainer.method_api:register_method", "reflexdb.trainer.method_api:get_method"]),
    ("Loss families and advantage transforms", "A loss term names a registered family and passes that family's "
     "typed parameters; a method that needs a new family registers a `LossSpec` (its package's `Plugin.losses`). "
     "Every family's parameters are listed in docs/configuration.md.",
     ["reflexdb.trainer.losses:LossSpec(parse, uses_reference)", "reflexdb.trainer.losses:SFTParams",
      "reflexdb.trainer.losses:sft_loss", "reflexdb.trainer.losses:register_loss_spec",
      "reflexdb.trainer.advantages:register_advantage_transform", "reflexdb.trainer.advantages:make_transform"]),
    ("The run's config", "What a method's functions receive as `cfg`; every key is in docs/configuration.md.",
     ["reflexdb.config:Config(section, method, loss_family, loss_params, advantage_scale)"]),
    ("Collector workflows", "What a collector runs for a method (`Method.workflows`): claim work, turn it into "
     "complete groups.",
     ["reflexdb.collector.workflows:Workflow", "reflexdb.collector.workflows:CollectContext",
      "reflexdb.collector.workflows.group:GroupWorkflow", "reflexdb.collector.workflows:register_workflow",
      "reflexdb.collector.workflows.base:replayed_copy", "reflexdb.collector.engines:Sample",
      "reflexdb.lazy:lazy"]),
    ("Environments", "What happens between the model's turns of an episode (`environment.name`).",
     ["reflexdb.collector.environments:Environment", "reflexdb.collector.environments:EnvTask",
      "reflexdb.collector.environments:Step", "reflexdb.collector.environments:register_environment"]),
    ("Records", "What a workflow hands the store (`*In`), and what the learner and a method's hooks read back.",
     ["reflexdb:GroupIn", "reflexdb:TrajectoryIn", "reflexdb:TurnIn", "reflexdb:Sibling", "reflexdb:WrittenGroup",
      "reflexdb:Group", "reflexdb:Trajectory", "reflexdb:Turn", "reflexdb.origins:Origin",
      "reflexdb.origins:GroupKind"]),
    ("The store", "A method's own SQL: an attachment written in a group's transaction, or a transaction of its own.",
     ["reflexdb.attachments:Attachment", "reflexdb:Store(transaction, origins, group_kinds)",
      "reflexdb.sqlfile:load_queries"]),
    ("Tables", "The tables a method reads or refers to, as `reflexdb/schema.py` declares them (the migrations "
     "create them; a test compares the two). A column's note is the comment beside it there. `trajectories` "
     "and the tables of per-trajectory rows are partitioned by run: a reference to a trajectory is "
     "`(trajectory_id, run_id)`.",
     [f"table:{name}" for name in ("runs", "run_settings", "tasks", "groups", "group_kinds", "trajectories",
                                   "origins", "turns", "policy_versions", "learner_steps", "consumption")]),
    ("Views", "reflexdb's own views, each made from `reflexdb/sql/views/<name>.sql` (its header says what it "
     "answers and the rules it implements; docs/store.md has their columns).", ["views"]),
]

_ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj):`~?([^`]+)`")
_SECTION = re.compile(r"^(Args|Arguments|Attributes|Returns|Raises|Yields|Example|Examples|Note|Notes):\s*$")
_ENTRY = re.compile(r"^(\S[^:]*?):\s*(.*)$")


# ---------------------------------------------------------------------------------- docstrings


def docstring(obj: Any) -> str:
    """``obj``'s own docstring, cleaned ('' when it has none: a generated dataclass or NamedTuple one
    counts as none, and nothing is inherited)."""
    doc = obj.__doc__ if not isinstance(obj, property) else obj.fget.__doc__
    if not doc:
        return ""
    doc = inspect.cleandoc(doc)
    if inspect.isclass(obj) and re.match(rf"{re.escape(obj.__name__)}\(.*\)$", doc, re.S):
        return ""  # dataclasses and namedtuples write "Name(field, ...)" where there was none
    return doc


def member_doc(cls: type, name: str, member: Any) -> str:
    """A member's docstring, else the comment beside its ``def`` in the source (a protocol's
    one-line ``def f(self) -> T: ...  # what it does``)."""
    said = docstring(member) or field_comments(cls).get(name, "")
    return said[:1].upper() + said[1:]


def markdown(doc: str) -> list[str]:
    """A Google-style docstring as markdown lines: ``Args:``-like sections become a bold title and a
    list of ``name``: text entries; an indented block after a paragraph ending in ``::`` or after a
    blank line is code."""
    out: list[str] = []
    lines = _ROLE.sub(r"``\1``", doc).splitlines()
    section: str | None = None
    code = False
    for i, line in enumerate(lines):
        if code:
            if line.strip() and not line.startswith("    "):
                out.append("```")
                code = False
            else:
                out.append(line[4:] if line.strip() else "")
                continue
        m = _SECTION.match(line)
        if m:
            section = m.group(1)
            out += ["", f"**{section}:**", ""]
            continue
        if section is not None:
            if line.strip() and not line.startswith(" "):
                section = None
                out.append("")  # the paragraph after a section is not part of its last entry
            elif not line.strip():
                continue
            else:
                body = line[4:] if line.startswith("    ") else line.strip()
                if section in ("Args", "Arguments", "Attributes", "Raises") and not body.startswith(" "):
                    e = _ENTRY.match(body)
                    if e:
                        names = ", ".join(f"`{n.strip()}`" for n in e.group(1).split(","))
                        out.append(f"- {names}: {e.group(2)}".rstrip())
                        continue
                if section in ("Example", "Examples"):
                    out.append("    " + body)
                    continue
                if out and out[-1] and not out[-1].startswith("**"):
                    out[-1] += " " + body.strip()
                else:
                    out.append(body.strip())
                continue
        if line.startswith("    ") and (not out or not out[-1].strip() or out[-1].endswith("::")):
            if out and out[-1].endswith("::"):
                out[-1] = out[-1][:-1]
                out.append("")
            elif out and out[-1] == "":
                pass
            out.append("```text")
            out.append(line[4:])
            code = True
            continue
        if line.rstrip().endswith("::") and i + 1 < len(lines) and not lines[i + 1].strip():
            out.append(line.rstrip()[:-1])  # "text::" then an indented block: "text:" and code
            out.append("")
            continue
        out.append(line)
    if code:
        while out and not out[-1].strip():
            out.pop()
        out.append("```")
    return out


# ---------------------------------------------------------------------------------- signatures


def type_text(annotation: Any) -> str:
    """An annotation as the source writes it (a string under ``from __future__ import annotations``), or
    a resolved type printed without ``typing.``."""
    if annotation is inspect.Parameter.empty:
        return ""
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, ForwardRef):  # a NamedTuple's string annotation
        return annotation.__forward_arg__
    if isinstance(annotation, type) and not isinstance(annotation, types.GenericAlias):
        return annotation.__name__
    text = re.sub(r"\b(typing|collections\.abc|pathlib|numpy|torch)\.", "", repr(annotation))
    return text.replace("NoneType", "None")


def default_text(value: Any) -> str:
    """A default value, stable across runs (a function by its name, never its address)."""
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)):
        return value.__name__
    if value is Ellipsis:
        return "..."
    if isinstance(value, Path):
        return f"Path({str(value)!r})"
    text = repr(value)
    if " at 0x" in text:
        raise ValueError(f"default {text} has no stable text: teach default_text about {type(value).__name__}")
    return text


def parameters(fn: Any, *, skip_self: bool = False) -> str:
    """``(a: int, *, b: str = 'x') -> R`` of ``fn``."""
    sig = inspect.signature(fn)
    parts: list[str] = []
    star = False
    params = list(sig.parameters.values())
    if skip_self and params and params[0].name in ("self", "cls"):
        params = params[1:]
    for p in params:
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.kind is p.VAR_POSITIONAL:
            star = True
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        text = prefix + p.name
        if p.annotation is not p.empty:
            text += f": {type_text(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {default_text(p.default)}" if p.annotation is not p.empty else f"={default_text(p.default)}"
        parts.append(text)
    ret = f" -> {type_text(sig.return_annotation)}" if sig.return_annotation is not sig.empty else ""
    return f"({', '.join(parts)}){ret}"


def field_comments(cls: type) -> dict[str, str]:
    """The comments beside each annotated name of ``cls``'s body in its source: a ``#:`` block above
    it (Sphinx's convention) and a ``# ...`` at the end of its line."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string
    lines = source.splitlines()
    out: dict[str, str] = {}
    [node] = ast.parse(source).body
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            name, first, last = stmt.target.id, stmt.lineno, stmt.end_lineno or stmt.lineno
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name, first, last = stmt.name, stmt.lineno, stmt.body[0].end_lineno or stmt.lineno
        else:
            continue
        above = []
        k = first - 1
        while k >= 1 and lines[k - 1].strip().startswith("#:"):
            above.insert(0, lines[k - 1].strip()[2:].strip())
            k -= 1
        after = comments.get(last, "")
        said = " ".join([*above, after.lstrip("#").strip()] if after and not after.startswith("#:") else above)
        if said.strip():
            out[name] = said.strip()
    return out


# ---------------------------------------------------------------------------------- objects


@dataclasses.dataclass
class Entry:
    """One object of the reference: where it is imported from, the object, the members shown."""

    path: str  # module:Name
    obj: Any
    members: list[str] | None  # None: every own public member


def entries() -> Iterator[tuple[str, str, list[Entry | str]]]:
    """The sections with their objects imported."""
    for title, intro, items in SECTIONS:
        resolved: list[Entry | str] = []
        for item in items:
            if item.startswith("table:") or item == "views":
                resolved.append(item)
                continue
            m = re.fullmatch(r"([\w.]+):(\w+)(?:\((.*)\))?", item)
            assert m, item
            module, name, members = m.groups()
            obj = getattr(importlib.import_module(module), name)
            resolved.append(Entry(f"{module}:{name}", obj,
                                  [x.strip() for x in members.split(",")] if members is not None else None))
        yield title, intro, resolved


def own_members(cls: type, names: list[str] | None) -> list[tuple[str, Any]]:
    """``(name, member)``: the listed ones, or the public functions and properties ``cls`` defines itself."""
    fields = set(getattr(cls, "__dataclass_fields__", {})) | set(getattr(cls, "_fields", ())) | \
        set(getattr(cls, "model_fields", {}) if isinstance(cls, type) and issubclass(cls, BaseModel) else ())
    out = []
    for name, value in vars(cls).items():
        if names is not None:
            continue
        if name.startswith("_") or name in fields:
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, (types.FunctionType, property)):
            out.append((name, value))
    if names is not None:
        for name in names:
            value = inspect.getattr_static(cls, name)
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            out.append((name, value))
    return out


def documented() -> list[tuple[str, str]]:
    """``(label, docstring)`` of every object and member the reference renders, and of each table
    (its comment in reflexdb/schema.py): what the test requires to be non-empty."""
    from reflexdb import schema

    notes = _schema_notes()
    out: list[tuple[str, str]] = []
    for _, _, items in entries():
        for e in items:
            if isinstance(e, str):
                if e.startswith("table:"):
                    name = e.split(":", 1)[1]
                    assert name in schema.metadata.tables, name
                    out.append((e, notes.get(name, ("", {}))[0]))
                continue
            out.append((e.path, docstring(e.obj)))
            if inspect.isclass(e.obj):
                out += [(f"{e.path}.{n}", member_doc(e.obj, n, m)) for n, m in own_members(e.obj, e.members)]
    return out


# ---------------------------------------------------------------------------------- rendering


def _public_path(e: Entry) -> str:
    module, name = e.path.split(":")
    return f"from {module} import {name}"


def render_class(e: Entry) -> list[str]:
    cls = e.obj
    name = cls.__name__
    out = [f"### `{name}`", "", f"`{_public_path(e)}`", ""]
    comments = field_comments(cls)
    block: list[str] = []
    table: list[str] = []
    if e.members is not None:
        pass  # an object shown for some members: no constructor
    elif isinstance(cls, type) and issubclass(cls, BaseModel):
        bases = ", ".join(b.__name__ for b in cls.__bases__)
        block.append(f"class {name}({bases}):  # a pydantic model: every field below, unknown keys refused")
        table = ["| field | type | default | bounds | meaning |", "|---|---|---|---|---|"]
        for fname, info in cls.model_fields.items():
            bounds = ", ".join(f"{type(c).__name__.lower()} {getattr(c, type(c).__name__.lower())}"
                               for c in info.metadata if type(c).__name__ in ("Ge", "Gt", "Le", "Lt"))
            default = "required" if info.is_required() else f"`{default_text(info.default)}`"
            table.append(f"| `{fname}` | `{type_text(info.annotation)}` | {default} | {bounds} | "
                         f"{(info.description or '').replace('|', '/')} |")
        block = []
    elif dataclasses.is_dataclass(cls):
        frozen = cls.__dataclass_params__.frozen
        block.append("@dataclass(frozen=True)" if frozen else "@dataclass")
        block.append(f"class {name}:")
        own = cls.__dict__.get("__annotations__", {})
        for f in dataclasses.fields(cls):
            text = f"    {f.name}: {type_text(own.get(f.name, f.type))}"
            if f.default is not dataclasses.MISSING:
                text += f" = {default_text(f.default)}"
            elif f.default_factory is not dataclasses.MISSING:
                text += f" = {default_text(f.default_factory)}()"
            if comments.get(f.name):
                text += f"  # {comments[f.name]}"
            block.append(text)
    elif issubclass(cls, tuple) and hasattr(cls, "_fields"):
        block.append(f"class {name}(NamedTuple):")
        for fname in cls._fields:
            text = f"    {fname}: {type_text(cls.__annotations__.get(fname, ''))}"
            if fname in cls._field_defaults:
                text += f" = {default_text(cls._field_defaults[fname])}"
            if comments.get(fname):
                text += f"  # {comments[fname]}"
            block.append(text)
    elif getattr(cls, "_is_protocol", False):
        block.append(f"class {name}(Protocol):")
        for fname, ann in cls.__dict__.get("__annotations__", {}).items():
            block.append(f"    {fname}: {type_text(ann)}" + (f"  # {comments[fname]}" if comments.get(fname) else ""))
        if len(block) == 1:
            block.append("    ...")
    elif issubclass(cls, BaseException):
        block.append(f"class {name}({', '.join(b.__name__ for b in cls.__bases__)})")
    else:
        block.append(f"class {name}{parameters(cls.__init__, skip_self=True).removesuffix(' -> None')}")
    if block:
        out += ["```python", *block, "```", ""]
    out += markdown(docstring(cls))
    out.append("")
    if table:
        out += [*table, ""]
    for mname, member in own_members(cls, e.members):
        out += render_member(name, mname, member, member_doc(cls, mname, member))
    return out


def render_member(owner: str, name: str, member: Any, doc: str) -> list[str]:
    if isinstance(member, property):
        ret = inspect.signature(member.fget).return_annotation
        typed = f": {type_text(ret)}" if ret is not inspect.Signature.empty else ""
        sig = f"{name}{typed}  # a property"
    else:
        sig = f"def {name}{parameters(member)}"
    return [f"#### `{owner}.{name}`", "", "```python", sig, "```", "", *markdown(doc), ""]


def render_function(e: Entry) -> list[str]:
    fn = e.obj
    name = e.path.split(":")[1]
    try:
        sig = f"def {name}{parameters(fn)}"
    except (TypeError, ValueError):
        sig = name
    return [f"### `{name}`", "", f"`{_public_path(e)}`", "", "```python", sig, "```", "",
            *markdown(docstring(fn)), ""]


def _schema_notes() -> dict[str, tuple[str, dict[str, str]]]:
    """table -> (the comment block above its declaration, {column: the comments above and beside it})
    in reflexdb/schema.py."""
    from reflexdb import schema

    source = Path(schema.__file__).read_text()
    lines = source.splitlines()
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#:").strip()
    out: dict[str, tuple[str, dict[str, str]]] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", None) == "Table"):
            continue
        table = node.value.args[0].value
        above = []
        k = node.lineno - 1
        while k >= 1 and lines[k - 1].strip().startswith("#"):
            above.insert(0, comments[k])
            k -= 1
        columns: dict[str, str] = {}
        for arg in node.value.args[2:]:
            if isinstance(arg, ast.Call) and getattr(arg.func, "id", None) == "Column":
                said = []
                k = arg.lineno - 1
                while k >= 1 and lines[k - 1].strip().startswith("#"):
                    said.insert(0, comments[k])
                    k -= 1
                if arg.end_lineno in comments and lines[arg.end_lineno - 1].split("#")[0].strip():
                    said.append(comments[arg.end_lineno])
                columns[arg.args[0].value] = " ".join(said)
        out[table] = (" ".join(above), columns)
    return out


def render_table(name: str, notes: dict[str, tuple[str, dict[str, str]]]) -> list[str]:
    from sqlalchemy import CheckConstraint, ForeignKeyConstraint
    from sqlalchemy.dialects import postgresql

    from reflexdb import schema

    table = schema.metadata.tables[name]
    about, column_notes = notes.get(name, ("", {}))
    out = [f"### `{name}`", "", about, ""]
    if table.dialect_options["postgresql"].get("partition_by"):
        out += [f"Partitioned by `{table.dialect_options['postgresql']['partition_by']}`.", ""]
    out += ["| column | type | null | default | key | note |", "|---|---|---|---|---|---|"]
    dialect = postgresql.dialect()
    pk = set(table.primary_key.columns.keys())
    for col in table.columns:
        keys = []
        if col.name in pk:
            keys.append("primary key")
        keys += [f"→ `{fk.target_fullname}`" for fk in col.foreign_keys]
        if col.unique:
            keys.append("unique")
        default = ""
        if col.identity is not None:
            default = "identity"
        elif col.server_default is not None:
            arg = col.server_default.arg
            default = getattr(arg, "text", None) or (str(arg.compile(dialect=dialect)) if hasattr(arg, "compile")
                                                     else str(arg))
        out.append(f"| `{col.name}` | {col.type.compile(dialect=dialect)} | {'yes' if col.nullable else 'no'} | "
                   f"{f'`{default}`' if default else ''} | {', '.join(keys)} | "
                   f"{column_notes.get(col.name, '').replace('|', '/')} |")
    out.append("")
    extra = []
    for c in sorted(table.constraints, key=lambda c: (type(c).__name__, str(getattr(c, "name", "")))):
        if isinstance(c, CheckConstraint):
            extra.append(f"- check: `{c.sqltext}`")
        elif isinstance(c, ForeignKeyConstraint) and len(c.columns) > 1:
            extra.append(f"- ({', '.join(c.columns.keys())}) → `{c.referred_table.name}` "
                         f"({', '.join(e.column.name for e in c.elements)})")
        elif type(c).__name__ == "UniqueConstraint" and len(c.columns) > 1:
            extra.append(f"- unique ({', '.join(c.columns.keys())})")
    if len(pk) > 1:
        extra.insert(0, f"- primary key ({', '.join(table.primary_key.columns.keys())})")
    if extra:
        out += extra + [""]
    return out


def render_views() -> list[str]:
    from reflexdb import schema

    folder = Path(schema.__file__).parent / "sql" / "views"
    out = ["| view | what it says |", "|---|---|"]
    for name in schema.VIEWS:
        first = (folder / f"{name}.sql").read_text().splitlines()[0].removeprefix("--").strip()
        out.append(f"| `{name}` | {first.removeprefix(name + ':').strip()} |")
    return out + [""]


def render() -> str:
    """docs/api.md."""
    notes = _schema_notes()
    lines = [
        "# API reference for method authors",
        "",
        f"<!-- Generated by `{COMMAND}`; tests/unit/test_api_doc.py keeps it in sync. -->",
        "",
        "What a method package uses of reflexdb, rendered from the code (signatures, docstrings, the",
        "schema). [tutorial-method.md](tutorial-method.md) builds a method with it step by step;",
        "[design.md](design.md#methods-as-plug-ins) says why the parts are what they are. Types are",
        "printed as the source writes them.",
        "",
    ]
    sections = list(entries())
    lines += ["## Contents", ""]
    for title, _, items in sections:
        anchor = re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")
        names = [e.path.split(":")[1] if isinstance(e, Entry) else e.removeprefix("table:") for e in items
                 if not (isinstance(e, str) and e == "views")]
        lines.append(f"- [{title}](#{anchor})" + (f": {', '.join(f'`{n}`' for n in names)}" if names else ""))
    lines.append("")
    for title, intro, items in sections:
        lines += [f"## {title}", "", intro, ""]
        for e in items:
            if isinstance(e, str):
                lines += render_views() if e == "views" else render_table(e.removeprefix("table:"), notes)
            elif inspect.isclass(e.obj):
                lines += render_class(e)
            else:
                lines += render_function(e)
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.rstrip("\n") + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(render(), end="")
