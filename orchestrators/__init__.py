"""Orchestrator functions: small, deterministic generators (no clock, random or I/O).

They are plain functions; ``function_app.py`` registers them with their bindings.
"""
