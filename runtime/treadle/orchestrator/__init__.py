"""Deliveries: the orchestrator (spec 9), background steps, timers, the worker."""
