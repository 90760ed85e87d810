"""The math libraries' functions as nvproxy forwards them.

The description (api/<lib>.txt, extracted from the toolkit's headers by native/tools/libapi_extract.py) gives
each exported function's prototype; the library's annotations (annotations/<lib>.py, plain data) say what the
headers do not: which pointers are device memory, host inputs or outputs (and their size), handles created,
used or destroyed, scalars whose memory depends on a pointer mode, which calls configure state that a restore
must make again, which run in stream order.  classify() joins the two: every exported function gets a role for
each parameter and a way to be served (forwarded to the proxy, answered in the shim, or failing loudly).

Roles of a parameter:
    val      a scalar by value (enums too)             sval     a structure by value (sent inline)
    handle   a handle used (nvproxy's id)              create   a pointer where a new handle is written
    destroy  a handle destroyed                        stream   a cudaStream_t
    dev      a pointer passed as it is (device memory, or pinned host memory, valid in the proxy too)
    in/out/inout  host memory of `size` bytes, copied into the request / out of the reply
    scalar/result/both  host memory (as in/out/inout) where `mode` is true, else a device pointer
    str      a NUL-terminated host string
    elems/elemsout  host memory of `size` bytes (in / in and out) whose elements are typed by another parameter
             (`typed`: cuDNN's backend attributes): the annotations' ELEMENT_TYPES say which are handles the proxy
             translates and which device pointers

Size and mode are C expressions over the function's parameter names, evaluated in the shim (elem: the size of
the pointed-to type; LIB: the library's number).  The function ids are the functions' places in one list of all
the libraries, shared by the shim's and the proxy's generated code.

A handle parameter takes handles of its own kind, and of the kinds the annotations' ACCEPTED_HANDLES add for its type
(a cuBLAS handle is a cuBLASLt handle too): Spec.accepts.
"""

from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

API = Path(__file__).resolve().parent / "api"
LIBS = ("cublas", "cublasLt", "cufft", "curand", "cusparse", "cusolver", "cudnn")
SCALAR_BYTES = {"i1": 1, "u1": 1, "i2": 2, "u2": 2, "i4": 4, "u4": 4, "i8": 8, "u8": 8, "f4": 4, "f8": 8}
STREAM_TYPE = "cudaStream_t"
BUFFER_ROLES = ("in", "out", "inout", "scalar", "result", "both", "str", "elems", "elemsout")
OUTPUT_ROLES = ("out", "inout", "result", "both", "elemsout")
ELEMENT_ROLES = ("elems", "elemsout")
MODE_ROLES = ("scalar", "result", "both")


@dataclass
class Type:
    name: str
    kind: str  # a SCALAR_BYTES kind, handle, struct, ptr, fnptr, opaque, array, void
    tag: str = ""  # handles: the structure they point to (const and plain handle types share it)
    size: int = 0
    align: int = 0
    fields: list[str] = field(default_factory=list)


@dataclass
class Param:
    index: int
    name: str
    base: str
    ptr: str  # one `*` or `c*` (pointer to const) per level, innermost first as written: `c*c*`
    type: Type
    role: str = ""
    size: str = ""  # C expression (bytes), for BUFFER_ROLES
    mode: str = ""  # C expression, for scalar/result: true where the memory is the host's
    kind: int = -1  # handle kind (Spec.kinds), for handle/create/destroy
    typed: int = -1  # elems/elemsout: the parameter giving the elements' type

    @property
    def spelled(self) -> str:
        return f"{self.base} {self.ptr}".strip()

    def elem(self, types: dict[str, Type]) -> int:
        """The size of what a one-level pointer points to (0: unknown)."""
        if self.ptr.count("*") != 1:
            return 8 if self.ptr.count("*") > 1 else 0
        t = types.get(self.base)
        if t is None:
            return 0
        if t.kind in SCALAR_BYTES:
            return SCALAR_BYTES[t.kind]
        if t.kind == "struct":
            return t.size
        if t.kind == "handle" or t.kind == "ptr":
            return 8
        return 1 if t.kind == "void" else 0


@dataclass
class Func:
    fid: int
    lib: str
    name: str
    declared: bool
    ret: Param | None = None
    params: list[Param] = field(default_factory=list)
    how: str = "forward"  # forward | local | fail
    why: str = ""  # fail: what it lacks
    retkind: str = "status"  # status | value | string | void
    state: str = ""  # create | config | destroy | generate | "" (a plain call)
    owner: int = -1  # the parameter whose handle a state record belongs to
    key: list[int] = field(default_factory=list)  # parameters telling config records of one function apart
    ordered: bool = False  # stream-ordered: posted (no reply awaited) when it writes only device memory
    after: str = ""  # shim: a C statement after a successful call
    local: str = ""  # shim: a C expression (the status) answering it without the proxy
    sync: bool = False  # the proxy waits for the device after the call (host memory it may still use)
    stream_setter: bool = False  # sets its owner's stream (a per-thread stream is bound to the calling thread)
    constant: bool = False  # its answer depends on its plain arguments alone (a version): the shim keeps it
    classified: bool = False
    raw: tuple[str, list[str]] = ("", [])  # the description's return type and parameters, until classified

    @property
    def posted_possible(self) -> bool:
        """May a call go without a reply (when none of its host outputs is given this time)?"""
        return self.how == "forward" and self.ordered and self.retkind == "status" and not any(
            p.role in ("create", "str") for p in self.params)


@dataclass
class Library:
    name: str
    soname: str
    ann: Any  # the annotations module
    funcs: list[Func] = field(default_factory=list)

    def status(self, what: str) -> int:
        return int(self.ann.STATUS[what])


@dataclass
class Spec:
    libs: dict[str, Library]
    funcs: list[Func]
    by_name: dict[str, Func]
    types: dict[str, Type]
    kinds: list[str]  # handle kinds (structure tags), by kind number
    kind_int: set[int]  # kinds whose values are ints (cufftHandle), not pointers
    accepts: dict[int, tuple[int, ...]] = field(default_factory=dict)  # a kind -> other kinds taken where it is used

    def kind_of(self, tag: str) -> int:
        return self.kinds.index(tag)

    def accepted(self, kind: int) -> tuple[int, ...]:
        """The kinds of handle a parameter of this kind takes (a used handle: not one created or destroyed)."""
        return (kind, *self.accepts.get(kind, ()))

    def func(self, fid: int) -> Func:
        """Function fid, classified (on first use: a proxy classifies only what its application calls)."""
        f = self.funcs[fid]
        if not f.classified:
            if f.declared:
                ret, params = f.raw
                rb, rp = _spelling(ret)
                f.ret = Param(-1, "", rb, rp, self.types.get(rb, Type(rb, "?")))
                for i, ptext in enumerate(params):
                    spelled, pname = ptext.rsplit(" ", 1)
                    b, pp = _spelling(spelled)
                    f.params.append(Param(i, pname, b, pp, self.types.get(b, Type(b, "?"))))
            classify(self, self.libs[f.lib], f)
            f.classified = True
        return f

    def named(self, name: str) -> Func | None:
        f = self.by_name.get(name)
        return self.func(f.fid) if f is not None else None

    def all(self) -> list[Func]:
        return [self.func(i) for i in range(len(self.funcs))]


def parse_description(text: str) -> tuple[str, str, dict[str, Type], list[tuple[str, bool, str, list[str]]]]:
    """(lib, soname, types, [(name, declared, return spelling, [param spellings])])"""
    lib = soname = ""
    types: dict[str, Type] = {}
    fns: list[tuple[str, bool, str, list[str]]] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        word, rest = line.split(" ", 1)
        if word == "lib":
            lib, soname = rest.split()
        elif word == "type":
            parts = rest.split()
            t = Type(parts[0], parts[1])
            if t.kind == "handle":
                t.tag = parts[2]
            elif t.kind == "struct":
                t.size, t.align = int(parts[2]), int(parts[3])
                t.fields = parts[4].split(",") if len(parts) > 4 else []
            types[t.name] = t
        elif word == "fn":
            name, sig = (rest.split(" ", 1) + [""])[:2]
            ret, _, params = _split_ret(sig)
            fns.append((name, True, ret, params.split("|") if params else []))
        elif word == "nofn":
            fns.append((rest.strip(), False, "", []))
    return lib, soname, types, fns


def _split_ret(sig: str) -> tuple[str, str, str]:
    """`cublasStatus_t cublasHandle_t handle|int n` -> ('cublasStatus_t', '', 'cublasHandle_t handle|int n')"""
    words = sig.split(" ")
    ret = words[0]
    i = 1
    while i < len(words) and re.fullmatch(r"(c?\*)+", words[i]):
        ret += " " + words[i]
        i += 1
    return ret, "", " ".join(words[i:])


def _spelling(text: str) -> tuple[str, str]:
    parts = text.split(" ")
    return parts[0], parts[1] if len(parts) > 1 else ""


@functools.lru_cache(maxsize=1)
def load() -> Spec:
    """The description of all the libraries (each function classified when first asked for: Spec.func)."""
    libs: dict[str, Library] = {}
    types: dict[str, Type] = {}
    raw: list[tuple[str, tuple[str, bool, str, list[str]]]] = []
    for lib in LIBS:
        name, soname, ltypes, fns = parse_description((API / f"{lib}.txt").read_text())
        ann = importlib.import_module(f"{__package__}.annotations.{lib}")
        libs[lib] = Library(name, soname, ann)
        for tname, t in ltypes.items():
            override = getattr(ann, "HANDLE_TYPES", {}).get(tname)
            if override is not None:
                t = Type(tname, "handle", tag=override)
            types.setdefault(tname, t)
        raw += [(lib, f) for f in fns]
    kinds = sorted({t.tag for t in types.values() if t.kind == "handle" and t.name != STREAM_TYPE})
    kind_int = {kinds.index(t.tag) for t in types.values()
                if t.kind == "handle" and t.name in _int_handles(libs)}
    funcs: list[Func] = []
    spec = Spec(libs, funcs, {}, types, kinds, kind_int, _accepts(libs, types, kinds))
    for lib, (fname, declared, ret, params) in sorted(raw, key=lambda x: (LIBS.index(x[0]), x[1][0])):
        f = Func(len(funcs), lib, fname, declared)
        f.raw = (ret, params)
        funcs.append(f)
        libs[lib].funcs.append(f)
        spec.by_name[fname] = f
    return spec


def _accepts(libs: dict[str, Library], types: dict[str, Type], kinds: list[str]) -> dict[int, tuple[int, ...]]:
    """The annotations' ACCEPTED_HANDLES, as kinds."""
    out: dict[int, tuple[int, ...]] = {}
    for lib in libs.values():
        for name, others in getattr(lib.ann, "ACCEPTED_HANDLES", {}).items():
            kind = kinds.index(types[name].tag)
            out[kind] = out.get(kind, ()) + tuple(kinds.index(types[o].tag) for o in others)
    return out


def _int_handles(libs: dict[str, Library]) -> set[str]:
    out: set[str] = set()
    for lib in libs.values():
        out |= set(getattr(lib.ann, "INT_HANDLES", ()))
    return out


# ---- classification ----
def _rules_for(lib: Library, f: Func) -> dict[str, Any]:
    """The function's annotations: the matching FUNCTION_RULES in order, then FUNCTIONS[name]."""
    out: dict[str, Any] = {}
    params: dict[str, str] = {}
    for pattern, ann in getattr(lib.ann, "FUNCTION_RULES", []):
        if re.search(pattern, f.name):
            params.update(ann.get("params", {}))
            out.update({k: v for k, v in ann.items() if k != "params"})
    exact = getattr(lib.ann, "FUNCTIONS", {}).get(f.name, {})
    params.update(exact.get("params", {}))
    out.update({k: v for k, v in exact.items() if k != "params"})
    out["params"] = params
    return out


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _param_rule(lib: Library, f: Func, p: Param) -> str:
    for fn_re, name_re, type_re, role in getattr(lib.ann, "PARAMS", []):
        if _compiled(name_re).search(p.name) and _compiled(fn_re).search(f.name) and \
                _compiled(type_re).search(p.spelled):
            return role
    return ""


def _default_role(spec: Spec, f: Func, p: Param) -> str:
    t = p.type
    if not p.ptr:
        if t.kind in SCALAR_BYTES:
            return "val"
        if t.kind == "struct":
            return "sval"
        if t.name == STREAM_TYPE:
            return "stream"
        if t.kind == "handle":
            return "handle"
        return ""
    if p.ptr == "*" and t.kind == "handle" and t.name != STREAM_TYPE:
        return "create"
    return ""


def classify(spec: Spec, lib: Library, f: Func) -> None:
    ann = lib.ann
    if not f.declared:
        f.how, f.why = "fail", "not declared in the headers"
        return
    rules = _rules_for(lib, f)
    assert f.ret is not None
    f.retkind = _return_kind(lib, f.ret)
    for p in f.params:
        created = p.ptr == "*" and p.type.kind == "handle" and p.type.name != STREAM_TYPE
        role = rules["params"].get(p.name) or ("create" if created else "") or _param_rule(lib, f, p) or \
            _default_role(spec, f, p)
        _set_role(spec, lib, f, p, role)
    for k in ("how", "why", "state", "after", "local", "sync", "ordered"):
        if k in rules:
            setattr(f, k, rules[k])
    legacy = getattr(ann, "LEGACY", None)
    main = set(getattr(ann, "MAIN_HANDLES", ()))
    if legacy and f.how == "forward" and not f.local and re.search(legacy[0], f.name) and any(
            p.role == "dev" for p in f.params) and not any(p.base in main for p in f.params):
        f.how, f.why = "fail", legacy[1]
    destroy_re = getattr(ann, "DESTROY", r"Destroy")
    if f.how == "forward" and not rules.get("state") and re.search(destroy_re, f.name):
        for p in f.params:
            if p.role == "handle":
                p.role = "destroy"
                break
    handles = [p for p in f.params if p.role in ("handle", "destroy", "create")]
    if "state" not in rules:
        if any(p.role == "create" for p in f.params):
            f.state = "create"
        elif any(p.role == "destroy" for p in f.params):
            f.state = "destroy"
        elif re.search(getattr(ann, "CONFIG", r"(?!)"), f.name) and handles:
            f.state = "config"
    owner = rules.get("owner")
    if owner is not None and any(p.name == owner for p in f.params) and f.state not in ("create", "destroy"):
        f.owner = _index(f, owner)
    elif f.state in ("create", "destroy"):
        f.owner = next(p.index for p in f.params if p.role == f.state)
    elif handles:
        f.owner = handles[0].index
    key = rules.get("key")
    if key is None and f.state == "config":
        key = [p.name for p in f.params if re.fullmatch(getattr(ann, "CONFIG_KEYS", r"(?!)"), p.name)]
    f.key = [_index(f, k) for k in key or []]
    f.stream_setter = f.state == "config" and any(p.role == "stream" for p in f.params) and f.owner >= 0
    if "ordered" not in rules:
        uses_main = any(p.role == "handle" and p.base in main for p in f.params)
        unordered = re.search(getattr(ann, "UNORDERED", r"(?!)"), f.name)
        f.ordered = uses_main and f.state in ("", "generate") and not unordered
    if f.how == "forward":
        _check_forwardable(f, getattr(ann, "VOID_FORWARD", r"(?!)"))
    f.constant = f.how == "forward" and bool(re.search(getattr(ann, "CONSTANT", r"(?!)"), f.name)) and all(
        p.role in ("val", "out") for p in f.params)


def _index(f: Func, name: str) -> int:
    for p in f.params:
        if p.name == name:
            return p.index
    raise KeyError(f"{f.name} has no parameter {name}")


def _return_kind(lib: Library, ret: Param) -> str:
    if ret.base in getattr(lib.ann, "STATUS_TYPES", ()) and not ret.ptr:
        return "status"
    if ret.base == "char" and ret.ptr == "c*":
        return "string"
    if not ret.ptr and ret.type.kind in ("i4", "u4", "i8", "u8"):
        return "value"
    if not ret.ptr and ret.type.kind == "void":
        return "void"
    return "other"


def _set_role(spec: Spec, lib: Library, f: Func, p: Param, role: str) -> None:
    if not role:
        f.how, f.why = "fail", f.why or f"parameter {p.name} ({p.spelled}) is not described"
        return
    if role == "fail":
        f.how, f.why = "fail", f.why or f"parameter {p.name} ({p.spelled}) cannot be forwarded"
        return
    name, _, rest = role.partition(":")
    size, _, mode = rest.partition("@")
    p.role = name
    if name in BUFFER_ROLES and name != "str":
        elem = p.elem(spec.types)
        size = size or "elem"
        if "elem" in size and not elem:
            f.how, f.why = "fail", f.why or f"parameter {p.name} ({p.spelled}): element size unknown"
            return
        for alias, names in getattr(lib.ann, "ALIASES", {}).items():  # (one word for what functions name apart)
            if re.search(rf"\b{alias}\b", size):
                name = next((n for n in names if any(q.name == n for q in f.params)), None)
                if name is None:
                    f.how, f.why = "fail", f.why or f"parameter {p.name}: its size ({alias}) is not described"
                    return
                size = re.sub(rf"\b{alias}\b", name, size)
        p.size = re.sub(r"\belem\b", str(elem), size)
        if name in MODE_ROLES:
            p.mode = mode or getattr(lib.ann, "MODE", "0")
        elif name in ELEMENT_ROLES:
            p.typed = _index(f, mode)
    if name in ("handle", "create", "destroy"):
        t = p.type
        if t.kind != "handle":
            f.how, f.why = "fail", f.why or f"parameter {p.name} ({p.spelled}) is not a handle type"
            return
        p.kind = spec.kind_of(t.tag)


def _check_forwardable(f: Func, void_ok: str) -> None:
    """void_ok: functions that return nothing forwarded all the same (their answers are in their outputs)."""
    if f.retkind == "other" and not f.local:
        f.how, f.why = "fail", f"its return type ({f.ret.spelled if f.ret else '?'}) cannot be forwarded"
    elif f.retkind == "void" and not f.local and not re.search(void_ok, f.name):
        f.how, f.why = "fail", "it returns no status"
    elif len(f.params) > 60:
        f.how, f.why = "fail", "too many parameters"
    elif f.local:
        f.how = "local"


def report() -> str:
    """Per library: functions forwarded, answered in the shim, failing; and why those fail."""
    spec = load()
    spec.all()
    lines = []
    for lib in spec.libs.values():
        n = {k: sum(1 for f in lib.funcs if f.how == k) for k in ("forward", "local", "fail")}
        lines.append(f"{lib.name}: {len(lib.funcs)} exported, {n['forward']} forwarded, {n['local']} in the shim, "
                     f"{n['fail']} fail loudly")
    return "\n".join(lines)
