"""How deeply a document nests, measured without recursion, before anything decodes it.

Every decoder of a document recurses once per level of nesting (msgspec's, `json`'s, PyYAML's
composer), so a document nested a thousand levels deep ended in `RecursionError: maximum
recursion depth exceeded` (issue 27): a rejection that says nothing of what is wrong or where. So
the raw bytes are scanned first, iteratively, and a document nested deeper than `MAX_DEPTH` is
refused with the limit and the field path where it was crossed:

    workload.metadata.labels.a.a.a…: nested more than 32 levels deep; ...

The contract's deepest document nests 8 levels (an event carrying a workload whose pipeline
stage's tolerations are a list of objects: `tests/proto/test_nesting.py` measures every schema of
`proto/schemas/`), so `MAX_DEPTH` is four times that: no document the contract can describe comes
near it.

Three scanners, one per format people or peers send: JSON (a string is skipped as one token,
escaped quotes and brackets included), msgpack (headers walked, payloads skipped) and YAML
(PyYAML's parser, which is a state machine, read event by event; an alias is a leaf: PyYAML
composes it without recursion, and whatever reads the document afterwards is typed and stops at
the first level the contract does not have).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import yaml

from .events import FieldError

#: The deepest nesting of objects and arrays (maps and lists) a document may have; the root is 1.
MAX_DEPTH = 32

MAX_PATH = 200  # characters of a reported path: its head (where it starts) and its tail (the crossing)
_KEY_SHOWN = 40  # characters of one key in a path
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")

# a JSON string (escapes included; possessive: no backtracking), then what may follow a key; or
# one structural byte
_TOKEN = re.compile(rb'("(?:[^"\\]++|\\.)*+")(\s*:)?|[\[\]{},]', re.DOTALL)
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'"[]{}')
_SQUARE = bytes.maketrans(b"{}", b"[]")

Segment = str | int  # an object's key or an array's index


def depth_error(data: bytes, *, msgpack: bool = False, limit: int = MAX_DEPTH) -> FieldError | None:
    """Why `data` (JSON, or msgpack) nests too deeply to be decoded (None: it does not)."""
    path = msgpack_crossing(data, limit) if msgpack else json_crossing(data, limit)
    return None if path is None else too_deep(path, limit)


def too_deep(path: list[Segment], limit: int = MAX_DEPTH) -> FieldError:
    shown = render_path(path)
    return FieldError(
        path=shown or "$",
        message=f"nested more than {limit} levels deep (the limit is crossed here): refused before decoding",
    )


def render_path(path: list[Segment]) -> str:
    """`metadata.labels.a[2]`, keys that are not identifiers quoted (`["a.b"]`), cut to `MAX_PATH`
    characters in the middle (`…`): the head says where the nesting starts, the tail where it ends."""
    parts: list[str] = []
    for seg in path:
        if isinstance(seg, int):
            parts.append(f"[{seg}]")
        else:
            key = seg if len(seg) <= _KEY_SHOWN else seg[:_KEY_SHOWN] + "…"
            parts.append(f".{key}" if _IDENT.match(seg) else f"[{json.dumps(key)}]")
    text = "".join(parts)
    if len(text) > MAX_PATH:
        i, used = 0, 0  # the head: up to three quarters of MAX_PATH
        while i < len(parts) and used + len(parts[i]) <= MAX_PATH * 3 // 4:
            used, i = used + len(parts[i]), i + 1
        j, used = len(parts), 0  # the tail: up to a quarter
        while j > i + 1 and used + len(parts[j - 1]) <= MAX_PATH // 4:
            used, j = used + len(parts[j - 1]), j - 1
        text = "".join(parts[:i]) + f"…({j - i} more levels)…" + "".join(parts[j:])
    return text.removeprefix(".")


# -- JSON --------------------------------------------------------------------------------------------


def json_crossing(data: bytes, limit: int = MAX_DEPTH) -> list[Segment] | None:
    """The path of the container that opens at depth `limit + 1` (None: none does).

    Cheap for the usual document, in C (bytes methods, a few objects whatever its size): fewer
    brackets than the limit cannot nest past it. Otherwise the escapes `\\\\` and `\\"` are cut
    out, then all but quotes and brackets; adjacent quotes go (a string without brackets, or two
    strings with nothing structural between them: either way no bracket changes sides), then
    what is inside the quotes left; and innermost bracket pairs are removed `limit` times.
    Brackets left mean a deeper document (or unbalanced ones, which the walk tells apart); only
    then is the document walked token by token, for its path."""
    if data.count(b"{") + data.count(b"[") <= limit:
        return None
    text = data.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in data else data
    brackets = text.translate(_SQUARE, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in brackets:
        brackets = b"".join(brackets.split(b'"')[::2])
    for _ in range(limit):
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):
            break
        brackets = inner
    if not brackets:
        return None
    return _json_path(data, limit)


@dataclass
class _Open:
    array: bool
    key: str | None = None  # an object's current key
    index: int = 0  # an array's current index

    def segment(self) -> Segment:
        return self.index if self.array else (self.key if self.key is not None else "?")


def _json_path(data: bytes, limit: int) -> list[Segment] | None:
    stack: list[_Open] = []
    for m in _TOKEN.finditer(data):
        tok = data[m.start()]
        if tok == 0x22:  # a string: an object's key when a colon follows
            if m.group(2) and stack and not stack[-1].array:
                try:
                    stack[-1].key = json.loads(m.group(1))
                except ValueError:
                    stack[-1].key = m.group(1)[1:-1].decode(errors="replace")
        elif tok in b"[{":
            if len(stack) >= limit:
                return [o.segment() for o in stack]
            stack.append(_Open(array=tok == 0x5B))
        elif tok in b"]}":
            if stack:
                stack.pop()
        elif stack and stack[-1].array:  # a comma between array items
            stack[-1].index += 1
    return None


# -- msgpack -----------------------------------------------------------------------------------------


@dataclass
class _Container:
    is_map: bool
    items: int  # a map's keys and values, an array's items
    seen: int = 0
    key: str = "?"

    def segment(self) -> Segment:
        return self.key if self.is_map else self.seen


# first byte -> (bytes of the length/count that follow, fixed payload size); fixed formats are
# handled inline: fixint, fixmap, fixarray, fixstr, nil, bool
_SIZED = {
    0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0),  # bin 8/16/32
    0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1),  # ext 8/16/32 (+ its type byte)
    0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0),  # str 8/16/32
}  # fmt: skip
_FIXED = {
    0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8,
    0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17,  # fixext 1/2/4/8/16 (+ its type byte)
}  # fmt: skip
_CONTAINERS = {0xDC: (False, 2), 0xDD: (False, 4), 0xDE: (True, 2), 0xDF: (True, 4)}


def msgpack_crossing(data: bytes, limit: int = MAX_DEPTH) -> list[Segment] | None:
    """As `json_crossing`, for msgpack: the headers walked in a loop, payloads skipped. Malformed or
    truncated input ends the walk (None): the decoder says what is wrong with it."""
    stack: list[_Container] = []
    i, n = 0, len(data)
    while i < n:
        b = data[i]
        i += 1
        is_key = bool(stack) and stack[-1].is_map and stack[-1].seen % 2 == 0
        container: tuple[bool, int] | None = None
        text: bytes | None = None
        if b <= 0x7F or b >= 0xE0 or b in (0xC0, 0xC2, 0xC3):
            pass
        elif b <= 0x8F:
            container = (True, b & 0x0F)
        elif b <= 0x9F:
            container = (False, b & 0x0F)
        elif b <= 0xBF:
            size = b & 0x1F
            text, i = data[i : i + size], i + size
        elif b in _CONTAINERS:
            is_map, width = _CONTAINERS[b]
            container, i = (is_map, int.from_bytes(data[i : i + width], "big")), i + width
        elif b in _FIXED:
            i += _FIXED[b]
        elif b in _SIZED:
            width, extra = _SIZED[b]
            size = int.from_bytes(data[i : i + width], "big")
            start = i + width + extra
            text, i = data[start : start + size], start + size
        else:  # 0xc1: never used
            return None
        if i > n:
            return None
        if container is not None:
            if len(stack) >= limit:
                return [c.segment() for c in stack]
            is_map, count = container
            if count:
                stack.append(_Container(is_map, count * 2 if is_map else count))
                continue
        elif is_key:
            stack[-1].key = text.decode(errors="replace") if text is not None and 0xA0 <= b <= 0xDB else "?"
        # an item is complete: count it in its container, and close the containers it fills
        while stack:
            top = stack[-1]
            top.seen += 1
            if top.seen < top.items:
                break
            stack.pop()
        if not stack:
            return None  # the root is complete (trailing bytes are the decoder's to refuse)
    return None


# -- YAML --------------------------------------------------------------------------------------------


def yaml_depth_error(text: str, limit: int = MAX_DEPTH) -> FieldError | None:
    """As `depth_error`, for YAML (JSON included): `yaml_crossing`."""
    path = yaml_crossing(text, limit)
    return None if path is None else too_deep(path, limit)


def yaml_crossing(text: str, limit: int = MAX_DEPTH) -> list[Segment] | None:
    """As `json_crossing`, for YAML, from the parser's events: no node is composed. A document
    PyYAML cannot parse is left for the loader to refuse (None)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    stack: list[_Container] = []
    try:
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, yaml.DocumentStartEvent):
                stack = []
            elif isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
                if len(stack) >= limit:
                    return [c.segment() for c in stack]
                stack.append(_Container(isinstance(event, yaml.MappingStartEvent), 0))
            elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent | yaml.ScalarEvent | yaml.AliasEvent):
                if isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
                    stack.pop()
                elif stack and stack[-1].is_map and stack[-1].seen % 2 == 0:  # a key
                    stack[-1].key = str(event.value) if isinstance(event, yaml.ScalarEvent) else "?"
                if stack:
                    stack[-1].seen += 1
    except yaml.YAMLError:
        return None
    return None
