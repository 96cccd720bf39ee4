"""One module per system under test: its benchmark workflows and how each scenario drives them.

Every module exposes ``async def run(scenario, params) -> dict`` (the metrics
of one repeat, as lists of samples), called by ``benchmarks.child`` in a
fresh process; a scenario a system cannot run raises ``Unsupported``.
"""


class Unsupported(Exception):
    """This system cannot run this scenario; the message says why."""
