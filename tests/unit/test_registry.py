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
