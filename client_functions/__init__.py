"""Client functions: where work comes in and is asked after, through the Durable client.

The starter turns an upload into a job (a deterministic job id, one start however often the event
is delivered); the job API reads, lists, cancels and retries jobs; the scrub's start and the
retention sweep act on finished ones. Unlike the orchestrators beside ``function_app.py``, they
may do I/O (storage reads, the Durable client's HTTP API); like them, they know no bindings:
``function_app.py`` hands them their inputs.
"""
