"""cuSPARSE (libcusparse.so.12) through the proxy.

Data pointers are device memory; alpha/beta/results are host or device memory by the handle's pointer mode
(their type: the call's compute type, or the vector's value type, which the shim keeps per descriptor).
Descriptors are handles; their creation, the pointers and values set on them and the analyses done for them
(SpSV/SpSM/SpGEMM descriptors, csr*Info) are made again after a restore."""

STATUS_TYPES = ("cusparseStatus_t",)
STATUS = {"success": 0, "invalid_handle": 1, "invalid_value": 3, "internal": 7, "not_supported": 10}
MAIN_HANDLES = ("cusparseHandle_t",)
MODE = "nvpl_host_mode(handle)"
CONFIG = (r"^cusparseSet|SetPointers$|SetValues$|SetStridedBatch$|SetAttribute$|_analysis$|_updateMatrix$"
          r"|^cusparseSpGEMM(reuse)?_(workEstimation|compute|nnz|estimateMemory|copy)$|_preprocess$")
CONFIG_KEYS = r"attribute"
UNORDERED = (r"^cusparse(Set|Get|Create|Destroy|Logger)|_bufferSize\w*$|_createDescr$|_destroyDescr$"
             r"|_createPlan$|_destroyPlan$|_getNumProducts$")
# answers that never change in a process: the shim asks the proxy once
CONSTANT = r"^cusparseGet(Property|ErrorName|ErrorString)$"  # (not GetVersion: a handle)

_TYPED = r"^cusparse(SpMV|SpMM|SpSV|SpSM|SDDMM|SpGEMM|SpGEMMreuse|SpMMOp)"

PARAMS = [
    (_TYPED, r"^(alpha|beta)$", r"^void c\*$", "scalar:nvpl_dtype_size(computeType)"),
    (r"^cusparseAxpby$", r"^(alpha|beta)$", "", "scalar:nvpl_dtype_size(nvpl_handle_dtype(vecY))"),
    (r"^cusparseRot$", r"^(c_coeff|s_coeff)$", "", "scalar:nvpl_dtype_size(nvpl_handle_dtype(vecY))"),
    (r"^cusparseSpVV$", r"^result$", "", "result:nvpl_dtype_size(computeType)"),
    (r"", r"^(alpha|beta)$", r"c\*$", "scalar"),
    (r"", r"^(nnzTotalDevHostPtr|position|nnzC)$", r"^int \*$", "result"),
    (r"^cusparseSpGEMM", r"^bufferSize\d$", r"^size_t \*$", "inout"),
    (r"", r"(bufferSize\w*|BufferSize\w*|InBytes)$", r"^(size_t|int) \*$", "out"),
    (r"^cusparseSpMatGetAttribute$", r"^data$", "", "out:dataSize"),
    (r"^cusparseSpMatSetAttribute$", r"^data$", "", "in:dataSize"),
    (r"Get\w*$|_getNumProducts$", r"", r"^\w+ \*+$", "out"),
    (r"^cusparseLoggerOpenFile$", r"^logFile$", "", "str"),
    (r"", r"", r"\*", "dev"),
]

FUNCTION_RULES = [  # (in order: a later match overrides an earlier one)
    (r"^cusparse\w+_analysis$", {"owner": "info"}),
    (r"^cusparseLoggerSet(Callback|File)$", {"how": "fail", "why": "a callback or FILE of the application"}),
    (r"^cusparseSpSV_(analysis|updateMatrix)$", {"owner": "spsvDescr"}),
    (r"^cusparseSpSM_(analysis|updateMatrix)$", {"owner": "spsmDescr"}),
    (r"^cusparseSpGEMM(reuse)?_", {"owner": "spgemmDescr"}),
    (r"^cusparseSp(MV|MM)_preprocess$", {"owner": "matA"}),
    (r"^cusparseSDDMM_preprocess$", {"owner": "matC"}),
    (r"^cusparseDenseToSparse_analysis$", {"owner": "matB"}),
    (r"^cusparseCreate(Const)?DnVec$", {"after": "nvpl_note_dtype(NEW, valueType)"}),
    (r"^cusparseCreate(Const)?SpVec$", {"after": "nvpl_note_dtype(NEW, valueType)"}),
]

FUNCTIONS = {
    "cusparseGetStream": {"local": "nvpl_get_stream(handle, streamId)"},
    "cusparseSetStream": {"after": "nvpl_note_stream(handle, streamId)"},
    "cusparseSetPointerMode": {"after": "nvpl_note_mode(handle, mode)"},
}
