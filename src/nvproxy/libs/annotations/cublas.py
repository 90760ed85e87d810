"""cuBLAS (libcublas.so.13): the v2 API through the proxy.

Data pointers are device memory; alpha/beta/results are host or device memory by the handle's pointer mode,
which the shim keeps per handle.  Host-device copies (cublasSetVector and friends) are the runtime's copies,
done in the shim.  The legacy API (cublas.h, one implicit context) and cuBLAS-XT fail loudly."""

STATUS_TYPES = ("cublasStatus_t",)
STATUS = {"success": 0, "invalid_handle": 1, "invalid_value": 7, "internal": 14, "not_supported": 15}
MAIN_HANDLES = ("cublasHandle_t",)
MODE = "nvpl_host_mode(handle)"
CONFIG = r"^cublasSet(Stream|PointerMode|MathMode|AtomicsMode|Workspace|SmCountTarget|Emulation|FixedPoint)"
UNORDERED = r"^cublas(Get|Set|Create|Destroy|Logger)"
# answers that never change in a process: the shim asks the proxy once
CONSTANT = r"^cublasGet(Version|Property|StatusName|StatusString|CudartVersion)$"  # (not _v2: a handle)
LEGACY = (r"^cublas", "the legacy cuBLAS API (cublas.h) is not forwarded; use cublas_v2.h")

_EX_SCALAR = "nvpl_compute_size(computeType, Ctype)"
_COPIES = ("cublasSetVector", "cublasGetVector", "cublasSetMatrix", "cublasGetMatrix")

# (function, parameter name, parameter type): role; the first that matches
PARAMS = [
    (r"GroupedBatched", r"_array$|^group_size$", r"c\*$", "in:elem*group_count"),
    (r"^cublasGemm(Batched|StridedBatched)?Ex", r"^(alpha|beta)$", "", "scalar:" + _EX_SCALAR),
    (r"^cublas(Axpy|Scal)Ex", r"^alpha$", "", "scalar:nvpl_dtype_size(alphaType)"),
    (r"^cublas\w*Ex(_64)?$", r"^result$", r"^void", "result:nvpl_dtype_size(resultType)"),
    (r"", r"^result$", r"\*$", "result"),
    (r"^cublasRotEx", r"^(c|s)$", "", "scalar:nvpl_dtype_size(csType)"),
    (r"^cublasRotgEx", r"^(a|b)$", "", "both:nvpl_dtype_size(abType)"),
    (r"^cublasRotgEx", r"^(c|s)$", "", "result:nvpl_dtype_size(csType)"),
    (r"^cublasRotmEx", r"^param$", "", "scalar:5*nvpl_dtype_size(paramType)"),
    (r"^cublasRotmgEx", r"^(d1|d2|x1)$", "", "both:nvpl_dtype_size(d1Type)"),
    (r"^cublasRotmgEx", r"^y1$", "", "scalar:nvpl_dtype_size(y1Type)"),
    (r"^cublasRotmgEx", r"^param$", "", "result:5*nvpl_dtype_size(paramType)"),
    (r"rotg(_v2)?$", r"^(a|b)$", "", "both"),
    (r"rotg(_v2)?$", r"^(c|s)$", "", "result"),
    (r"rotmg(_v2)?$", r"^(d1|d2|x1)$", "", "both"),
    (r"rotmg(_v2)?$", r"^y1$", "", "scalar"),
    (r"rotmg(_v2)?$", r"^param$", "", "result:5*elem"),
    (r"rotm(_v2)?(_64)?$", r"^param$", "", "scalar:5*elem"),
    (r"rot(_v2)?(_64)?$", r"^(c|s)$", r"c\*$", "scalar"),
    (r"", r"^(alpha|beta)$", r"c\*$", "scalar"),
    (r"(getrs|gels|geqrf)Batched", r"^info$", r"\*$", "out"),
    (r"^cublasGet", r"", r"^\w+ \*+$", "out"),
    (r"^cublasLoggerConfigure$", r"^logFileName$", "", "str"),
    (r"^cublasSetFixedPointEmulationMantissaBitCountPointer$", "", r"\*$", "dev"),
    (r"", r"", r"\*", "dev"),
]

FUNCTION_RULES = [
    (r"^cublasXt", {"how": "fail", "why": "cuBLAS-XT (several GPUs from the host) is not forwarded"}),
    (r"^cublas(Init|Shutdown|GetError|Alloc|Free|SetKernelStream|Xerbla)$", {"how": "fail", "why": LEGACY[1]}),
    (r"^cublas(Set|Get)LoggerCallback$", {"how": "fail", "why": "a callback into the application"}),
    (r"^(" + "|".join(_COPIES) + r")(_64)?$", {"local": "*"}),
    (r"^(" + "|".join(_COPIES) + r")Async(_64)?$", {"local": "*"}),
]

FUNCTIONS = {
    "cublasGetStream_v2": {"local": "nvpl_get_stream(handle, streamId)"},
    "cublasSetStream_v2": {"after": "nvpl_note_stream(handle, streamId)"},
    "cublasSetPointerMode_v2": {"after": "nvpl_note_mode(handle, mode)"},
}
