"""RFC 6901 JSON Pointers and an RFC 6902 JSON Patch builder over a working copy. Pure."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Token = str | int


def escape_token(token: Token) -> str:
    """One RFC 6901 reference token: ``~`` -> ``~0``, ``/`` -> ``~1`` (in that order)."""
    return str(token).replace("~", "~0").replace("/", "~1")


def pointer(tokens: Iterable[Token]) -> str:
    """An RFC 6901 JSON Pointer: ``("metadata", "annotations", "a/b")`` ->
    ``/metadata/annotations/a~1b``."""
    return "".join("/" + escape_token(t) for t in tokens)


def _child(node: Any, token: Token) -> Any:
    """The member or element ``token`` of ``node``; None when there is none."""
    if isinstance(node, dict) and isinstance(token, str):
        return node.get(token)
    if isinstance(node, list) and isinstance(token, int) and 0 <= token < len(node):
        return node[token]
    return None


class PatchBuilder:
    """Builds an RFC 6902 patch against a working copy, so that each op is valid in sequence."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.doc: dict[str, Any] = copy.deepcopy(dict(document))
        self.ops: list[dict[str, Any]] = []

    def _walk(self, tokens: Sequence[Token]) -> Any:
        node: Any = self.doc
        for token in tokens:
            node = _child(node, token)
            if node is None:
                return None
        return node

    def set(self, tokens: Sequence[Token], value: Any) -> None:
        """Set an object member, creating missing (or null) parent objects on the way."""
        node: Any = self.doc
        for i, token in enumerate(tokens[:-1]):
            child = _child(node, token)
            if child is None:  # build the rest and add it in one op
                if not isinstance(node, dict) or not isinstance(token, str):
                    raise ValueError(f"{pointer(tokens[: i + 1])} does not exist")
                nested: Any = value
                for inner in reversed(tokens[i + 1 :]):
                    nested = {inner: nested}
                self.ops.append({"op": "add", "path": pointer(tokens[: i + 1]), "value": nested})
                node[token] = copy.deepcopy(nested)
                return
            if not isinstance(child, dict | list):
                raise ValueError(f"{pointer(tokens[: i + 1])} is not an object")
            node = child
        last = tokens[-1]
        if not isinstance(node, dict) or not isinstance(last, str):
            raise ValueError(f"{pointer(tokens[:-1])} is not an object")
        if last in node and node[last] == value:
            return
        op = "replace" if node.get(last) is not None else "add"  # add replaces a null member
        self.ops.append({"op": op, "path": pointer(tokens), "value": value})
        node[last] = copy.deepcopy(value)

    def remove(self, tokens: Sequence[Token]) -> None:
        """Remove an object member if it is there."""
        parent = self._walk(tokens[:-1])
        last = tokens[-1]
        if isinstance(parent, dict) and isinstance(last, str) and last in parent:
            self.ops.append({"op": "remove", "path": pointer(tokens)})
            del parent[last]
