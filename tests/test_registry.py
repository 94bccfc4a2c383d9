"""Tests for agent_memory.registry.Registry and the five registries built on it."""

from __future__ import annotations

import ast
import graphlib
import itertools
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from agent_memory.formatting import (
    Formatter,
    SimpleFormatter,
    available_formatters,
    make_formatter,
    register_formatter,
)
from agent_memory.formatting import base as formatting_base
from agent_memory.memory import HistoryMemory, available_memories, make_memory, register_memory
from agent_memory.memory import registry as memory_registry
from agent_memory.memory.compaction import (
    ExtractiveSummarizer,
    available_summarizers,
    make_summarizer,
    register_summarizer,
)
from agent_memory.memory.search import (
    BM25Encoder,
    HashingEmbedder,
    available_encoders,
    make_encoder,
    register_encoder,
)
from agent_memory.policies import available_policies, make_policy, register_policy
from agent_memory.policies.simple import RandomPolicy
from agent_memory.registry import Registry


def exactly(message: str) -> str:
    """A ``match`` pattern for the whole message, byte for byte."""
    return f"^{re.escape(message)}$"


class Shape:
    def __init__(self, side: int = 1) -> None:
        self.side = side


class Square(Shape):
    pass


def taken(kind: str, name: str, factory: object) -> str:
    return f"{kind} named {name!r} is already registered ({factory!r}); pass overwrite=True to replace it"


# ------------------------------------------------------------------------------ Registry itself


def test_register_as_call_and_decorator_then_look_up():
    reg: Registry[Shape] = Registry("shape")
    assert reg.register("square", Square) is Square

    @reg.register("unit")
    def unit() -> Shape:
        return Shape(1)

    assert reg.names() == ["square", "unit"]
    assert reg.get("unit") is unit
    assert "square" in reg and "circle" not in reg
    made = reg.make("square", side=4)
    assert type(made) is Square and made.side == 4
    assert reg.pop("unit") is unit
    assert reg.names() == ["square"]
    assert reg.pop("unit", None) is None
    with pytest.raises(KeyError):
        reg.pop("unit")


def test_make_passes_a_kwarg_called_name_to_the_factory():
    reg: Registry[dict] = Registry("thing")
    reg.register("d", dict)
    assert reg.make("d", name="x") == {"name": "x"}


def test_taken_names_are_refused_unless_same_factory_or_overwrite():
    reg: Registry[Shape] = Registry("shape")
    reg.register("square", Square)
    reg.register("square", Square)  # the same factory again: a re-import, fine
    with pytest.raises(ValueError, match=exactly(taken("a shape", "square", Square))):
        reg.register("square", Shape)
    assert reg.get("square") is Square
    reg.register("square", Shape, overwrite=True)
    assert reg.get("square") is Shape


def test_article_follows_the_first_letter_of_kind():
    reg: Registry[Shape] = Registry("ellipse")
    reg.register("e", Shape)
    with pytest.raises(ValueError, match=exactly(taken("an ellipse", "e", Shape))):
        reg.register("e", Square)


def test_unknown_name_lists_names_and_appends_the_hint():
    reg: Registry[Shape] = Registry("shape", hint=" (see docs)")
    reg.register("b", Shape)
    reg.register("a", Square)
    with pytest.raises(
        ValueError, match=exactly("unknown shape 'c': expected one of ['a', 'b'] (see docs)")
    ):
        reg.make("c")
    with pytest.raises(
        ValueError, match=exactly("unknown shape 'c': expected one of ['a', 'b'] (see docs)")
    ):
        reg.get("c")
    empty: Registry[Shape] = Registry("shape")
    with pytest.raises(ValueError, match=exactly("unknown shape 'x': expected one of []")):
        empty.make("x")


def test_name_attr_tags_registered_classes_only():
    class Tagged(Shape):
        pass

    def factory() -> Shape:
        return Shape()

    reg: Registry[Shape] = Registry("shape", name_attr="registry_name")
    reg.register("tagged", Tagged)
    reg.register("fn", factory)
    assert Tagged.registry_name == "tagged"
    assert not hasattr(factory, "registry_name")
    reg.register("alias", Tagged)  # the name it was last registered under
    assert Tagged.registry_name == "alias"
    plain: Registry[Shape] = Registry("shape")

    class Untagged(Shape):
        pass

    plain.register("u", Untagged)
    assert not hasattr(Untagged, "registry_name")


# ------------------------------------------------------------------------------ built-in table


def test_builtins_are_listed_without_importing_and_imported_when_named(tmp_path, monkeypatch):
    (tmp_path / "lazy_shapes.py").write_text(
        "from tests.test_registry import Square\nIMPORTED = True\nclass Round(Square):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    reg: Registry[Shape] = Registry("shape", builtins={"round": "lazy_shapes:Round"})
    reg.register("mine", Shape)
    assert reg.names() == ["mine", "round"] and "round" in reg
    assert "lazy_shapes" not in sys.modules  # listing and `in` import nothing
    assert reg.make("round", side=2).side == 2
    assert sys.modules["lazy_shapes"].IMPORTED


def test_a_builtin_name_is_taken():
    reg: Registry[Shape] = Registry("shape", builtins={"square": "tests.test_registry:Square"})
    with pytest.raises(
        ValueError,
        match=exactly(
            "a shape named 'square' is already registered (<class 'tests.test_registry.Square'>); "
            "pass overwrite=True to replace it"
        ),
    ):
        reg.register("square", Shape)
    reg.register("square", Shape, overwrite=True)
    assert reg.get("square") is Shape


def test_a_builtin_table_entry_must_name_module_and_attribute():
    with pytest.raises(
        ValueError, match=exactly("built-in shape 'x' must point to 'module:attribute', got 'x.Y'")
    ):
        Registry("shape", builtins={"x": "x.Y"})


class _Imports(ast.NodeVisitor):
    """Every agent_memory module a module imports, at any depth (inside functions too: a call
    that imports its own importer is a circle all the same), except under ``if TYPE_CHECKING:``
    (never run)."""

    def __init__(self, name: str, is_package: bool, modules: set[str]) -> None:
        self.package = name.split(".") if is_package else name.split(".")[:-1]
        self.modules = modules
        self.found: dict[str, int] = {}  # imported module -> line of its first import

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self._add([a.name for a in node.names], node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:  # `from . import x`, `from ..m import x`: relative to this package
            base = self.package[: len(self.package) - node.level + 1]
            module = ".".join([*base, *([module] if module else [])])
        # `from pkg import mod` depends on the submodule, not on the package's __init__
        subs = [f"{module}.{a.name}" for a in node.names]
        self._add([t for t in subs if t in self.modules] or [module], node.lineno)

    def _add(self, targets: list[str], line: int) -> None:
        for target in targets:
            if target in self.modules:
                self.found.setdefault(target, line)


def package_imports(root: Path) -> dict[str, dict[str, int]]:
    """agent_memory's import graph: module -> {module it imports: line}."""
    paths = {}
    for path in (root / "agent_memory").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in paths.items():
        imports = _Imports(name, path.name == "__init__.py", set(paths))
        imports.visit(ast.parse(path.read_text()))
        graph[name] = {t: line for t, line in imports.found.items() if t != name}
    return graph


def test_the_package_has_no_import_cycles():
    """No two agent_memory modules import each other, directly or round a longer circle, counting
    imports inside functions (done when called, they still tie the two modules together)."""
    graph = package_imports(Path(__file__).resolve().parents[1])
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        cycle = e.args[1]  # [a, b, ..., a]: each one imported by the next
        edges = [f"{a} imports {b} (line {graph[a][b]})" for b, a in itertools.pairwise(cycle)]
        pytest.fail("import circle: " + "; ".join(edges))


def test_the_cycle_check_sees_imports_inside_functions_and_relative_ones(tmp_path):
    pkg = tmp_path / "agent_memory"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import b\n")
    (pkg / "a.py").write_text("def f():\n    from agent_memory.sub.b import g\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import agent_memory.c\n"
        "def g():\n    import agent_memory.a\n"
    )
    (pkg / "c.py").write_text("import agent_memory.sub.b\n")
    assert package_imports(tmp_path) == {
        "agent_memory": {},
        "agent_memory.sub": {"agent_memory.sub.b": 1},
        "agent_memory.a": {"agent_memory.sub.b": 2},
        "agent_memory.sub.b": {"agent_memory.a": 5},  # not agent_memory.c: TYPE_CHECKING only
        "agent_memory.c": {"agent_memory.sub.b": 1},
    }


# ------------------------------------------------------------------------------ build (specs)


def test_build_from_name_mapping_or_instance():
    reg: Registry[Shape] = Registry("shape", instance_of=Shape)
    reg.register("square", Square)
    assert reg.build("square", side=2).side == 2
    assert reg.build({"name": "square", "side": 3}).side == 3
    assert reg.build({"name": "square", "side": 3}, side=5).side == 5  # kwargs win
    given = Shape(7)
    assert reg.build(given) is given


def test_build_errors_name_expected_and_actual():
    reg: Registry[Shape] = Registry("shape", instance_of=Shape)
    reg.register("square", Square)
    with pytest.raises(
        TypeError, match=exactly("shape kwargs ['side'] given with a Shape instance")
    ):
        reg.build(Shape(), side=2)
    with pytest.raises(
        ValueError, match=exactly("a shape mapping needs a 'name' key, got keys ['side']")
    ):
        reg.build({"side": 2})
    with pytest.raises(
        ValueError, match=exactly("a shape mapping needs a 'name' key, got keys []")
    ):
        reg.build({"name": None})
    with pytest.raises(
        TypeError, match=exactly("shape must be a registered name, a mapping or a Shape, got int")
    ):
        reg.build(3)
    with pytest.raises(
        TypeError, match=exactly("shape must be a registered name, a mapping or a Shape, got int")
    ):
        reg.build({"name": 3})
    with pytest.raises(
        ValueError, match=exactly("unknown shape 'circle': expected one of ['square']")
    ):
        reg.build({"name": "circle"})


def test_build_without_instance_of_takes_names_and_mappings_only():
    reg: Registry[Shape] = Registry("shape")
    reg.register("square", Square)
    assert reg.build({"name": "square"}).side == 1
    with pytest.raises(
        TypeError, match=exactly("shape must be a registered name or a mapping, got Shape")
    ):
        reg.build(Shape())


# ------------------------------------------------------------------------------ the five registries


# The calls, by case id, and the error each raises.
CALLS: dict[str, tuple[type[Exception], Callable[[], object]]] = {
    "formatter-unknown": (ValueError, lambda: make_formatter("nope")),
    "formatter-taken": (ValueError, lambda: register_formatter("simple", lambda: None)),
    "formatter-instance-kwargs": (TypeError, lambda: make_formatter(SimpleFormatter(), x=1)),
    "formatter-mapping-no-name": (ValueError, lambda: make_formatter({"max_chars": 3})),
    "formatter-bad-type": (TypeError, lambda: make_formatter(3)),
    "policy-unknown": (ValueError, lambda: make_policy("gpt")),
    "policy-taken": (ValueError, lambda: register_policy("random")(lambda: None)),
    "memory-unknown": (ValueError, lambda: make_memory("nope", num_envs=1)),
    "memory-taken": (ValueError, lambda: register_memory("history")(lambda **kw: None)),
    "encoder-unknown": (ValueError, lambda: make_encoder("glove")),
    "encoder-taken": (ValueError, lambda: register_encoder("bm25")(HashingEmbedder)),
    "encoder-instance-kwargs": (TypeError, lambda: make_encoder(HashingEmbedder(dim=16), dim=32)),
    "encoder-mapping-no-name": (ValueError, lambda: make_encoder({"dim": 16})),
    "encoder-bad-type": (TypeError, lambda: make_encoder(1.5)),
    "summarizer-unknown": (ValueError, lambda: make_summarizer("abstractive")),
    "summarizer-taken": (ValueError, lambda: register_summarizer("extractive")(lambda: None)),
    "summarizer-instance-kwargs": (TypeError, lambda: make_summarizer(ExtractiveSummarizer(), x=1)),
    "summarizer-mapping-no-name": (ValueError, lambda: make_summarizer({"x": 1})),
    "summarizer-bad-type": (TypeError, lambda: make_summarizer([])),
}


# Each case's whole message; the name lists and the reprs are read at run time (lambda), as
# other tests register names of their own.
MESSAGES: dict[str, str | Callable[[], str]] = {
    "formatter-unknown": lambda: (
        f"unknown formatter 'nope': expected one of {available_formatters()}; add your own with agent_memory.formatting.register_formatter"
    ),
    "formatter-taken": lambda: taken("a formatter", "simple", SimpleFormatter),
    "formatter-instance-kwargs": "formatter kwargs ['x'] given with a Formatter instance",
    "formatter-mapping-no-name": "a formatter mapping needs a 'name' key, got keys ['max_chars']",
    "formatter-bad-type": "formatter must be a registered name, a mapping or a Formatter, got int",
    "policy-unknown": lambda: (
        f"unknown policy 'gpt': expected one of {available_policies()} (choose one with e.g. policy=random, or register yours with agent_memory.policies.register_policy)"
    ),
    "policy-taken": lambda: taken("a policy", "random", RandomPolicy),
    "memory-unknown": lambda: (
        f"unknown memory strategy 'nope': expected one of {available_memories()} (choose one with e.g. memory=window, or register yours with agent_memory.memory.register_memory)"
    ),
    "memory-taken": lambda: taken(
        "a memory strategy", "history", memory_registry._REGISTRY.get("history")
    ),
    "encoder-unknown": lambda: (
        f"unknown encoder 'glove': expected one of {available_encoders()} (register yours with agent_memory.memory.search.register_encoder)"
    ),
    "encoder-taken": lambda: taken("an encoder", "bm25", BM25Encoder),
    "encoder-instance-kwargs": "encoder kwargs ['dim'] given with an Encoder instance",
    "encoder-mapping-no-name": "an encoder mapping needs a 'name' key, got keys ['dim']",
    "encoder-bad-type": "encoder must be a registered name, a mapping or an Encoder, got float",
    "summarizer-unknown": lambda: (
        f"unknown summarizer 'abstractive': expected one of {available_summarizers()} (or a Summarizer instance; register yours with agent_memory.memory.compaction.register_summarizer)"
    ),
    "summarizer-taken": lambda: taken("a summarizer", "extractive", ExtractiveSummarizer),
    "summarizer-instance-kwargs": "summarizer kwargs ['x'] given with a Summarizer instance",
    "summarizer-mapping-no-name": "a summarizer mapping needs a 'name' key, got keys ['x']",
    "summarizer-bad-type": "summarizer must be a registered name, a mapping or a Summarizer, got list",
}


# Their messages are public behaviour (tests and users match them): pinned whole.
def test_every_case_has_a_message():
    assert list(CALLS) == list(MESSAGES)


@pytest.mark.parametrize("case", list(CALLS))
def test_the_five_registries_keep_their_messages(case):
    error, call = CALLS[case]
    message = MESSAGES[case]
    with pytest.raises(error, match=exactly(message() if callable(message) else message)):
        call()


def test_the_five_registries_build_their_builtins():
    assert {"chat", "code", "jinja", "search", "simple"} <= set(available_formatters())
    assert {"random", "scripted"} <= set(available_policies())
    assert {"history"} <= set(available_memories())
    assert {"bm25", "hashing", "minilm"} <= set(available_encoders())
    assert {"extractive", "llm"} <= set(available_summarizers())
    assert isinstance(make_policy("random", seed=0), RandomPolicy)
    history = make_memory("history", num_envs=2)
    assert isinstance(history, HistoryMemory) and len(history) == 2
    assert make_encoder({"name": "hashing", "dim": 16}).spec()["name"] == "hashing"
    assert make_summarizer({"name": "extractive"}).name == "extractive"


def test_registry_name_is_set_on_formatters_encoders_summarizers_only():
    assert SimpleFormatter.registry_name == "simple"
    assert BM25Encoder.registry_name == "bm25"
    assert ExtractiveSummarizer.registry_name == "extractive"
    assert not hasattr(RandomPolicy, "registry_name")
    assert not hasattr(HistoryMemory, "registry_name")

    class Shout(Formatter):
        def render(self, record, step):
            return str(record["action"]).upper()

    assert register_formatter("test-registry-shout", Shout) is Shout
    try:
        assert make_formatter({"name": "test-registry-shout"}).spec() == {
            "name": "test-registry-shout"
        }
    finally:
        formatting_base._REGISTRY.pop("test-registry-shout")
