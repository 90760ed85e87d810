"""cuFFT (libcufft.so.12): single-GPU plans through the proxy.

Plans are ints (cufftHandle); nvproxy hands out its own.  A plan is made again after a restore from its
recorded creation and configuration (cufftCreate, cufftSetAutoAllocation, cufftMakePlan*, cufftSetWorkArea,
cufftSetStream, plan properties).  Multi-GPU plans (cufftXtSetGPUs, descriptors, cufftXtMalloc/Memcpy) and
callbacks fail loudly."""

STATUS_TYPES = ("cufftResult",)
STATUS = {"success": 0, "invalid_handle": 1, "invalid_value": 4, "internal": 5, "not_supported": 16}
MAIN_HANDLES = ("cufftHandle",)
INT_HANDLES = ("cufftHandle",)
HANDLE_TYPES = {"cufftHandle": "cufftHandle"}
CONFIG = r"^cufft(Set|MakePlan|ResetPlanProperty|XtMakePlanMany)"
CONFIG_KEYS = r"property"
UNORDERED = r"^cufft(Set|Get|Create|Destroy|MakePlan|Estimate|Plan|ResetPlan|XtMakePlan|XtGetSize)"
# answers that never change in a process: the shim asks the proxy once
CONSTANT = r"^cufftGet(Version|Property)$"

_RANK_ARRAYS = r"^(n|inembed|onembed)$"

PARAMS = [
    (r"", _RANK_ARRAYS, r"^int \*$", "in:4*rank"),
    (r"", _RANK_ARRAYS, r"^long_long_int \*$", "in:8*rank"),
    (r"", r"^(workSize|workArea)$", r"^size_t \*$", "out"),
    (r"^cufftGet", r"", r"\*$", "out"),
    (r"", r"", r"^(cufftComplex|cufftDoubleComplex|cufftReal|cufftDoubleReal|void) \*$", "dev"),
]

FUNCTION_RULES = [
    (r"^cufftXt(SetGPUs|Malloc|Free|Memcpy|ExecDescriptor|SetWorkArea$|SetWorkAreaPolicy)",
     {"how": "fail", "why": "multi-GPU cuFFT is not forwarded"}),
    (r"^cufftXt(SetCallback|SetJITCallback|ClearCallback|SetCallbackSharedSize)",
     {"how": "fail", "why": "cuFFT callbacks are not forwarded"}),
    (r"^cufftXtQueryPlan$", {"how": "fail", "why": "its query structure is not described"}),
    (r"^cufftMakePlan|^cufftXtMakePlan", {"key": []}),
]

FUNCTIONS = {
    "cufftSetStream": {"after": "nvpl_note_stream(plan, stream)"},
}
