"""CUDA backend: the prelude, NVRTC compilation to cubin, and loading/launching with the CUDA driver."""
