"""The timing mechanisms, most faithful first (``auto`` takes the first that works). Light: option parsing uses it."""

MECHANISMS = ("cupti", "graph", "events", "wall")
