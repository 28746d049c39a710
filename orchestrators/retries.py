"""The orchestrator's retry policy for activities, from :mod:`tilecommit.retries`.

azure-functions-durable 1.7.0's ``RetryOptions`` carries only the first interval and the number
of attempts; the extension's out-of-process shim also reads ``backoffCoefficient``,
``maxRetryIntervalInMilliseconds`` and ``retryTimeoutInMilliseconds`` from the same JSON (the
JavaScript SDK sends them: Azure/azure-functions-durable-extension, ``RetryOptionsConverter``),
so :class:`BackoffRetryOptions` adds the first two to what the SDK sends.
"""

from __future__ import annotations

import azure.durable_functions as df

from tilecommit.retries import ACTIVITY_RETRY, ActivityRetry


class BackoffRetryOptions(df.RetryOptions):
    """RetryOptions with a backoff coefficient and a maximum interval."""

    def __init__(self, policy: ActivityRetry):
        super().__init__(
            first_retry_interval_in_milliseconds=int(policy.first_interval_s * 1000),
            max_number_of_attempts=policy.max_attempts,
        )
        self.policy = policy

    def to_json(self) -> dict:
        return {
            **super().to_json(),
            "backoffCoefficient": self.policy.backoff_coefficient,
            "maxRetryIntervalInMilliseconds": int(self.policy.max_interval_s * 1000),
        }


#: Every activity of the job: a genuine fault (throttling, an outage, a worker that died) gets
#: ``max_attempts`` attempts, 6: the first and 5 retries, after 5, 10, 20, 40 and 60 s; an outage
#: of a minute costs time, not the job.
ACTIVITY_RETRY_OPTIONS = BackoffRetryOptions(ACTIVITY_RETRY)
