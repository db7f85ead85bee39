"""The CEL that DeviceClass and request selectors are written in, for the forms GPU claims use.

kube-scheduler evaluates ``selectors[].cel.expression`` with the full CEL runtime; gpuaware reads
the common forms with a small parser instead (no CEL library in Python would match Kubernetes'
extensions anyway): ``device.driver``, ``device.attributes["<domain>"].<name>`` and
``device.capacity["<domain>"].<name>``, string/int/bool literals, ``==``/``!=``/``<``/``<=``/``>``/``>=``,
``&&``/``||``/``!``, parentheses, ``quantity("40Gi")`` with ``compareTo``/``isGreaterThan``/``isLessThan``,
``in`` on a device's attribute/capacity map, and the string methods ``lowerAscii``/``contains``/
``startsWith``/``endsWith``. Anything else raises ``UnsupportedCel`` naming what and where, so the
pod is left alone with that reason instead of being allocated on a guess.

A reference to an attribute the device does not have makes the expression false for that device
(kube-scheduler reports an evaluation error and allocates nothing; either way that device is not
taken).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuaware.scheduler.kube.objects import PodSpecError, quantity


class UnsupportedCel(PodSpecError):
    """A selector gpuaware does not evaluate (kube-scheduler's CEL would); the pod is left alone."""


@dataclass(frozen=True)
class DeviceFacts:
    """What a selector can read of a device: qualified ``domain/name`` keys."""

    driver: str
    attributes: Mapping[str, Any]  # str, int, bool, or a version string
    capacity: Mapping[str, float]  # base units (bytes for memory)


class _Missing(Exception):
    """An attribute or capacity the device does not have."""


class _Quantity(float):
    """A number that came from ``quantity(...)`` or a capacity, so ``compareTo`` applies."""


_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')|(?P<num>-?\d+)'
                    r"|(?P<op>==|!=|<=|>=|&&|\|\||[<>!.\[\](),])|(?P<id>[A-Za-z_][A-Za-z0-9_]*))")

Fn = Callable[[DeviceFacts], Any]


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise UnsupportedCel(f"CEL {text!r}: cannot read at offset {pos} ({text[pos:pos + 12]!r})")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind), m.start(kind)))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str):
        self.text, self.toks, self.i = text, _tokens(text), 0

    def peek(self) -> tuple[str, str, int] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, value: str | None = None) -> tuple[str, str, int]:
        t = self.peek()
        if t is None or (value is not None and t[1] != value):
            where = f"offset {t[2]}" if t else "the end"
            raise UnsupportedCel(f"CEL {self.text!r}: expected {value or 'more'} at {where}")
        self.i += 1
        return t

    def unsupported(self, what: str, at: int) -> UnsupportedCel:
        return UnsupportedCel(f"CEL {self.text!r}: {what} at offset {at} is not supported by gpuaware")

    # expr := and ('||' and)* ; and := unary ('&&' unary)* ; unary := '!' unary | cmp
    def expr(self) -> Fn:
        left = self.conj()
        while (t := self.peek()) and t[1] == "||":
            self.take()
            right = self.conj()
            left = (lambda a, b: lambda d: _truth(a, d) or _truth(b, d))(left, right)
        return left

    def conj(self) -> Fn:
        left = self.unary()
        while (t := self.peek()) and t[1] == "&&":
            self.take()
            right = self.unary()
            left = (lambda a, b: lambda d: _truth(a, d) and _truth(b, d))(left, right)
        return left

    def unary(self) -> Fn:
        t = self.peek()
        if t and t[1] == "!":
            self.take()
            inner = self.unary()
            return lambda d: not _truth(inner, d)
        return self.cmp()

    def cmp(self) -> Fn:
        left = self.primary()
        t = self.peek()
        if t and t[1] in ("==", "!=", "<", "<=", ">", ">="):
            self.take()
            right = self.primary()
            return _compare(t[1], left, right)
        if t and t[0] == "id" and t[1] == "in":
            self.take()
            right = self.primary()
            return lambda d: _contains(right(d), left(d))
        return left

    def primary(self) -> Fn:
        kind, value, at = self.take()
        if kind == "str":
            s = bytes(value[1:-1], "utf-8").decode("unicode_escape")
            fn: Fn = lambda d: s  # noqa: E731
        elif kind == "num":
            n = int(value)
            fn = lambda d: n  # noqa: E731
        elif value == "(":
            fn = self.expr()
            self.take(")")
        elif kind == "id" and value in ("true", "false"):
            b = value == "true"
            fn = lambda d: b  # noqa: E731
        elif kind == "id" and value == "quantity":
            self.take("(")
            k, raw, qat = self.take()
            if k != "str":
                raise self.unsupported("quantity() of a non-literal", qat)
            self.take(")")
            q = _Quantity(quantity(raw[1:-1], "CEL quantity"))
            fn = lambda d: q  # noqa: E731
        elif kind == "id" and value == "device":
            fn = self.device()
        else:
            raise self.unsupported(f"{value!r}", at)
        return self.methods(fn)

    def device(self) -> Fn:
        self.take(".")
        _, field, at = self.take()
        if field == "driver":
            return lambda d: d.driver
        if field not in ("attributes", "capacity"):
            raise self.unsupported(f"device.{field}", at)
        self.take("[")
        k, raw, dat = self.take()
        if k != "str":
            raise self.unsupported(f"device.{field}[...] with a non-literal domain", dat)
        self.take("]")
        domain = raw[1:-1]
        t = self.peek()
        if not t or t[1] != "." or self.i + 1 >= len(self.toks) or self.toks[self.i + 1][0] != "id":
            # device.attributes["domain"] alone: the map, for `"name" in ...`
            return (lambda dom, f: lambda d: _DomainView(getattr(d, f), dom))(domain, field)
        self.take(".")
        _, name, _ = self.take()
        qualified = f"{domain}/{name}"
        if field == "capacity":
            return lambda d: _Quantity(_get(d.capacity, qualified))
        return lambda d: _get(d.attributes, qualified)

    def methods(self, fn: Fn) -> Fn:
        while (t := self.peek()) and t[1] == ".":
            self.take()
            _, name, at = self.take()
            self.take("(")
            args: list[Fn] = []
            while (p := self.peek()) and p[1] != ")":
                args.append(self.expr())
                if (p := self.peek()) and p[1] == ",":
                    self.take()
            self.take(")")
            fn = _method(name, fn, args, lambda what, at=at: self.unsupported(what, at))
        return fn


class _DomainView:
    def __init__(self, values: Mapping[str, Any], domain: str):
        self.values, self.domain = values, domain

    def __contains__(self, name: object) -> bool:
        return f"{self.domain}/{name}" in self.values


def _get(values: Mapping[str, Any], qualified: str) -> Any:
    if qualified not in values:
        raise _Missing(qualified)
    return values[qualified]


def _contains(container: Any, item: Any) -> bool:
    if not isinstance(container, _DomainView):
        raise _Missing("in")
    return item in container


def _truth(fn: Fn, d: DeviceFacts) -> bool:
    value = fn(d)
    if not isinstance(value, bool):
        raise _Missing("not a boolean")
    return value


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def _compare(op: str, left: Fn, right: Fn) -> Fn:
    f = _OPS[op]

    def run(d: DeviceFacts) -> bool:
        a, b = left(d), right(d)
        if type(a) is not type(b) and not (isinstance(a, int | float) and isinstance(b, int | float)):
            raise _Missing(f"{a!r} {op} {b!r}: different types")  # CEL: no such overload
        return f(a, b)

    return run


def _method(name: str, target: Fn, args: list[Fn], unsupported: Callable[[str], UnsupportedCel]) -> Fn:
    if name == "compareTo" and len(args) == 1:
        return lambda d: _cmp(_q(target(d)), _q(args[0](d)))
    if name == "isGreaterThan" and len(args) == 1:
        return lambda d: _q(target(d)) > _q(args[0](d))
    if name == "isLessThan" and len(args) == 1:
        return lambda d: _q(target(d)) < _q(args[0](d))
    if name == "lowerAscii" and not args:
        return lambda d: _s(target(d)).lower()
    if name in ("contains", "startsWith", "endsWith") and len(args) == 1:
        how = {"contains": str.__contains__, "startsWith": str.startswith, "endsWith": str.endswith}[name]
        return lambda d: how(_s(target(d)), _s(args[0](d)))
    raise unsupported(f"method {name}() with {len(args)} argument(s)")


def _q(value: Any) -> float:
    if not isinstance(value, _Quantity):
        raise _Missing("not a quantity")
    return float(value)


def _s(value: Any) -> str:
    if not isinstance(value, str):
        raise _Missing("not a string")
    return value


def _cmp(a: float, b: float) -> int:
    return (a > b) - (a < b)


@dataclass(frozen=True)
class Selector:
    """A compiled selector: ``matches(device)`` is the expression's value (False where CEL would error)."""

    expression: str
    fn: Fn

    def matches(self, device: DeviceFacts) -> bool:
        try:
            return _truth(self.fn, device)
        except (_Missing, TypeError, ValueError):
            return False


_compiled: dict[str, Selector] = {}


def compile_selector(expression: str) -> Selector:
    """The selector, or ``UnsupportedCel`` saying what gpuaware does not read (memoised: claims repeat them)."""
    sel = _compiled.get(expression)
    if sel is None:
        p = _Parser(expression)
        fn = p.expr()
        if p.peek() is not None:
            raise p.unsupported(f"{p.peek()[1]!r}", p.peek()[2])  # type: ignore[index]
        sel = _compiled.setdefault(expression, Selector(expression, fn))
    return sel
