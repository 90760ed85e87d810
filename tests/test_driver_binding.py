"""The GPU backend's own libcuda binding (src/nvproxy/backends/cuda_driver.py) against the toolkit's cuda.h.

Its declarations are written by hand and only a GPU would show a wrong one, as memory corrupted behind a call that
seemed to work.  Each function it declares must be a symbol cuda.h declares under that very name (cuda.h maps many
names to versioned ones, cuMemAlloc to cuMemAlloc_v2: the plain symbol is an older ABI), with as many parameters,
each of the same size and the same pointer-ness; and each struct it shares a name with cuda.h must have cuda.h's size
and, field by field, its offsets.  cuda.h is read with pycparser (cffi's parser) after gcc's preprocessor, and the
sizes cuda.h gives come from a C program compiled against it."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from pycparser import c_ast, c_generator, c_parser

from nvproxy.backends import cuda_driver

GEN = c_generator.CGenerator()
# what gcc's preprocessor leaves that pycparser does not read
NEUTRAL = ["-D__attribute__(x)=", "-D__extension__=", "-D__restrict=", "-D__inline=", "-D__asm__(x)=",
           "-D__declspec(x)=", "-D_Float128=double", "-D__builtin_va_list=int"]


def _cuda_h() -> Path:
    nvcc = shutil.which("nvcc")
    for inc in ([Path(nvcc).resolve().parent.parent / "include"] if nvcc else []) + [Path("/usr/local/cuda/include")]:
        if (inc / "cuda.h").exists():
            return inc / "cuda.h"
    pytest.skip("no cuda.h (the CUDA toolkit's headers) to check the binding against")


def _parse(text: str) -> c_ast.FileAST:
    return c_parser.CParser().parse(text)


class Decls:
    """A translation unit's function declarations and typedefs, by name."""

    def __init__(self, ast: c_ast.FileAST) -> None:
        self.funcs: dict[str, list[c_ast.Node]] = {}
        self.typedefs: dict[str, c_ast.Node] = {}
        for node in ast.ext:
            if isinstance(node, c_ast.Typedef):
                self.typedefs[node.name] = node.type
            elif isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl):
                params = node.type.args.params if node.type.args else []
                if len(params) == 1 and GEN.visit(params[0].type) == "void":
                    params = []
                self.funcs[node.name] = [p.type for p in params]

    def is_pointer(self, t: c_ast.Node) -> bool:
        """Whether a parameter's type is a pointer once its typedefs are followed (an array parameter is one)."""
        for _ in range(32):
            if isinstance(t, (c_ast.PtrDecl, c_ast.ArrayDecl, c_ast.FuncDecl)):
                return True
            if isinstance(t, c_ast.TypeDecl) and isinstance(t.type, c_ast.IdentifierType):
                name = " ".join(t.type.names)
                if name not in self.typedefs:
                    return False
                t = self.typedefs[name]
            else:
                return False
        return False


def _type_text(t: c_ast.Node) -> str:
    """A parameter's type as a type name (its declarator's name dropped)."""
    t = _strip_names(t)
    return GEN.visit(c_ast.Typename(None, [], None, t))


def _strip_names(t: c_ast.Node) -> c_ast.Node:
    t = copy.deepcopy(t)
    node = t
    while node is not None:
        if isinstance(node, c_ast.TypeDecl):
            node.declname = None
            break
        node = getattr(node, "type", None)
    return t


@pytest.fixture(scope="module")
def cuda(tmp_path_factory: pytest.TempPathFactory) -> Decls:
    if shutil.which("gcc") is None:
        pytest.skip("no gcc to read cuda.h with")
    # (cuProfilerStart and cuProfilerStop, which libcuda exports, are declared in cudaProfiler.h)
    both = tmp_path_factory.mktemp("cuda_h") / "both.h"
    both.write_text("#include <cuda.h>\n#include <cudaProfiler.h>\n")
    pre = subprocess.run(["gcc", "-E", "-P", "-I", str(_cuda_h().parent), *NEUTRAL, str(both)], capture_output=True,
                         text=True, check=True)
    return Decls(_parse(pre.stdout))


# the types cffi knows without a declaration
CFFI_TYPES = "".join(f"typedef {c} {n};" for n, c in (
    ("size_t", "unsigned long"), ("ssize_t", "long"), ("uint8_t", "unsigned char"), ("uint16_t", "unsigned short"),
    ("uint32_t", "unsigned int"), ("uint64_t", "unsigned long long"), ("int32_t", "int"), ("int64_t", "long long")))


@pytest.fixture(scope="module")
def ours() -> Decls:
    return Decls(_parse(CFFI_TYPES + cuda_driver.CDEF))


def _sizes_in_cuda_h(exprs: dict[str, str], tmp: Path) -> dict[str, int]:
    """The values of C expressions (sizeof, offsetof) compiled against cuda.h."""
    src = tmp / "sizes.c"
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <cuda.h>", "int main(void) {"]
    lines += [f'    printf("%s %zu\\n", "{k}", (size_t)({v}));' for k, v in exprs.items()]
    src.write_text("\n".join(lines + ["    return 0;", "}"]) + "\n")
    exe = tmp / "sizes"
    subprocess.run(["gcc", "-I", str(_cuda_h().parent), "-o", str(exe), str(src)], check=True, capture_output=True,
                   text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


def test_every_function_is_cuda_hs_symbol_with_its_parameters(cuda: Decls, ours: Decls, tmp_path: Path) -> None:
    problems, exprs, pairs = [], {}, []
    for name, params in ours.funcs.items():
        if name not in cuda.funcs:
            versioned = sorted(n for n in cuda.funcs if re.fullmatch(rf"{name}_v\d+", n))
            problems.append(f"{name}: cuda.h declares no such symbol" +
                            (f" (it names it {versioned[-1]})" if versioned else ""))
            continue
        theirs = cuda.funcs[name]
        if len(params) != len(theirs):
            problems.append(f"{name}: {len(params)} parameters; cuda.h has {len(theirs)}")
            continue
        for i, (a, b) in enumerate(zip(params, theirs, strict=True)):
            if ours.is_pointer(a) != cuda.is_pointer(b):
                problems.append(f"{name} parameter {i + 1}: {_type_text(a)} against cuda.h's {_type_text(b)}")
                continue
            key = f"{name}.{i}"
            exprs[key] = f"sizeof({_type_text(b)})"
            pairs.append((key, _type_text(a)))
    sizes = _sizes_in_cuda_h(exprs, tmp_path)
    ffi = cuda_driver.ffi
    for key, ours_type in pairs:
        if ffi.sizeof(ours_type) != sizes[key]:
            problems.append(f"{key}: {ours_type} is {ffi.sizeof(ours_type)} bytes; cuda.h's is {sizes[key]}")
    assert len(ours.funcs) > 50
    assert not problems, "\n".join(problems)


def _struct_fields(t: c_ast.Node) -> list[str] | None:
    """The top-level field names of a typedef'd struct (None: not a struct with a body)."""
    t = t.type if isinstance(t, c_ast.TypeDecl) else None
    if not isinstance(t, c_ast.Struct) or t.decls is None:
        return None
    return [d.name for d in t.decls if d.name]


def test_structs_have_cuda_hs_layout(cuda: Decls, ours: Decls, tmp_path: Path) -> None:
    exprs, checks = {}, []
    for name, t in ours.typedefs.items():
        fields = _struct_fields(t)
        if fields is None or name not in cuda.typedefs:
            continue
        theirs = set(_struct_fields(cuda.typedefs[name]) or [])
        exprs[f"{name}"] = f"sizeof({name})"
        checks.append((name, None))
        for f in fields:
            if f in theirs:
                exprs[f"{name}.{f}"] = f"offsetof({name}, {f})"
                checks.append((name, f))
    assert len({n for n, _f in checks}) >= 5, "the binding's structs were not found in cuda.h"
    values = _sizes_in_cuda_h(exprs, tmp_path)
    ffi = cuda_driver.ffi
    problems = []
    for name, f in checks:
        mine = ffi.sizeof(name) if f is None else ffi.offsetof(name, f)
        want = values[name if f is None else f"{name}.{f}"]
        if mine != want:
            problems.append(f"{name}{'.' + f if f else ''}: {'size' if f is None else 'offset'} {mine}; cuda.h: {want}")
    assert not problems, "\n".join(problems)
