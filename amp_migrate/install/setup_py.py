"""setup.py: the string entries of the literal lists a `setup(...)` call's `install_requires`,
`extras_require`, `setup_requires` and `tests_require` hold.

Only literals are edited: a list or tuple of plain strings given to the keyword, a dict of
them for `extras_require`, or such a list assigned once at module level to the name the
keyword passes. Anything computed (`base + (["apex"] if cuda else [])`, a list read from a
file) is reported where it spells an Apex requirement, since no edit of it could say what the
result installs.
"""

from __future__ import annotations

import ast
from typing import Optional, Sequence, Union

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from .edits import Edited, Found, Rewrite
from .requirement import is_apex

_KEYWORDS = ("install_requires", "extras_require", "setup_requires", "tests_require")
_Sequence = Union[cst.List, cst.Tuple]


def _string(node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def _quoted(original: cst.SimpleString, text: str) -> cst.SimpleString:
    quote = original.quote
    if quote in text or "\\" in text:
        return cst.SimpleString(repr(text))
    return original.with_changes(value=f"{original.prefix}{quote}{text}{quote}")


def _is_setup(call: cst.Call) -> bool:
    func = call.func
    return (isinstance(func, cst.Name) and func.value == "setup") or (
        isinstance(func, cst.Attribute) and func.attr.value == "setup"
    )


class _Edit(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, rewrite: Rewrite, assigned: dict[str, list[cst.CSTNode]]) -> None:
        super().__init__()
        self.rewrite = rewrite
        self.assigned = assigned
        self.found: list[Found] = []
        self.literal: set[int] = set()  # id() of the list and tuple nodes to edit
        self.dynamic: list[cst.CSTNode] = []  # values that are not literals: reported

    def take_call(self, node: cst.Call) -> None:
        if not _is_setup(node):
            return
        for arg in node.args:
            if arg.keyword is None or arg.keyword.value not in _KEYWORDS:
                continue
            if arg.keyword.value == "extras_require" and isinstance(arg.value, cst.Dict):
                for element in arg.value.elements:
                    if isinstance(element, cst.DictElement):
                        self._take(element.value)
                    else:
                        self.dynamic.append(element)
            else:
                self._take(arg.value)

    def _take(self, value: cst.BaseExpression) -> None:
        if isinstance(value, (cst.List, cst.Tuple)) and all(
            isinstance(e, cst.Element) and _string(e.value) is not None for e in value.elements
        ):
            self.literal.add(id(value))
            return
        bound = self.assigned.get(value.value, []) if isinstance(value, cst.Name) else []
        if len(bound) == 1 and isinstance(bound[0], cst.Assign):
            if isinstance(bound[0].value, (cst.List, cst.Tuple)):
                self._take(bound[0].value)
                return
        self.dynamic.append(value)
        if isinstance(value, cst.Name):
            self.dynamic.extend(self.assigned.get(value.value, []))

    def _line(self, node: cst.CSTNode) -> tuple[int, int]:
        position = self.get_metadata(PositionProvider, node)
        return position.start.line, position.start.column + 1

    def _edited(self, original: _Sequence, updated: _Sequence) -> _Sequence:
        elements: list[cst.Element] = []
        for before, element in zip(original.elements, updated.elements):
            assert isinstance(element, cst.Element) and isinstance(element.value, cst.SimpleString)
            text = _string(element.value)
            assert text is not None
            new = self.rewrite(text)
            if new is None:
                elements.append(element)
                continue
            self.found.append(Found(*self._line(before), text, new=tuple(new)))
            if new == [text]:
                elements.append(element)
                continue
            for index, entry in enumerate(new):
                value = element.value if entry == text else _quoted(element.value, entry)
                elements.append(
                    element.with_changes(value=value, comma=_comma(element.comma, index, len(new)))
                )
        last_removed = bool(updated.elements) and not any(e is updated.elements[-1] for e in elements)
        return updated.with_changes(
            elements=_commas_kept(updated.elements, elements) if last_removed else elements
        )

    def leave_List(self, original_node: cst.List, updated_node: cst.List) -> cst.BaseExpression:
        return (
            self._edited(original_node, updated_node) if id(original_node) in self.literal else updated_node
        )

    def leave_Tuple(self, original_node: cst.Tuple, updated_node: cst.Tuple) -> cst.BaseExpression:
        if id(original_node) not in self.literal:
            return updated_node
        edited = self._edited(original_node, updated_node)
        if len(edited.elements) == 1 and not isinstance(edited.elements[0].comma, cst.Comma):
            element = edited.elements[0]  # `("torch",)` stays a tuple
            edited = edited.with_changes(elements=[element.with_changes(comma=cst.Comma())])
        return edited


def _comma(
    comma: Union[cst.Comma, cst.MaybeSentinel], index: int, count: int
) -> Union[cst.Comma, cst.MaybeSentinel]:
    """The comma of the `index`th of `count` elements that replace one: the first keeps the
    original's (and its comment), the others take its layout without the comment, and only
    the last may go without one."""
    if count == 1:
        return comma
    if not isinstance(comma, cst.Comma):
        return (
            cst.MaybeSentinel.DEFAULT
            if index == count - 1
            else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        )
    after = comma.whitespace_after
    if index and isinstance(after, cst.ParenthesizedWhitespace) and after.first_line.comment is not None:
        first = after.first_line.with_changes(whitespace=cst.SimpleWhitespace(""), comment=None)
        return comma.with_changes(whitespace_after=after.with_changes(first_line=first))
    return comma


def _commas_kept(before: Sequence[cst.BaseElement], after: list[cst.Element]) -> list[cst.Element]:
    """With the list's last element removed, the new last one takes its comma (or its
    absence), so that removing `"apex"` from `["torch", "apex"]` leaves `["torch"]`."""
    if after and before:
        after[-1] = after[-1].with_changes(comma=before[-1].comma)
    return after


def _assignments(module: cst.Module) -> dict[str, list[cst.CSTNode]]:
    """Module-level statements that bind each name: a list is edited only where one plain
    assignment binds it."""
    found: dict[str, list[cst.CSTNode]] = {}
    for statement in module.body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Assign):
                    for target in small.targets:
                        if isinstance(target.target, cst.Name):
                            found.setdefault(target.target.value, []).append(small)
                elif isinstance(small, (cst.AugAssign, cst.AnnAssign)) and isinstance(small.target, cst.Name):
                    found.setdefault(small.target.value, []).append(small)
    return found


def _apex_strings(wrapper: MetadataWrapper, nodes: list[cst.CSTNode]) -> list[Found]:
    """Apex requirements spelled inside values the editor does not edit."""
    positions = wrapper.resolve(PositionProvider)
    wanted = {id(n) for n in nodes}
    found: list[Found] = []

    class _Strings(cst.CSTVisitor):
        inside = 0

        def on_visit(self, node: cst.CSTNode) -> bool:
            if id(node) in wanted:
                self.inside += 1
            if self.inside and isinstance(node, cst.SimpleString):
                text = _string(node)
                if text is not None and is_apex(text):
                    where = positions[node].start
                    found.append(
                        Found(where.line, where.column + 1, text, False, "a computed requirement list")
                    )
            return True

        def on_leave(self, original_node: cst.CSTNode) -> None:
            if id(original_node) in wanted:
                self.inside -= 1

    wrapper.module.visit(_Strings())
    return found


def edit(text: str, rewrite: Rewrite) -> Edited:
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError:
        return Edited(text, ())
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    transformer = _Edit(rewrite, _assignments(module))
    wrapper.visit(_Collect(transformer))
    new = wrapper.visit(transformer)
    dynamic = _apex_strings(wrapper, transformer.dynamic)
    found = sorted(transformer.found + dynamic, key=lambda f: (f.line, f.col))
    try:
        ast.parse(new.code)  # the edit only drops or swaps string elements: it must still parse
    except SyntaxError:
        return Edited(
            text,
            tuple(Found(f.line, f.col, f.requirement, False, "an edit that would not parse") for f in found),
        )
    return Edited(new.code, tuple(found))


class _Collect(cst.CSTVisitor):
    """Marks the literals to edit before the transformer reaches them: a module-level list
    comes before the `setup()` call that names it."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, transformer: _Edit) -> None:
        super().__init__()
        self.transformer = transformer

    def visit_Call(self, node: cst.Call) -> None:
        self.transformer.take_call(node)
