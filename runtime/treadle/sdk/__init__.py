"""What workflow and step code imports (decorators, sleep, hooks, metadata).

Runs inside the deterministic replay loop, so it never imports a World
implementation or a database or queue driver (an import-linter contract in
pyproject.toml enforces it).
"""
