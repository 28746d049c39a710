"""What the app tells its operators: counters, spans and logs (``telemetry``), the recording of
every activity and job end (``observed``), and where the records go (``monitoring``: Application
Insights, the OpenTelemetry exporters, or nowhere). It records and decides nothing a job's
outputs depend on.
"""
