"""The benchmark suite: treadle against DBOS and the Vercel Workflow Python SDK.

``python -m benchmarks`` (or ``treadle bench``) starts PostgreSQL and
nats-server from their wheels, runs every scenario of every system in a fresh
child process (``benchmarks.child``), and writes a comparison table, a JSON
result file and a chart under ``benchmarks/results/``. See README.md.
"""
