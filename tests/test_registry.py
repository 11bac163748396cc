"""The one registry helper (``pml_suprank._registry``): decorator, one spelling per name plus aliases, no silent
replacement."""

from __future__ import annotations

import pytest

from pml_suprank._registry import Registry
from pml_suprank.metrics import METRICS, MetricSpec


def test_decorator_names_and_aliases():
    reg = Registry("thing")

    @reg.register("my-thing", aliases=("MyThing", "mything"))
    class MyThing:
        pass

    assert reg.names() == ("my-thing",) and list(reg) == ["my-thing"] and len(reg) == 1
    assert reg.get_class("my-thing") is reg.get_class("MyThing") is reg.get_class("mything") is MyThing
    assert "MyThing" not in reg and reg.aliases() == {"MyThing": "my-thing", "mything": "my-thing"}
    with pytest.raises(ValueError, match=r"unknown thing 'My-Thing'; expected one of \['my-thing'\]"):
        reg.get_class("My-Thing")
    assert reg.unregister("MyThing") is MyThing and len(reg) == 0 and reg.aliases() == {}


def test_a_taken_name_is_never_replaced_silently():
    warn, refuse = Registry("thing"), Registry("metric", on_conflict="refuse")
    warn.register("a", int)
    with pytest.warns(
        UserWarning, match=r"thing 'a' is already registered for int \(module builtins\); replacing it with float"
    ):
        warn.register("a", float)
    assert warn.get_class("a") is float
    refuse.register("a", int)
    with pytest.raises(ValueError, match=r"metric 'a' is already registered for int \(module builtins\)"):
        refuse.register("a", float)
    with pytest.raises(ValueError, match=r"alias 'a' is the name of int \(module builtins\)"):
        refuse.register("b", float, aliases=("a",))
    assert refuse.get_class("a") is int and refuse.names() == ("a",)
    refuse.register("a", int)  # the same object again: nothing to say
    with pytest.raises(ValueError, match="on_conflict"):
        Registry("thing", on_conflict="ignore")


def test_the_metric_registry_refuses_a_second_ap():
    assert isinstance(METRICS, Registry) and METRICS.names()[:2] == ("ap", "map_at_r")
    spec = MetricSpec("ap", "ap", "AP", lambda st, a: None, "another AP")
    with pytest.raises(ValueError, match="metric 'ap' is already registered"):
        METRICS.register("ap", spec)
    with pytest.raises(TypeError):
        METRICS["ap"] = spec  # read-only mapping
