"""Passes over the tile IR; each module is one pass, composed per arch in ``pipeline.py``."""
