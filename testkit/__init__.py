"""What the tests and the benches share without the local host: the scene generator, fault
injection and the activity-slot metrics.

Nothing here imports :mod:`devhost`, :mod:`bench` or :mod:`tests`, so a test or a bench can use
it without starting or importing the local host; the app never imports it.
"""
