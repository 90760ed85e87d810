"""cuBLASLt (libcublasLt.so.13) through the proxy.

Descriptors (matmul, matrix layout, preference, transform, emulation) are handles made by their Create
functions; those the application initialises in its own memory (*Init_internal) fail loudly.  alpha and beta
are host or device memory by the operation descriptor's pointer mode, of its scale type: the shim keeps both
per descriptor.  A cuBLAS handle holds a cuBLASLt handle, and cuBLAS's documentation lets any cublasHandle_t be
cast to a cublasLtHandle_t (PyTorch does): the proxy gives the function the real cuBLAS handle, as the cast
does natively."""

STATUS_TYPES = ("cublasStatus_t",)
STATUS = {"success": 0, "invalid_handle": 1, "invalid_value": 7, "internal": 14, "not_supported": 15}
MAIN_HANDLES = ("cublasLtHandle_t",)
HANDLE_TYPES = {t: t for t in ("cublasLtMatmulDesc_t", "cublasLtMatrixLayout_t", "cublasLtMatmulPreference_t",
                               "cublasLtMatrixTransformDesc_t", "cublasLtEmulationDesc_t")}
# a type: the handle types also taken where it is used (not where it is created or destroyed)
ACCEPTED_HANDLES = {"cublasLtHandle_t": ("cublasHandle_t",)}
CONFIG = r"SetAttribute$"
CONFIG_KEYS = r"attr"
UNORDERED = r"^cublasLtMatmulAlgo"
# answers that never change in a process: the shim asks the proxy once
CONSTANT = r"^cublasLtGet(Version|Property|StatusName|StatusString|CudartVersion)$"

_ATTR_GET = r"GetAttribute$"

PARAMS = [
    (r"^cublasLtMatmul$", r"^(alpha)$", "", "scalar:nvpl_scale_size(computeDesc)@nvpl_lt_host(computeDesc, 0)"),
    (r"^cublasLtMatmul$", r"^(beta)$", "", "scalar:nvpl_scale_size(computeDesc)@nvpl_lt_host(computeDesc, 1)"),
    (r"^cublasLtMatrixTransform$", r"^alpha$", "",
     "scalar:nvpl_scale_size(transformDesc)@nvpl_lt_host(transformDesc, 0)"),
    (r"^cublasLtMatrixTransform$", r"^beta$", "",
     "scalar:nvpl_scale_size(transformDesc)@nvpl_lt_host(transformDesc, 1)"),
    (r"", r"^algo$", r"^cublasLtMatmulAlgo_t c\*$", "in"),
    (r"^cublasLtMatmulAlgo(Init|ConfigSetAttribute)$", r"^algo$", "", "inout"),
    (r"", r"^buf$", r"^void c\*$", "in:sizeInBytes"),
    (_ATTR_GET, r"^buf$", r"^void \*$", "out:sizeInBytes"),
    (r"", r"^sizeWritten$", "", "out"),
    (r"^cublasLtMatmulAlgoGetHeuristic$", r"^heuristicResultsArray$", "", "out:elem*requestedAlgoCount"),
    (r"^cublasLtMatmulAlgoGetIds$", r"^algoIdsArray$", "", "out:elem*requestedAlgoCount"),
    (r"", r"^(returnAlgoCount|result|value|capacity)$", r"\*$", "out"),
    (r"^cublasLtLoggerOpenFile$", r"^logFile$", "", "str"),
    (r"", r"", r"^void c?\*$", "dev"),
]

FUNCTION_RULES = [
    (r"Init_internal$", {"how": "fail", "why": "descriptors in the application's memory are not forwarded"}),
    (r"^cublasLtLoggerSet(Callback|File)$", {"how": "fail", "why": "a callback or FILE of the application"}),
    (r"^cublasLtMatmulAlgoInit$", {"params": {"algo": "out"}}),
]

FUNCTIONS = {
    "cublasLtMatmulDescCreate": {"after": "nvpl_note_dtype(NEW, scaleType)"},
    "cublasLtMatrixTransformDescCreate": {"after": "nvpl_note_dtype(NEW, scaleType)"},
    "cublasLtMatmulDescSetAttribute": {"after": "nvpl_note_lt_attr(matmulDesc, attr, buf, sizeInBytes, 1, 2)"},
    "cublasLtMatrixTransformDescSetAttribute":
        {"after": "nvpl_note_lt_attr(transformDesc, attr, buf, sizeInBytes, 0, 1)"},
}
