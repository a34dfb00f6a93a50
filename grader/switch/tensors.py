"""A call's tensors as the switch holds them, the error a call ends in, and the names gloo gives dtypes."""
from __future__ import annotations

from dataclasses import dataclass, field

# what gloo's collectives carry (ProcessGroupGloo's GENERATE_ALL_TYPES); others: "Invalid scalar type"
GLOO_TYPES = {"torch.float64", "torch.float32", "torch.float16", "torch.bfloat16", "torch.int64", "torch.int32",
              "torch.int8", "torch.uint8", "torch.bool"}
COMPLEX = {"torch.complex64", "torch.complex128"}
INTEGRAL = {"torch.int64", "torch.int32", "torch.int16", "torch.int8", "torch.uint8", "torch.bool",
            "torch.uint16", "torch.uint32", "torch.uint64"}
REDUCES = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")
# ATen's scalar type names ("result type Float can't be cast to the desired output type Long")
ATEN_NAMES = {"torch.float64": "Double", "torch.float32": "Float", "torch.float16": "Half",
              "torch.bfloat16": "BFloat16", "torch.int64": "Long", "torch.int32": "Int", "torch.int16": "Short",
              "torch.int8": "Char", "torch.uint8": "Byte", "torch.bool": "Bool", "torch.complex64": "ComplexFloat",
              "torch.complex128": "ComplexDouble", "torch.uint16": "UInt16", "torch.uint32": "UInt32",
              "torch.uint64": "UInt64", "torch.float8_e4m3fn": "Float8_e4m3fn", "torch.float8_e5m2": "Float8_e5m2"}
# the C++ type names c10 prints for a dtype (TypeMeta::name(): "(double vs. float)", TensorOptions(dtype=float))
CPP_NAMES = {"torch.float64": "double", "torch.float32": "float", "torch.float16": "c10::Half",
             "torch.bfloat16": "c10::BFloat16", "torch.int64": "long int", "torch.int32": "int",
             "torch.int16": "short int", "torch.int8": "signed char", "torch.uint8": "unsigned char",
             "torch.bool": "bool", "torch.complex64": "c10::complex<float>", "torch.complex128": "c10::complex<double>",
             "torch.uint16": "short unsigned int", "torch.uint32": "unsigned int", "torch.uint64": "long unsigned int",
             "torch.float8_e4m3fn": "c10::Float8_e4m3fn", "torch.float8_e5m2": "c10::Float8_e5m2"}


class OpError(Exception):
    """An error of one call (raised on its rank) or of calls that do not fit (raised on every rank); `kind` is
    the Python exception the rank raises (gloo raises ValueError for some, through pybind)."""

    def __init__(self, message: str, kind: str = "RuntimeError", problem: dict | None = None):
        super().__init__(message)
        self.kind = kind
        self.problem = problem   # the facts, for the report in its own language (verify/outcomes.py)


@dataclass
class T:
    """One tensor of a call: dtype, shape, and its values when the rank sent them."""
    dtype: str
    shape: tuple
    numel: int
    index: int                   # its place among the call's inputs (or outputs), flattened in order
    data: object = None          # np.ndarray, flat, as wire.tensor gives it
    contiguous: bool = True      # the rank's word (it only decides an error of its own call, and
    strides: tuple | None = None  # the order gloo adds a view's elements in): a non-contiguous tensor's strides


@dataclass
class Args:
    """A call's tensors, nested as the method's parameters are: a T, a list of T, or a list of lists."""
    inputs: object = None
    outputs: object = None
    flat_in: list = field(default_factory=list)
    flat_out: list = field(default_factory=list)


def shape_text(shape) -> str:
    """A shape as c10 prints sizes: (3), (1, 3), ()."""
    return "(" + ", ".join(str(s) for s in shape) + ")"


def vec_text(shape) -> str:
    """A shape as c10 prints a std::vector in a failed check: 3 4 (elements, space-separated)."""
    return " ".join(str(s) for s in shape)


def options_text(dtype: str) -> str:
    """A CPU tensor's TensorOptions as c10 prints them (gloo's "invalid tensor type" errors)."""
    return (f"TensorOptions(dtype={CPP_NAMES.get(dtype, dtype)}, device=cpu, layout=Strided, requires_grad=false "
            f"(default), pinned_memory=false (default), memory_format=(nullopt))")


def is_list(value) -> bool:
    return isinstance(value, list)


def tensor_list(value, what: str) -> list:
    if not is_list(value) or not all(isinstance(t, T) for t in value):
        raise OpError(f"{what} must be a list of tensors")
    return value


def one_tensor(value, what: str) -> T:
    if not isinstance(value, T):
        raise OpError(f"{what} must be a tensor")
    return value
