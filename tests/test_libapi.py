"""The math libraries' API description, its classification and the generated forwarding code."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from nvproxy import shim_path
from nvproxy.libs import spec

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "native" / "tools"
sys.path.insert(0, str(TOOLS))

import libapi_extract  # noqa: E402


def test_description_is_current() -> None:
    """api/<lib>.txt is what the toolkit's headers say (where they are: the GPU machine's /usr/local/cuda, or a
    copy in .cuda-libs; CI has no math-library headers)."""
    includes = libapi_extract.default_includes()
    if not libapi_extract.sources_present(includes):
        pytest.skip("no cuBLAS/cuFFT/cuRAND/cuSPARSE/cuSOLVER headers and libraries here to extract from")
    r = subprocess.run([sys.executable, str(TOOLS / "libapi_extract.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_generated_code_is_current() -> None:
    r = subprocess.run([sys.executable, str(TOOLS / "gen_libs.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_exported_function_has_an_entry_point() -> None:
    sp = spec.load()
    out = subprocess.run(["nm", "-D", "--defined-only", str(shim_path())], capture_output=True, text=True,
                         check=True).stdout
    exported = {line.split()[2] for line in out.splitlines()}
    missing = [f.name for f in sp.funcs if f.name not in exported]
    assert not missing, missing[:20]
    assert {lib: len(sp.libs[lib].funcs) > 20 for lib in spec.LIBS} == dict.fromkeys(spec.LIBS, True)


@pytest.mark.parametrize("name,roles,posted", [
    ("cublasSgemm_v2", "handle val val val val val scalar dev val dev val scalar dev val", True),
    ("cublasSdot_v2", "handle val dev val dev val result", True),
    ("cublasCreate_v2", "create", False),
    ("cufftPlanMany", "create val in in val val in val val val val", False),
    ("cufftExecC2C", "handle dev dev val", True),
    ("curandGenerateNormal", "handle result val val val", True),
    ("cusparseSpMV_bufferSize", "handle val scalar handle handle scalar handle val val out", False),
    ("cusolverDnSgetrf_bufferSize", "handle val val dev val out", False),
    ("cusolverDnSgetrf", "handle val val dev val dev dev dev", True),
    ("cublasLtMatmul", "handle handle scalar dev handle dev handle scalar dev handle dev handle in dev val stream",
     True),
    ("cudnnConvolutionForward", "handle in handle dev handle dev handle val dev val in handle dev", True),
    ("cudnnGetConvolutionForwardAlgorithm_v7", "handle handle handle handle handle val out out", False),
    ("cudnnSetTensorNdDescriptor", "handle val val in in", False),
    ("cudnnBackendSetAttribute", "handle val val val elems", False),
    ("cudnnBackendGetAttribute", "handle val val val out elemsout", False),
    ("cudnnBackendExecute", "handle handle handle", True),
])
def test_classification(name: str, roles: str, posted: bool) -> None:
    f = spec.load().named(name)
    assert f is not None and f.how == "forward", f and f.why
    assert " ".join(p.role for p in f.params) == roles
    assert f.posted_possible == posted


def test_state_roles() -> None:
    sp = spec.load()
    assert sp.named("cublasSetStream_v2").state == "config" and sp.named("cublasSetStream_v2").stream_setter
    assert sp.named("cublasDestroy_v2").state == "destroy"
    assert sp.named("cufftMakePlan1d").state == "config"
    assert sp.named("curandGenerateUniform").state == "generate"
    desc_attr = sp.named("cublasLtMatmulDescSetAttribute")
    assert desc_attr.state == "config" and [desc_attr.params[k].name for k in desc_attr.key] == ["attr"]
    assert sp.named("cusparseSpSV_analysis").params[sp.named("cusparseSpSV_analysis").owner].name == "spsvDescr"


def test_cudnn_sizes_and_records() -> None:
    """cuDNN's alpha and beta are sized by the output tensor's data type, a backend attribute's elements by their
    type parameter; setters, attributes (per name) and finalizations are records, a dropout descriptor's setter
    replayed as cudnnRestoreDropoutDescriptor; stream-ordered compute is posted, cudnnSetTensor included."""
    sp = spec.load()
    conv = sp.named("cudnnConvolutionBackwardData")
    assert {p.name: p.size for p in conv.params if p.role == "in"} == {"alpha": "nvpl_dnn_scale(dxDesc)",
                                                                        "beta": "nvpl_dnn_scale(dxDesc)"}
    attr = sp.named("cudnnBackendSetAttribute")
    elems = attr.params[4]
    assert elems.size == "nvpl_elem_size(LIB, attributeType)*elementCount" and attr.params[elems.typed].name == \
        "attributeType"
    assert attr.state == "config" and [attr.params[k].name for k in attr.key] == ["attributeName"]
    assert sp.named("cudnnBackendFinalize").state == "config"
    assert sp.named("cudnnBackendDestroyDescriptor").state == "destroy"
    assert sp.named("cudnnSetStream").stream_setter
    assert sp.named("cudnnSetTensor").state == "" and sp.named("cudnnSetTensor").posted_possible
    ann = sp.libs["cudnn"].ann
    assert sp.named(ann.REPLAY_AS["cudnnSetDropoutDescriptor"]).state == "config"
    assert sp.named("cudnnGetErrorString").constant and sp.named("cudnnGetVersion").constant


def test_what_is_not_forwarded_says_why() -> None:
    sp = spec.load()
    sp.all()
    for f in sp.funcs:
        assert f.how in ("forward", "local", "fail")
        if f.how == "fail":
            assert f.why, f.name
    assert "cuBLAS-XT" in sp.named("cublasXtCreate").why
    assert "legacy" in sp.named("cublasSgemm").why
    assert sp.named("cufftXtSetGPUs").how == "fail"


def _gen_records(kind: int, *calls: str) -> list[tuple]:
    """Parsed records of a cuRAND generator (id 7) of type kind: its creation, then generation calls of 100 values."""
    sp = spec.load()
    create = sp.named("curandCreateGenerator")
    recs = [(create, 0, struct.pack("<QQ", 7, kind), 0, 0, 1)]
    for name in calls:
        f = sp.named(name)
        body = [7, 0, 100] + [0] * (len(f.params) - 3)
        recs.append((f, 0, struct.pack(f"<{len(f.params)}Q", *body), 0, 0, 2))
    return recs


def test_generators_set_to_an_offset_only_where_that_was_measured_to_go_on_alike() -> None:
    """A restore sets a generator to the offset of the values it made only where a fresh generator went on with the
    same numbers (one function, measured per generator type); any other makes its numbers again."""
    from nvproxy.libs.state import _skip_ahead

    sp = spec.load()
    kind = sp.kind_of(sp.types["curandGenerator_t"].tag)
    philox, xorwow, mt19937 = 161, 101, 142
    assert _skip_ahead(sp, _gen_records(philox, "curandGenerateNormal", "curandGenerateNormal")) == {(kind, 7): 400}
    assert _skip_ahead(sp, _gen_records(xorwow, "curandGenerateUniform")) == {(kind, 7): 200}
    assert _skip_ahead(sp, _gen_records(xorwow, "curandGenerateNormal")) == {}
    assert _skip_ahead(sp, _gen_records(philox, "curandGenerateLogNormal", "curandGeneratePoisson")) == {}
    assert _skip_ahead(sp, _gen_records(mt19937, "curandGenerate")) == {}
