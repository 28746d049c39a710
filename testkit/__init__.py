"""What the tests and the benches share without the local host: the scene generator, the strict
storage and its fault proxy, the activity-slot metrics, and the conditional write on other
providers (``providers``, which only the tests use).

Nothing here imports :mod:`devhost`, :mod:`bench` or :mod:`tests`, so a test or a bench can use
it without starting or importing the local host; the app never imports it.
"""
