"""Passes over the tile IR (IR -> IR; no pass imports a backend). Each module holds one pass, or passes that decide
one thing together (``software_pipeline``: the rings, then the gemms left in flight), with the queries the backend
asks of what they decided; ``backend_cuda/stages.py`` lists them in the order they run."""
