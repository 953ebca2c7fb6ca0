"""dsv4spec: an executable numerical specification of DeepSeek-V4/V4.1 sparse-attention numerics."""
__version__ = "0.1.0"
