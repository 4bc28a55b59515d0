"""autostream: automatic multi-stream parallelism for PyTorch graph mode."""
