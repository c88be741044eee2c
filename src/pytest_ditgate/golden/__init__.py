"""Golden store: frozen baseline tensors in safetensors files, checked against a sha256 manifest.

Built from small pieces in the syrupy mould: a Serializer (tensors <-> bytes), a Store (location,
integrity-checked reads, atomic writes), the Manifest, a Comparator (does a candidate match?), the
Session (queued writes flushed once at the end, usage for orphan detection) and the Report (summary
lines). ``golden.golden_plugin`` wires them into pytest and provides the ``golden`` fixture. Generic: nothing
here knows about DiT. Importing this package imports no torch.
"""
