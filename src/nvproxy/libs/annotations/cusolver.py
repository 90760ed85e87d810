"""cuSOLVER (libcusolver.so.12): the dense API (cusolverDn), the sparse (cusolverSp) and refactorisation
(cusolverRf) APIs through the proxy.

Matrices, pivots and devInfo are device memory; workspace sizes (lwork, *InBytes*) and a few results (iter,
residuals, sweeps, h_* outputs) are host outputs; a host workspace (bufferOnHost) travels both ways and the
proxy waits for the device before it answers.  cusolverSp's *Host functions (whole computations on host
matrices) and cusolverMg (several GPUs; not described) fail loudly."""

STATUS_TYPES = ("cusolverStatus_t",)
STATUS = {"success": 0, "invalid_handle": 1, "invalid_value": 3, "internal": 7, "not_supported": 9}
MAIN_HANDLES = ("cusolverDnHandle_t", "cusolverSpHandle_t", "cusolverRfHandle_t")
CONFIG = (r"^cusolver(Dn|Sp|Rf)Set|SetAdvOptions$|^cusolverDnX(syevj|gesvdj)Set"
          r"|^cusolverDnIRSParams(Set|Enable|Disable)|^cusolverDnIRSInfosRequestResidual$")
CONFIG_KEYS = r"function"
UNORDERED = r"^cusolver(Dn|Sp|Rf)?(Set|Get|Create|Destroy|Logger)|_bufferSize\w*$|bufferInfo|GetResidual|GetSweeps"

PARAMS = [
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
    (r"^cusolverSp\w*Host$", {"how": "fail", "why": "cusolverSp's host computations are not forwarded"}),
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
