"""The deterministic event loop, log folding and divergence detection.

Never imports a World implementation or a driver (import-linter contract).
"""
