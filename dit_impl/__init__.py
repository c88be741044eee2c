"""DiT inference workloads gated by pytest-ditgate: the frozen ``baseline`` and the shared corpus loader.

``dit_impl.baseline`` is a fixed path (hashed by the fixed-paths lock): it is the reference every
candidate implementation is judged against. Importing this package imports neither torch nor diffusers.
"""
