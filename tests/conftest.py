"""The suite runs strict: a planning or rewrite failure is a bug, raised, never a silent fallback."""

import os

os.environ["AUTOSTREAM_STRICT"] = "1"
