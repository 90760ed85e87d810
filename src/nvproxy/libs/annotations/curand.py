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
# answers that never change in a process: the shim asks the proxy once
CONSTANT = r"^curandGet(Version|Property)$"

MODE = "nvpl_host_mode(generator)"  # (a host generator's output is host memory)

# A device generator of these types (curandRngType_t) that made all its numbers with one of these functions, and
# was configured before it began (default ordering), continues after a restore from curandSetGeneratorOffset(values
# made so far), not by making its numbers again: a fresh generator given that offset went on with the same values
# as one that had made them with that function (tests/apps/libprobe_curand.cu on the GPU: Philox with every
# function; XORWOW and MRG32k3a with these three; not normal numbers of XORWOW or MRG32k3a, nor MTGP32 or MT19937
# at all).  After runs of different functions a fresh generator at the summed offset did not always go on alike
# (a Philox generator of log-normal, Poisson and double numbers, migrated, gave other numbers), so a generator that
# used several is made again by its calls.
_XORWOW_LIKE = ("curandGenerate", "curandGenerateUniform", "curandGeneratePoisson")
SKIP_AHEAD = {161: None, 101: _XORWOW_LIKE, 121: _XORWOW_LIKE}  # (None: every generation function)
SKIP_AHEAD_BY = ("curandCreateGenerator", "curandSetGeneratorOffset", "curandSetGeneratorOrdering")

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
