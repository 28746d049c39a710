"""The next release of the app, as tests/test_versions.py deploys it over this one: the same code
with version 5.0 of the job orchestration, which leaves out the collection step, and host.json's
``defaultVersion`` raised to 5.0 (as the app setting that overrides host.json, which the local
host reads as the Functions host does). Importing this module is the deploy: the host process
that imports it before it loads ``function_app`` runs the next release.
"""

from __future__ import annotations

import dataclasses
import os

from devhost.durable.host import JOB_HOST_OVERRIDE
from orchestrators import versions

NEXT = "5.0"

versions.VERSIONS[NEXT] = dataclasses.replace(versions.VERSIONS[versions.CURRENT], collection=False)
os.environ[f"{JOB_HOST_OVERRIDE}extensions__durableTask__defaultVersion"] = NEXT
