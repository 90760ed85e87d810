"""cuRAND (libcurand.so.10): device generators through the proxy.

A generator's random sequence continues across a restore: the generation calls are recorded (the same calls,
run again into scratch memory, leave the new generator where the old one was; state.py).  Host generators, the
tables the device API reads on the host (direction vectors, scramble constants) and discrete distributions
(used by the application's own kernels, so their value cannot be renamed) fail loudly."""

STATUS_TYPES = ("curandStatus_t",)
# (no "not supported" status: a function that is not forwarded answers CURAND_STATUS_NOT_INITIALIZED)
STATUS = {"success": 0, "invalid_handle": 101, "invalid_value": 104, "internal": 999, "not_supported": 101}
MAIN_HANDLES = ("curandGenerator_t",)
CONFIG = r"^curandSet|^curandGenerateSeeds$"
UNORDERED = r"^curand(Set|Get|Create|Destroy)"

PARAMS = [
    (r"^curandGet(Version|Property)$", r"", r"\*$", "out"),
    (r"^curandGenerate", r"^outputPtr$", r"\*$", "dev"),
]

FUNCTION_RULES = [
    (r"^curandGenerate(?!Seeds)", {"state": "generate"}),
    (r"^curandCreateGeneratorHost$", {"how": "fail", "why": "host generators are not forwarded"}),
    (r"Distribution$", {"how": "fail", "why": "discrete distributions are read by the application's kernels"}),
    (r"^curandGet(DirectionVectors|ScrambleConstants)",
     {"how": "fail", "why": "the library's host tables are not forwarded"}),
]

FUNCTIONS = {
    "curandSetStream": {"after": "nvpl_note_stream(generator, stream)"},
}
