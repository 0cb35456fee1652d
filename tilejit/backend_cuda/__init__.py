"""The CUDA backend: the pass list and the backend's compile stages (``stages.py``), CUDA C++ emission
(``emitter.py`` with one ``lower_*.py`` module per op family; the warp-specialized, persistent and stream-K loops in
``lower_specialized.py``), the device helpers the generated source includes (``headers.py`` over
``tilejit/include/tilejit/*.cuh``), NVRTC compilation to cubin (``nvrtc.py``) and disassembly (``sass.py``). Loading
and launching cubins is the runtime's (``tilejit/runtime``)."""
