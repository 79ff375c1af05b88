"""One registry mechanism (reflexdb/plugins.py): reflexdb's own parts are found through the same
``reflexdb.plugins`` entry points as a plug-in's, and every registry behaves the same way."""

from __future__ import annotations

from importlib.metadata import EntryPoint, distribution

import pytest

from reflexdb import plugins
from reflexdb.errors import UnknownMethod, UnknownName
from reflexdb.plugins import GROUP, METHODS, REGISTRIES, PluginError, Registry


def test_builtins_come_from_reflexdbs_own_entry_points():
    eps = [ep for ep in distribution("reflexdb").entry_points if ep.group == GROUP]
    assert eps, "reflexdb declares its built-ins as reflexdb.plugins entry points"
    for ep in eps:
        assert ep.value.startswith("reflexdb."), ep
        ep.load()  # each imports
    assert {"grpo", "dr_grpo", "dapo", "gspo", "opmd", "grpo_lambda", "raft", "nexgrpo", "lte", "r3l",
            "cleaner"} <= set(METHODS.names())
    assert {"group", "eval", "nexgrpo_replay", "lte_hint", "r3l", "cleaner"} <= set(REGISTRIES["workflow"].names())
    assert {"single", "multi_attempt", "tool_python"} <= set(REGISTRIES["environment"].names())
    assert {"grpo", "sft", "grpo_lambda", "lte_shaped"} <= set(REGISTRIES["loss"].names())
    assert {"math", "math_boxed"} <= set(REGISTRIES["reward function"].names())


def test_every_method_names_registered_parts():
    """A built-in method's loss is a registered loss (the parts meet only through the registries)."""
    for name, method in METHODS.items():
        assert method.loss in REGISTRIES["loss"], (name, method.loss)


def test_register_get_replace_and_unknown():
    r: Registry = Registry("gadget")
    r._items["x"] = 1  # no plug-in loading needed for what follows: the group is loaded once per process
    one, two = object(), object()
    assert r.register("a", one) is one
    assert r.register("a", one) is one  # the same object again (a module imported twice): a no-op
    with pytest.raises(ValueError, match="gadget 'a' is already registered"):
        r.register("a", two)
    assert r.register("a", two, replace=True) is two and r.get("a") is two
    with pytest.raises(UnknownName, match=r"unknown gadget 'zz'; known: a, x") as err:
        r.get("zz")
    assert isinstance(err.value, KeyError) and isinstance(err.value, LookupError)
    assert str(err.value) == "unknown gadget 'zz'; known: a, x"  # not quoted as a bare KeyError would be
    assert "a" in r and "zz" not in r and r.names() == ["a", "x"] and len(r) == 2


def test_decorator_names_a_class():
    r: Registry = Registry("widget", names_class=True)

    @r.register("w")
    class W:
        pass

    assert W.name == "w" and r.get("w") is W


def test_unknown_method_is_a_value_error_naming_the_built_ones():
    with pytest.raises(UnknownMethod, match="algorithm 'nope' is not a registered method; the methods built are: "
                                            "cleaner, dapo") as err:
        METHODS.get("nope")
    assert isinstance(err.value, ValueError) and isinstance(err.value, KeyError)


def test_a_broken_plugin_is_named(monkeypatch):
    broken = EntryPoint("broken", "no_such_module_for_reflexdb", GROUP)
    monkeypatch.setattr(plugins, "_loaded", False)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [broken])
    with pytest.raises(PluginError, match=r"plug-in 'broken' \(no_such_module_for_reflexdb, entry point group "
                                          r"reflexdb.plugins\) failed to load: ModuleNotFoundError"):
        plugins.load_plugins()


def test_an_install_without_the_builtin_entry_points_says_so(monkeypatch):
    monkeypatch.setattr(plugins, "_loaded", False)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [])
    monkeypatch.setattr(REGISTRIES["loss"], "_items", {})
    with pytest.raises(PluginError, match=r"not registered: .* run `pip install -e \.`"):
        plugins.load_plugins()


# ------------------------------------------------------------------ one Plugin object per package


class _EntryPoint:
    """An entry point whose ``load`` returns a given object (or raises), for load_plugins."""

    def __init__(self, name, obj, value=None):
        self.name, self.value, self._obj = name, value or f"tests:{name}", obj

    def load(self):
        if isinstance(self._obj, Exception):
            raise self._obj
        return self._obj


def _load(monkeypatch, *eps, disable: str | None = None):
    monkeypatch.setattr(plugins, "_loaded", False)
    monkeypatch.setattr(plugins, "LOADED", {})
    monkeypatch.setattr(plugins, "entry_points", lambda group: list(eps))
    if disable is None:
        monkeypatch.delenv(plugins.DISABLE_ENV, raising=False)
    else:
        monkeypatch.setenv(plugins.DISABLE_ENV, disable)
    plugins.load_plugins()


def test_the_builtin_methods_are_plugin_objects_named_as_their_entry_points():
    eps = {ep.name: ep for ep in distribution("reflexdb").entry_points if ep.group == GROUP}
    for name in ("baselines", "grpo_lambda", "raft", "nexgrpo", "lte", "r3l", "cleaner"):
        obj = eps[name].load()
        assert isinstance(obj, plugins.Plugin) and obj.name == name and obj.problems() == [], name
    # the tables a method archives are the tables it declares: restore can find their columns
    assert plugins.ARCHIVED.get("lte") == eps["lte"].load().archived and "lte" in plugins.TABLES


def test_a_plugin_registers_every_part_it_declares(monkeypatch, tmp_path):
    from reflexdb.trainer.method_api import Method

    (tmp_path / "sql").mkdir()
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "demo_0001.py").write_text("revision = 'demo_0001'\n")

    class DemoWorkflow:
        pass

    demo = plugins.Plugin(name="demo", methods=(Method("demo_method", "a demo", "grpo"),),
                          workflows={"demo_flow": DemoWorkflow}, sql=tmp_path / "sql", migrations=tmp_path / "migrations")
    for registry in REGISTRIES.values():  # registering into copies: the real registries stay as they are
        monkeypatch.setattr(registry, "_items", dict(registry._items))
    _load(monkeypatch, _EntryPoint("demo", demo))
    assert METHODS.get("demo_method").summary == "a demo"
    assert REGISTRIES["workflow"].get("demo_flow") is DemoWorkflow and DemoWorkflow.name == "demo_flow"
    assert plugins.SQL.get("demo") == tmp_path / "sql" and plugins.MIGRATIONS.get("demo") == tmp_path / "migrations"
    assert plugins.LOADED["demo"] == ("tests:demo", demo, False)


def test_a_plugin_that_archives_a_table_it_does_not_declare_is_refused_when_loaded(monkeypatch):
    """The restore of a run failed with ``KeyError: 'mymethod_picks'`` when a plug-in archived a
    table without declaring it (issue 52): now loading says so, naming the table."""
    bad = plugins.Plugin(name="mymethod", archived=(("mymethod_picks", "run_id = %(run)s", "id"),))
    with pytest.raises(PluginError, match=r"plug-in 'mymethod' is declared wrong: archived: 'mymethod_picks' but no "
                                          r"tables module \(Plugin.tables\): archive and restore need their columns"):
        _load(monkeypatch, _EntryPoint("mymethod", bad))
    # a tables module that does not declare it: found where the tables are loaded (schema.full_metadata)
    lte_tables = "reflexdb.methods.lte.tables"
    wrong = plugins.Plugin(name="mymethod", tables=lte_tables, archived=(("mymethod_picks", "run_id = %(run)s", "id"),))
    assert wrong.problems() == []  # loading imports nothing
    assert wrong.problems(tables=True) == [f"archived: table 'mymethod_picks' is not declared by the plug-in's tables "
                                           f"module ({lte_tables}): archive and restore need its columns"]
    worse = plugins.Plugin(name="mymethod", sql="/no/such/folder", tables="no_such_module_for_reflexdb",
                           archived=(("t", "run_id = 1", "id"),))
    problems = worse.problems(tables=True)
    assert any("sql: /no/such/folder is not a folder" in p for p in problems)
    assert any("tables: module 'no_such_module_for_reflexdb' failed to import: ModuleNotFoundError" in p for p in problems)
    assert any("does not name the run (%(run)s)" in p for p in problems)
    # a table a downgrade may drop with rows in it must be one of its archived tables (reflexdb.migrate.RowsGuard)
    kept = plugins.Plugin(name="mymethod", tables=lte_tables, archived=(("lte_stages", "run_id = %(run)s", "id"),),
                          kept_by_downgrade=("lte_stages", "mymethod_links"))
    assert kept.problems() == ["kept_by_downgrade: 'mymethod_links' is not one of its archived tables"]
    with pytest.raises(PluginError, match=r"its Plugin object is named 'other'; name the entry point as the plugin"):
        _load(monkeypatch, _EntryPoint("mymethod", plugins.Plugin(name="other")))


def test_a_disabled_plugin_is_not_even_imported_and_core_parts_cannot_be_disabled(monkeypatch):
    broken = _EntryPoint("broken", ImportError("would fail if imported"))
    _load(monkeypatch, broken, disable="broken, other")  # as `reflexdb -p no:broken -p no:other`
    assert plugins.LOADED["broken"] == ("tests:broken", None, True)
    with pytest.raises(PluginError, match=r"REFLEXDB_DISABLE_PLUGINS names core.losses: reflexdb's own core parts "
                                          r"cannot be left out"):
        _load(monkeypatch, broken, disable="core.losses")


def test_a_module_entry_point_of_an_older_install_finds_the_packages_plugin(monkeypatch):
    import types

    module = types.ModuleType("old_style")
    module.plugin = plugins.Plugin(name="old_style")
    _load(monkeypatch, _EntryPoint("old_style", module, value="old_style"))
    assert plugins.LOADED["old_style"][1] is module.plugin


def test_reflexdb_plugins_lists_them_and_p_no_name_leaves_one_out_in_its_children_too():
    """`reflexdb plugins` and `reflexdb -p no:NAME ...` (processes: the registries are per process)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != plugins.DISABLE_ENV}
    cmd = [sys.executable, "-m", "reflexdb.cli.main"]
    out = subprocess.run(cmd + ["plugins"], env=env, capture_output=True, text=True, check=True).stdout
    assert "nexgrpo" in out and "reflexdb.methods.nexgrpo:plugin" in out and "left out" not in out
    assert "methods: grpo, dr_grpo, dapo, gspo, opmd" in out
    out = subprocess.run(cmd + ["-p", "no:nexgrpo", "plugins"], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("nexgrpo ")] == ["left out"]
    example = Path(__file__).resolve().parents[2] / "examples" / "arithmetic-nexgrpo.yaml"
    p = subprocess.run(cmd + ["-p", "no:nexgrpo", "check", str(example), "-q"], env=env, capture_output=True, text=True)
    assert p.returncode != 0 and "algorithm 'nexgrpo' is not a registered method" in p.stderr + p.stdout
    p = subprocess.run(cmd + ["-p", "nexgrpo", "plugins"], env=env, capture_output=True, text=True)
    assert p.returncode == 2 and "-p takes no:NAME" in p.stderr


def test_a_methods_drops_view_must_be_a_name():
    """``Method.drops`` (issue 60): the view of the groups a method never trains goes into SQL as an
    identifier; anything else is refused when the method is declared, naming it."""
    from reflexdb.trainer.method_api import Method

    assert Method("m", "a method", "grpo", drops="m_group_holds").drops == "m_group_holds"
    assert Method("m", "a method", "grpo", drops="analysis.m_drops").drops == "analysis.m_drops"
    for bad in ("m drops", "m_drops; DROP TABLE runs", "", "a.b.c", "1st", 7):
        with pytest.raises(ValueError, match=r"method 'm': drops .* is not the name of a view or table"):
            Method("m", "a method", "grpo", drops=bad)
