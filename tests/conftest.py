import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
