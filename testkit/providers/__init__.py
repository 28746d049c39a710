"""The conditional write (:mod:`tilecommit.conditional`) on the other stores the idea applies to:
Amazon S3 (``If-None-Match: *``, ``If-Match`` repairs), Google Cloud Storage
(``ifGenerationMatch=0``, ``ifGenerationMatch=<generation>`` repairs) and DynamoDB
(``attribute_not_exists`` on both key parts).

Demonstrations the tests run (tests/test_providers.py), kept in the test kit because the
Functions app is Azure and never imports them; their clients (boto3, google-cloud-storage) are
installed with the test tools only (requirements-dev.txt). Each module
is a :class:`~tilecommit.conditional.Backend` and the two calls a user makes; the rules, the
counters and the logs are the protocol's, the same as the Azure gates'.
"""
