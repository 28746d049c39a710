"""Activity functions: thin, plain wrappers over ``tilecommit`` taking and returning small JSON.

They carry blob names and window ids, never pixel data. Bad input comes back as a value
(``{"ok": False, "error": ...}`` or ``{"error": ...}``) so the orchestrator fails the job at
once instead of retrying; genuine faults raise and are retried by the orchestrator's
``RetryOptions``. ``function_app.py`` registers them with their bindings.
"""
