"""ctypes declarations made from the generated header, ``strata_cffi.h``.

The package does not declare strata's C API by hand: :func:`parse` reads the header that
build.rs derives from ``strata.h`` (shipped inside the package; the same text
:func:`strata.cdef` gives cffi) and makes every struct a ``ctypes.Structure`` with the header's
fields, every constant an ``int``, and every function a ``(restype, argtypes)`` prototype. The
header is C as cbindgen writes it: typedef'd structs and enums, ``enum { NAME = value };``
constants, function-pointer typedefs and fields, and function prototypes; nothing else is
accepted (an unknown form raises ``ValueError``, so a header change cannot be silently dropped).

Private: :mod:`strata._ffi` binds the library with these; tests use them as the C header's view.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

_BASE: Dict[str, Any] = {
    "void": None,
    "bool": ctypes.c_bool,
    "char": ctypes.c_char,
    "int": ctypes.c_int,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "size_t": ctypes.c_size_t,
    "int8_t": ctypes.c_int8,
    "uint8_t": ctypes.c_uint8,
    "int16_t": ctypes.c_int16,
    "uint16_t": ctypes.c_uint16,
    "int32_t": ctypes.c_int32,
    "uint32_t": ctypes.c_uint32,
    "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64,
}


class Sized(ctypes.Structure):
    """A struct that starts with ``size_t struct_size`` (every struct strata's C ABI passes).
    Constructing one sets ``struct_size`` to this layout's ``sizeof``, so strata reads and
    writes only the fields this package knows; positional arguments start at the second field."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(ctypes.sizeof(type(self)), *args, **kwargs)


@dataclass
class Header:
    """What a header declares: structs (``ctypes.Structure`` classes, opaque ones without
    fields), type aliases (enums, integer typedefs, function-pointer types), constants, and
    function prototypes (``(restype, [argtypes])``), each by its C name."""

    structs: Dict[str, Any] = field(default_factory=dict)
    types: Dict[str, Any] = field(default_factory=dict)
    constants: Dict[str, int] = field(default_factory=dict)
    #: The constants of each named enum (``strata_status``: every status), by the enum's name.
    enums: Dict[str, Dict[str, int]] = field(default_factory=dict)
    functions: Dict[str, Tuple[Any, List[Any]]] = field(default_factory=dict)

    def type(self, name: str) -> Any:
        """The ctypes type a C type name stands for."""
        if name in self.structs:
            return self.structs[name]
        if name in self.types:
            return self.types[name]
        if name in _BASE:
            return _BASE[name]
        raise ValueError(f"strata_cffi.h: unknown type {name!r}")


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _statements(text: str) -> List[str]:
    """Top-level declarations, split at semicolons outside braces and parentheses."""
    out, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "{(":
            depth += 1
        elif c in "})":
            depth -= 1
        elif c == ";" and depth == 0:
            s = " ".join(text[start:i].split())
            if s:
                out.append(s)
            start = i + 1
    if text[start:].strip():
        raise ValueError(f"strata_cffi.h: unterminated declaration {text[start:].strip()[:60]!r}")
    return out


def _value(expr: str, known: Dict[str, int]) -> int:
    """An integer constant expression of the header (literals with U/L suffixes, shifts,
    arithmetic, names defined before)."""
    e = re.sub(r"\b(0x[0-9A-Fa-f]+|\d+)[uUlL]+\b", r"\1", expr)
    for name in sorted(known, key=len, reverse=True):
        e = re.sub(rf"\b{re.escape(name)}\b", str(known[name]), e)
    if not re.fullmatch(r"[\s\d()xA-Fa-f+\-*/<>|&~]+", e):
        raise ValueError(f"strata_cffi.h: constant expression {expr!r}")
    return int(eval(e.replace("/", "//"), {"__builtins__": {}}))  # noqa: S307 (digits and operators only)


def _split_params(params: str) -> List[str]:
    out, depth, start = [], 0, 0
    for i, c in enumerate(params):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(params[start:i].strip())
            start = i + 1
    last = params[start:].strip()
    if last:
        out.append(last)
    return [] if out == ["void"] else out


class _Parser:
    def __init__(self) -> None:
        self.h = Header()

    def base(self, spec: str) -> Any:
        """The type of a declaration specifier without pointers (``const`` and ``struct``
        dropped)."""
        words = [w for w in spec.split() if w not in ("const", "struct", "enum")]
        if len(words) != 1:
            raise ValueError(f"strata_cffi.h: type {spec!r}")
        name = words[0]
        if name not in self.h.structs and name not in self.h.types and name not in _BASE:
            # A struct named before its definition (a self-reference): declared now, filled later.
            self.h.structs[name] = type(name, (ctypes.Structure,), {})
        return self.h.type(name)

    def pointer(self, target: Any, stars: int, is_char: bool, callback: bool) -> Any:
        """``target`` behind ``stars`` pointers; ``callback``: a callback's result, which ctypes
        takes as a void * when it is a pointer."""
        if stars == 0:
            return target
        if callback:
            return ctypes.c_void_p
        # char * is a C string, void * an address; a pointer to either points to those.
        t: Any = target
        if is_char or target is None:
            t, stars = (ctypes.c_char_p if is_char else ctypes.c_void_p), stars - 1
        for _ in range(stars):
            t = ctypes.POINTER(t)
        return t

    def declarator(self, decl: str, callback: bool = False) -> Tuple[Optional[str], Any]:
        """``(name, type)`` of one declaration (a field, a parameter, a typedef's target);
        ``callback``: inside a function-pointer type, where ctypes takes pointers as void *."""
        decl = decl.strip()
        fp = re.fullmatch(r"(.+?)\(\s*\*\s*(\w*)\s*\)\s*\((.*)\)", decl)
        if fp:
            ret, name, params = fp.groups()
            # ctypes callbacks return simple types only: a pointer result is a void *.
            restype = self.declarator(ret, callback=True)[1]
            args = [self.declarator(p)[1] for p in _split_params(params)]
            return name or None, ctypes.CFUNCTYPE(restype, *args)
        m = re.fullmatch(r"(.*?)((?:\s*\*\s*(?:const\s*)?)*)\s*(\w+)?\s*(?:\[(\w+)\])?", decl)
        if not m:
            raise ValueError(f"strata_cffi.h: declaration {decl!r}")
        spec, stars_text, name, length = m.groups()
        if name is not None and not stars_text and not length and len([w for w in spec.split() if w not in ("const", "struct", "enum")]) == 0:
            spec, name = name, None  # an unnamed parameter: the name was the type
        stars = stars_text.count("*")
        is_char = [w for w in spec.split() if w not in ("const",)] == ["char"]
        t = self.pointer(self.base(spec), stars, is_char, callback)
        if length:
            t = t * (int(length) if length.isdigit() else self.h.constants[length])
        return name, t

    def fields(self, body: str) -> List[Tuple[str, Any]]:
        out = []
        for f in _statements(body):
            name, t = self.declarator(f)
            if name is None or t is None:
                raise ValueError(f"strata_cffi.h: field {f!r}")
            out.append((name, t))
        return out

    def struct(self, tag: Optional[str], name: str, body: Optional[str]) -> None:
        cls: Any = self.h.structs.get(name) or (self.h.structs.get(tag) if tag else None)
        if cls is None:
            cls = type(name, (ctypes.Structure,), {})
        self.h.structs[name] = cls
        if tag:
            self.h.structs[tag] = cls
        if body is not None:
            fields = self.fields(body)
            if fields and fields[0][0] == "struct_size" and not issubclass(cls, Sized):
                # A struct with struct_size: remade as Sized (nothing referred to it yet but a
                # pointer made in the same declaration, which the header never does).
                cls = type(name, (Sized,), {})
                self.h.structs[name] = cls
                if tag:
                    self.h.structs[tag] = cls
            cls._fields_ = fields

    def enum_body(self, body: str, name: Optional[str]) -> None:
        values = {}
        for item in [i.strip() for i in body.split(",") if i.strip()]:
            n, _, v = item.partition("=")
            values[n.strip()] = _value(v, self.h.constants)
            self.h.constants[n.strip()] = values[n.strip()]
        if name:
            self.h.enums[name] = values

    def statement(self, s: str) -> None:
        if m := re.fullmatch(r"enum (\w+ )?\{(.*)\}", s):
            self.enum_body(m.group(2), (m.group(1) or "").strip() or None)
        elif m := re.fullmatch(r"typedef enum (\w+ )?\{(.*)\} (\w+)", s):
            self.enum_body(m.group(2), m.group(3))
            self.h.types[m.group(3)] = ctypes.c_int
        elif m := re.fullmatch(r"typedef struct (\w+ )?\{(.*)\} (\w+)", s):
            self.struct((m.group(1) or "").strip() or None, m.group(3), m.group(2))
        elif m := re.fullmatch(r"typedef struct (\w+) (\w+)", s):
            self.struct(m.group(1), m.group(2), None)
        elif s.startswith("typedef "):
            name, t = self.declarator(s[len("typedef ") :])
            if name is None:
                raise ValueError(f"strata_cffi.h: typedef {s!r}")
            self.h.types[name] = t
        elif s == 'extern "C" {' or s == "}":
            pass
        elif m := re.fullmatch(r"(.+?)\b(\w+)\s*\((.*)\)", s):
            ret, name, params = m.groups()
            restype = self.declarator(ret.strip())[1]
            args = [self.declarator(p)[1] for p in _split_params(params)]
            self.h.functions[name] = (restype, args)
        else:
            raise ValueError(f"strata_cffi.h: declaration {s[:80]!r}")


def parse(text: str) -> Header:
    """The declarations of a ``strata_cffi.h`` text."""
    p = _Parser()
    for s in _statements(_strip_comments(text)):
        p.statement(s)
    return p.h
