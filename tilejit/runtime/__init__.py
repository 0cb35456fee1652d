"""Runtime: the on-disk kernel cache, specialization keys and kernel launch."""
