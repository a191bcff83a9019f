"""inferloom: an autonomous, vendor-neutral inference optimizer."""

__version__ = "0.1.0"
__all__ = ["__version__"]
