"""Activity functions: thin, plain wrappers over ``tilecommit`` taking and returning small JSON.

They carry blob names and window ids, never pixel data. One contract (``tiling.run_activity``):
an error that is not retryable (``tilecommit.errors.is_retryable``) comes back as a value,
``{"error": {"kind", "type", "message", "window"}}``, so the orchestrator fails the job once with it;
retryable faults raise and are retried by the orchestrator's ``RetryOptions``
(``orchestrators/retries.py``). ``function_app.py`` registers them with their bindings.
"""
