"""cuRAND (libcurand.so.10) through the proxy.

A generator's random sequence continues across a restore: the generation calls are recorded (the same calls,
run again into scratch memory, leave the new generator where the old one was; state.py).  Host generators run in
the proxy too (their output comes back with the reply: the shim keeps which generators are the host's, as a
pointer mode).  The tables the device API reads on the host (direction vectors, scramble constants) and discrete
distributions (used by the application's own kernels, so their value cannot be renamed) fail loudly."""

STATUS_TYPES = ("curandStatus_t",)
# (no "not supported" status: a function that is not forwarded answers CURAND_STATUS_NOT_INITIALIZED)
STATUS = {"success": 0, "invalid_handle": 101, "invalid_value": 104, "internal": 999, "not_supported": 101}
MAIN_HANDLES = ("curandGenerator_t",)
CONFIG = r"^curandSet|^curandGenerateSeeds$"
UNORDERED = r"^curand(Set|Get|Create|Destroy)"

MODE = "nvpl_host_mode(generator)"  # (a host generator's output is host memory)

PARAMS = [
    (r"^curandGet(Version|Property)$", r"", r"\*$", "out"),
    (r"^curandGenerate(Uniform|UniformDouble|LongLong)?$", r"^outputPtr$", r"\*$", "result:elem*num"),
    (r"^curandGenerate(Normal|LogNormal|Poisson)", r"^outputPtr$", r"\*$", "result:elem*n"),
]

FUNCTION_RULES = [
    (r"^curandGenerate(?!Seeds)", {"state": "generate"}),
    (r"Distribution$", {"how": "fail", "why": "discrete distributions are read by the application's kernels"}),
    (r"^curandGet(DirectionVectors|ScrambleConstants)",
     {"how": "fail", "why": "the library's host tables are not forwarded"}),
]

FUNCTIONS = {
    "curandSetStream": {"after": "nvpl_note_stream(generator, stream)"},
    "curandCreateGenerator": {"after": "nvpl_note_mode(NEW, 1)"},
}
