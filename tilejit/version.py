"""tilejit's version: part of every cache key and of each entry's meta."""
__version__ = "0.1.0"
