"""Interpreter or GPU, chosen once before the first kernel is decorated: without a GPU (and without
an explicit setting) the kernels run in the interpreter (dsv4spec/triton_mode.py).  Every kernel
module reads INTERPRET from here."""
from ..triton_mode import choose, require_triton_in_mode

INTERPRET = choose()
require_triton_in_mode(INTERPRET)
