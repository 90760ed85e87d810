"""cuSOLVER (libcusolver.so.12): the dense API (cusolverDn), the sparse (cusolverSp) and refactorisation
(cusolverRf) APIs through the proxy.

Matrices, pivots and devInfo are device memory; workspace sizes (lwork, *InBytes*) and a few results (iter,
residuals, sweeps, h_* outputs) are host outputs; a host workspace (bufferOnHost) travels both ways and the
proxy waits for the device before it answers.  cusolverSp's computations on host matrices travel with the call
(reorderings, permutations, the linear solvers); its *Host functions that keep host buffers between calls
(low-level factorisations), cusolverRf's host set-up and cusolverMg (several GPUs; not described) fail loudly."""

STATUS_TYPES = ("cusolverStatus_t",)
STATUS = {"success": 0, "invalid_handle": 1, "invalid_value": 3, "internal": 7, "not_supported": 9}
MAIN_HANDLES = ("cusolverDnHandle_t", "cusolverSpHandle_t", "cusolverRfHandle_t")
CONFIG = (r"^cusolver(Dn|Sp|Rf)Set|SetAdvOptions$|^cusolverDnX(syevj|gesvdj)Set"
          r"|^cusolverDnIRSParams(Set|Enable|Disable)|^cusolverDnIRSInfosRequestResidual$")
CONFIG_KEYS = r"function"
UNORDERED = r"^cusolver(Dn|Sp|Rf)?(Set|Get|Create|Destroy|Logger)|_bufferSize\w*$|bufferInfo|GetResidual|GetSweeps"
# answers that never change in a process: the shim asks the proxy once
CONSTANT = r"^cusolverGet(Version|Property)$"

# cusolverSp's computations on host matrices that are forwarded (the matrices travel with the call; the rest of
# its *Host functions keep state in host buffers between calls, and fail)
_SP_HOST = (r"^cusolverSp(Xcsr(issym|symrcm|symamd|symmdq|perm_bufferSize|perm)|[SDCZ]csrlsv(lu|qr|chol))Host$")
# (the words sizes use for what functions name apart)
ALIASES = {"ROWS": ("m", "n"), "NNZ": ("nnzA", "nnz")}

PARAMS = [
    (_SP_HOST, r"^csrRowPtrA?$", r"c\*$", "in:4*(ROWS+1)"),
    (_SP_HOST, r"^csrRowPtrA?$", r"\*$", "inout:4*(ROWS+1)"),
    (_SP_HOST, r"^csrEndPtrA$", "", "in:4*ROWS"),
    (_SP_HOST, r"^csrColIndA?$", r"c\*$", "in:4*NNZ"),
    (_SP_HOST, r"^csrColIndA?$", r"\*$", "inout:4*NNZ"),
    (_SP_HOST, r"^csrValA?$", "", "in:elem*NNZ"),
    (_SP_HOST, r"^b$", "", "in:elem*ROWS"),
    (_SP_HOST, r"^x$", "", "out:elem*ROWS"),
    (_SP_HOST, r"^p$", r"c\*$", "in:4*ROWS"),
    (_SP_HOST, r"^p$", r"\*$", "out:4*ROWS"),
    (_SP_HOST, r"^q$", "", "in:4*n"),
    (_SP_HOST, r"^map$", "", "inout:4*NNZ"),
    (_SP_HOST, r"^(issym|singularity)$", "", "out"),
    (_SP_HOST, r"^pBuffer$", "", "out:nvpl_noted_size(handle)"),
    (r"", r"^bufferOnHost$", r"\*$", "inout:workspaceInBytesOnHost"),
    (r"", r"^(lwork|Lwork|lwork_bytes|lworkInBytes)$", r"\*$", "out"),
    (r"", r"(InBytes\w*|BufferSize\w*|bufferSize\w*)$", r"^(size_t|int) \*$", "out"),
    (r"", r"^(h_\w+|iter|niters|maxiters|meig|executed_sweeps|residual|singularity|rankA|rank|min_norm|"
          r"precision|solver_main_precision|solver_lowest_precision|solver|refinement_solver|maxiters_out|"
          r"retcode|outer_solver|lowest_precision)$", r"^\w+ \*$", "out"),
    (r"^cusolver\w*Get", r"", r"^\w+ \*$", "out"),
    (r"^cusolverDnLoggerOpenFile$", r"^logFile$", "", "str"),
    (r"", r"", r"\*", "dev"),
]

FUNCTION_RULES = [
    (r"^cusolverSp\w*Host$", {"how": "fail", "why": "cusolverSp's host computations keeping host buffers between "
                                                    "calls are not forwarded"}),
    (_SP_HOST, {"how": "forward", "why": ""}),
    (r"^cusolverSpXcsrperm_bufferSizeHost$", {"after": "nvpl_note_size(handle, bufferSizeInBytes)"}),
    (r"^cusolverRf(Setup|BatchSetup|ExtractBundledFactors|ExtractSplitFactors)Host$",
     {"how": "fail", "why": "cusolverRf's host matrices are not forwarded"}),
    (r"^cusolverRf(AccessBundledFactorsDevice|ExtractSplitFactorsHost|BatchResetValues|BatchSolve)$",
     {"how": "fail", "why": "host arrays of device pointers are not described"}),
    (r"^cusolverDnLoggerSet(Callback|File)$", {"how": "fail", "why": "a callback or FILE of the application"}),
    (r"^cusolverDnIRSInfosGetResidualHistory$", {"how": "fail", "why": "it returns the library's host memory"}),
    (r"^cusolverDnX\w+$", {"sync": True}),
]

FUNCTIONS = {
    "cusolverDnGetStream": {"local": "nvpl_get_stream(handle, streamId)"},
    "cusolverDnSetStream": {"after": "nvpl_note_stream(handle, streamId)"},
    "cusolverSpGetStream": {"local": "nvpl_get_stream(handle, streamId)"},
    "cusolverSpSetStream": {"after": "nvpl_note_stream(handle, streamId)"},
}
