"""dsv4spec: an executable numerical specification of DeepSeek-V4/V4.1 sparse-attention numerics."""
from pathlib import Path as _Path

__version__ = "0.1.0"

# In a source checkout the top-level folders spec/, impl/, kernels/, properties/, runner/ and golden/ are this
# package's subpackages (pyproject maps them).  When the working directory is the checkout, Python
# finds this folder before the installed mapping, so point the package at the checkout too.
_checkout = _Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "spec" / "rules.py").is_file():
    __path__.append(str(_checkout))
