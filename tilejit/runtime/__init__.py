"""Runtime: ``@tilejit.kernel`` and its launches (``jit.py``), argument packing and per-device launchers
(``launch.py``, the compiled launcher of ``native.py``), tensor-list tables (``tensor_lists.py``), TMA tensor maps
(``tma.py``), and the CUDA driver (``driver.py``, ``libcuda.py``). The kernel cache on disk is ``tilejit.cache``."""
